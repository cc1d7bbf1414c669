"""The cost on the pages: the job page's cost block (cost, billable and training time,
warm apart, per attempt, the projection while running), the tuning job page's sum, a
project's spend page (month picker, by type and by user, user text escaped) and the prices
page where admins set prices (form errors for bad input)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from jobs import cost
from jobs.metrics.store import MetricEntry, write_points
from jobs.models import InstancePrice, JobAttempt, JobStatus, TrainingJob
from studio.models import Role
from tests.factories import make_member, password_of

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password=password_of(user.username))
    return client


def _job(project, user=None, **fields) -> TrainingJob:
    return TrainingJob.objects.create(project=project, name=f"j-{uuid.uuid4().hex[:6]}", script_uri="file:///x.py",
                                      entry_point="x.py", created_by=user,
                                      resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1},
                                      **fields)


def _ran(job: TrainingJob, *, attempt: int, seconds: int, price: str, warm: float = 0, ended_ago: int = 0) -> None:
    end = timezone.now() - timedelta(seconds=ended_ago)
    JobAttempt.objects.create(job=job, attempt=attempt, started_at=end - timedelta(seconds=seconds), finished_at=end,
                              training_started_at=end - timedelta(seconds=seconds / 2), price_per_hour=Decimal(price),
                              currency="USD", outcome="completed", warm_seconds=warm)
    cost.settle_launches(job.pk)


def test_the_job_page_shows_cost_billable_training_warm_and_each_attempt(project, owner):
    job = _job(project, owner, status=JobStatus.COMPLETED, attempt=2, finished_at=timezone.now(), keep_alive_seconds=60)
    _ran(job, attempt=1, seconds=3600, price="1.5", ended_ago=4000)
    _ran(job, attempt=2, seconds=1800, price="2", warm=1800)

    page = _signed_in(owner).get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="cost-panel"' in html
    # 1 h × 1.5 + (0.5 h + 0.5 h warm) × 2 = 3.50
    assert "3.50 USD" in html
    assert "1 h 30 min" in html, "billable, both attempts"
    assert 'id="job-warm-time"' in html and "30 min 00 s" in html
    assert 'data-attempt="1" data-cost="1.500000"' in html and 'data-attempt="2" data-cost="2.000000"' in html
    assert '">1.50</td>' in html and '">2.00</td>' in html, "prices to the cent like the costs beside them"
    assert 'id="job-projected-cost"' not in html, "finished: no projection"
    assert f'href="/projects/{project.slug}/spend/"' in html


def test_a_running_job_page_shows_its_projected_cost(project, owner):
    started = timezone.now() - timedelta(seconds=100)
    job = _job(project, owner, status=JobStatus.TRAINING, attempt=1, hyperparameters={"max_steps": 40},
               started_at=started, training_started_at=started)
    JobAttempt.objects.create(job=job, attempt=1, started_at=job.started_at, training_started_at=job.training_started_at,
                              price_per_hour=Decimal("36"), currency="USD", outcome="running")
    # Steps 1-10 logged over the 100 s so far, the newest now: 10 s a step.
    payload = [["loss", step, 1.0, (started + timedelta(seconds=10 * step)).timestamp()] for step in range(1, 11)]
    write_points([MetricEntry(job_id=job.pk, rank=0, payload=json.dumps(payload).encode())])

    client = _signed_in(owner)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    shown = re.search(r'id="job-projected-cost"[^>]*>([0-9.]+) USD<', html)
    assert shown, "the projection, in USD"
    # ~100 s so far (1.00 at 36/h) and 30 steps to go at 10 s each (3.00) → 4.00: the time
    # since the newest point is in the cost so far and out of the time to go.
    assert abs(float(shown.group(1)) - 4.00) <= 0.011, shown[1]
    assert "so far" in html


def test_the_tuning_job_page_shows_the_sum_of_its_trials(project, owner):
    from tuning.models import TuningJob

    tuning = TuningJob.objects.create(project=project, name="search", objective={"metric": "loss", "type": "Minimize"},
                                      max_trials=2, max_parallel=1, parameter_ranges={}, base_job={}, strategy="random",
                                      created_by=owner)
    for number in (1, 2):
        trial = _job(project, owner, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now(), tuning_job=tuning,
                     trial_number=number)
        _ran(trial, attempt=1, seconds=3600, price="1.25")

    page = _signed_in(owner).get(f"/tuning/{tuning.pk}/")
    assert page.status_code == 200, page.content[:2000]
    html = page.content.decode()
    assert 'id="tuning-cost-panel"' in html and "2.50 USD" in html


def test_the_spend_page_has_a_month_picker_and_tables_by_type_and_user_with_names_escaped(project, owner):
    sneaky = make_member(project, "<b>mallory</b>", Role.SCIENTIST)
    _ran(_job(project, owner, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now()), attempt=1, seconds=3600,
         price="2")
    _ran(_job(project, sneaky, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now()), attempt=1,
         seconds=1800, price="2")
    client = _signed_in(owner)

    page = client.get(f"/projects/{project.slug}/spend/")
    assert page.status_code == 200
    html = page.content.decode()
    month = cost.current_month()
    assert f'<option value="{month}" selected>' in html
    assert 'id="spend-by-type"' in html and 'data-instance-type="cpu"' in html
    assert 'data-user="owner"' in html and "&lt;b&gt;mallory&lt;/b&gt;" in html and "<b>mallory</b>" not in html
    assert "3.00" in html, "the month's total"

    empty = client.get(f"/projects/{project.slug}/spend/?month=2020-01").content.decode()
    assert "No launches started in 2020-01" in empty

    bad = client.get(f"/projects/{project.slug}/spend/?month=2026-13")
    assert bad.status_code == 400 and 'id="month-error"' in bad.content.decode()
    far = client.get(f"/projects/{project.slug}/spend/?month=9999-01").content.decode()
    assert "a year from 1970 to 9998" in far, "the message states both bounds"


def test_the_month_picker_reaches_back_to_the_projects_first_launch(project, owner):
    # It offered the last 12 months only: a launch of 20 months ago had no choice in the menu.
    _ran(_job(project, owner, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now()), attempt=1,
         seconds=600, price="1", ended_ago=20 * 31 * 86400)
    html = _signed_in(owner).get(f"/projects/{project.slug}/spend/").content.decode()
    picker = html[html.index('id="month-picker"'):html.index("</select>", html.index('id="month-picker"'))]
    first = JobAttempt.objects.get().started_at
    assert f'<option value="{first:%Y-%m}">' in picker
    assert 20 <= picker.count("<option") <= 22


def test_the_spend_page_is_hidden_from_outsiders(project, outsider):
    assert _signed_in(outsider).get(f"/projects/{project.slug}/spend/").status_code == 404


def test_an_admin_sets_and_removes_a_price_on_the_prices_page(project, owner):
    client = _signed_in(owner)
    assert 'id="price-form"' in client.get(f"/projects/{project.slug}/prices/").content.decode()

    done = client.post(f"/projects/{project.slug}/prices/", {"instance_type": "gpu", "price_per_node_hour": "1.5",
                                                             "price_per_gpu_hour": "2.5", "currency": "eur"})
    assert done.status_code == 302
    row = InstancePrice.objects.get(project=project, instance_type="gpu")
    assert (row.price_per_node_hour, row.price_per_gpu_hour, row.currency, row.updated_by) == (
        Decimal("1.5"), Decimal("2.5"), "EUR", owner)
    html = client.get(f"/projects/{project.slug}/prices/").content.decode()
    assert 'data-instance-type="gpu" data-source="project"' in html

    client.post(f"/projects/{project.slug}/prices/", {"action": "remove", "instance_type": "gpu"})
    assert not InstancePrice.objects.filter(project=project).exists()


@pytest.mark.parametrize(("field", "value"), [("price_per_node_hour", "-1"), ("price_per_node_hour", "NaN"),
                                              ("price_per_node_hour", "1e12"), ("price_per_node_hour", "cheap"),
                                              ("price_per_gpu_hour", "-0.5"), ("currency", "dollars"),
                                              ("currency", "ZZZ"), ("currency", "XXX"),
                                              ("instance_type", "<script>")])
def test_bad_input_on_the_prices_page_is_a_form_error_on_its_field(project, owner, field, value):
    data = {"instance_type": "cpu", "price_per_node_hour": "1", "price_per_gpu_hour": "0", "currency": "USD", field: value}
    page = _signed_in(owner).post(f"/projects/{project.slug}/prices/", data)
    assert page.status_code == 400
    html = page.content.decode()
    start = html.index(f'data-field="{field}"')
    assert 'class="field-error"' in html[start:start + 1500]
    assert html[start:start + 1500].count('class="field-error"') == 1, "one message per field"
    assert "<script>" not in html.split('id="price-form"')[1].split("</form>")[0], "escaped"
    assert not InstancePrice.objects.exists()


def test_a_viewer_sees_the_prices_but_cannot_set_them(project, viewer):
    client = _signed_in(viewer)
    html = client.get(f"/projects/{project.slug}/prices/").content.decode()
    assert 'id="price-form"' not in html
    refused = client.post(f"/projects/{project.slug}/prices/", {"instance_type": "cpu", "price_per_node_hour": "1"})
    assert refused.status_code == 403
    assert not InstancePrice.objects.exists()


@pytest.mark.parametrize(("value", "shown"), [(Decimal("0"), "0.00"), (Decimal("1.5"), "1.50"), ("2", "2.00"),
                                              (Decimal("0.125"), "0.125"), (Decimal("0.000417"), "0.000417"),
                                              (Decimal("36.000000"), "36.00"), (None, "—"), ("n/a", "n/a")])
def test_a_price_shows_to_the_cent_with_its_further_decimals(value, shown):
    # The cost table printed a price of 0 as "0" beside a cost of "0.00".
    from jobs.templatetags.job_cost import price

    assert price(value) == shown


def test_the_months_launches_download_as_csv_and_add_up_to_the_spend(project, owner, teammate, outsider, client_for):
    """One line per launch (a node's part of an attempt), at its snapshotted price: the CSV
    finance reconciles, and the API's list of the same; their costs add up to the total, to
    the cent. A job name a spreadsheet would run as a formula is written as text."""
    import csv
    import io

    retried = _job(project, owner, status=JobStatus.COMPLETED, attempt=2, finished_at=timezone.now())
    _ran(retried, attempt=1, seconds=1200, price="3.5", ended_ago=4000)
    _ran(retried, attempt=2, seconds=3600, price="3.5", warm=600)
    formula = _job(project, teammate, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now())
    TrainingJob.objects.filter(pk=formula.pk).update(name='=HYPERLINK("http://evil.example","x")')
    formula.refresh_from_db()
    _ran(formula, attempt=1, seconds=900, price="1.25")
    running = _job(project, owner, status=JobStatus.TRAINING, attempt=1)
    JobAttempt.objects.create(job=running, attempt=1, started_at=timezone.now() - timedelta(seconds=60),
                              price_per_hour=Decimal("2"), currency="USD")
    month = cost.current_month()

    response = _signed_in(owner).get(f"/projects/{project.slug}/spend/launches.csv?month={month}")
    assert response.status_code == 200 and response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="trainyard-acme-spend-{month}.csv"'
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(int(r["job_id"]), int(r["attempt"])) for r in rows] == [
        (retried.pk, 1), (retried.pk, 2), (formula.pk, 1), (running.pk, 1)]
    assert rows[2]["job_name"] == "'" + formula.name, "a formula is written as text"
    assert rows[1]["warm_seconds"] == "600.0" and rows[1]["price_per_hour"] == "3.500000"
    assert rows[3]["finished_at"] == "" and float(rows[3]["billable_seconds"]) >= 60
    spend = cost.project_spend(project, month)
    assert cost.to_cents(sum(Decimal(r["cost"]) for r in rows)) == Decimal(spend["total"]["cost_display"])
    assert Decimal(rows[1]["cost"]) == cost.quantize(Decimal("3.5") * Decimal(4200) / 3600)

    listed = client_for(owner).get(f"/api/v1/projects/{project.slug}/spend/launches/?month={month}").json()
    assert listed["count"] == 4 and [r["job_id"] for r in listed["results"]] == [int(r["job_id"]) for r in rows]
    assert listed["results"][2]["job_name"] == formula.name  # JSON carries the name as it is

    page = _signed_in(owner).get(f"/projects/{project.slug}/spend/?month={month}").content.decode()
    assert f'href="/projects/acme/spend/launches.csv?month={month}"' in page
    assert _signed_in(owner).get(f"/projects/{project.slug}/spend/launches.csv?month=2026-13").status_code == 400
    assert client_for(owner).get(f"/api/v1/projects/{project.slug}/spend/launches/?month=13").status_code == 400
    assert _signed_in(outsider).get(f"/projects/{project.slug}/spend/launches.csv").status_code == 404
    assert client_for(outsider).get(f"/api/v1/projects/{project.slug}/spend/launches/").status_code == 404
