"""Cost and billable time (jobs.cost): prices and their precedence, the snapshot at
placement, billable/training/warm seconds at each launch's end, Decimal rounding, the
projection of a running job, a project's spend by type, user and month, and the API."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs import cost
from jobs.metrics.store import MetricEntry, write_points
from jobs.models import InstancePrice, JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.nodes import MachineResources, register_node
from jobs.recovery import end_attempt
from jobs.scheduling import expire_stale_leases, expire_warm_pools, schedule_jobs
from studio.models import Role
from tests.factories import make_member

pytestmark = pytest.mark.django_db

PRICES = '{"cpu": 0.12, "gpu": {"node": 1.0, "gpu": 2.5}}'


def _node(kind: str = "cpu", gpus: int = 0) -> Node:
    return register_node(name=f"{kind}-{uuid.uuid4().hex[:6]}", instance_type=kind, pid=1,
                         resources=MachineResources(cpus=4, memory_bytes=8 * 2**30, gpus=gpus))


def _job(project, *, kind: str = "cpu", nodes: int = 1, user=None, **fields) -> TrainingJob:
    return TrainingJob.objects.create(project=project, name=f"j-{uuid.uuid4().hex[:6]}", script_uri="file:///x.py",
                                      entry_point="x.py", created_by=user,
                                      resources={"instance_type": kind, "instance_count": nodes, "processes_per_node": 1},
                                      **fields)


def _launch(job: TrainingJob, *, attempt: int = 1, rank: int = 0, start: datetime, end: datetime | None = None,
            trained: datetime | None = None, price: str = "1", node: Node | None = None, **fields) -> JobAttempt:
    return JobAttempt.objects.create(job=job, attempt=attempt, node_rank=rank, node=node, started_at=start,
                                     finished_at=end, training_started_at=trained, price_per_hour=Decimal(price),
                                     currency="USD", outcome="completed" if end else "running", **fields)


T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def _log(job: TrainingJob, name: str, steps_and_seconds: list[tuple[int, float]], *, value: float = 1.0,
         rank: int = 0) -> None:
    """Points as the SDK sends them, through the flusher's writer (points and their chunks):
    step k logged at T0 + its seconds."""
    payload = [[name, step, value, (T0 + timedelta(seconds=seconds)).timestamp()] for step, seconds in steps_and_seconds]
    write_points([MetricEntry(job_id=job.pk, rank=rank, payload=json.dumps(payload).encode())])


# --- prices --------------------------------------------------------------------------------------------
def test_a_project_price_wins_over_the_site_row_which_wins_over_the_settings(project, other_project, settings):
    settings.STUDIO_INSTANCE_PRICES = PRICES
    settings.STUDIO_CURRENCY = "EUR"
    assert cost.price_for(project.pk, "cpu", 0) == (Decimal("0.120000"), "EUR")
    assert cost.price_for(project.pk, "gpu", 2) == (Decimal("6.000000"), "EUR"), "1.0 per node + 2 × 2.5 per GPU"

    InstancePrice.objects.create(project=None, instance_type="cpu", price_per_node_hour=Decimal("0.2"), currency="USD")
    assert cost.price_for(project.pk, "cpu", 0) == (Decimal("0.200000"), "USD")

    InstancePrice.objects.create(project=project, instance_type="cpu", price_per_node_hour=Decimal("0.5"),
                                 price_per_gpu_hour=Decimal("0.25"), currency="GBP")
    assert cost.price_for(project.pk, "cpu", 2) == (Decimal("1.000000"), "GBP")
    assert cost.price_for(other_project.pk, "cpu", 0) == (Decimal("0.200000"), "USD"), "another project's price is not ours"


def test_an_unknown_type_costs_nothing_in_the_site_currency(project, settings):
    settings.STUDIO_INSTANCE_PRICES = PRICES
    settings.STUDIO_CURRENCY = "CHF"
    assert cost.price_for(project.pk, "tpu", 8) == (Decimal("0.000000"), "CHF")


def test_the_settings_are_parsed_once_per_value_and_a_bad_one_says_which_type(settings):
    settings.STUDIO_INSTANCE_PRICES = PRICES
    first = cost.settings_prices()
    assert cost.settings_prices() is first, "cached"
    settings.STUDIO_INSTANCE_PRICES = '{"cpu": 0.3}'
    assert cost.settings_prices()["cpu"].node == Decimal("0.3")
    settings.STUDIO_INSTANCE_PRICES = '{"cpu": -1}'
    with pytest.raises(ValueError, match="cpu"):
        cost.settings_prices()
    settings.STUDIO_INSTANCE_PRICES = '{"gpu": {"node": "lots"}}'
    with pytest.raises(ValueError, match="gpu"):
        cost.settings_prices()


# --- the snapshot and the end of a launch ---------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_placement_snapshots_the_price_per_node_and_a_later_change_does_not_touch_it(project, settings):
    settings.STUDIO_INSTANCE_PRICES = PRICES
    small, big = _node("gpu", gpus=1), _node("gpu", gpus=2)
    job = _job(project, kind="gpu", nodes=2)

    assert schedule_jobs() == [job.pk]
    rows = {row.node_id: row for row in JobAttempt.objects.filter(job=job)}
    assert rows[small.pk].price_per_hour == Decimal("3.5") and rows[big.pk].price_per_hour == Decimal("6")
    assert {row.currency for row in rows.values()} == {"USD"}

    InstancePrice.objects.create(project=project, instance_type="gpu", price_per_node_hour=Decimal("100"))
    assert set(JobAttempt.objects.filter(job=job).values_list("price_per_hour", flat=True)) == {Decimal("3.5"),
                                                                                               Decimal("6")}


def test_settling_fixes_billable_and_training_seconds_and_rounds_the_cost_half_up(project):
    job = _job(project, status=JobStatus.COMPLETED, finished_at=T0 + timedelta(seconds=1000), attempt=1)
    row = _launch(job, start=T0, end=T0 + timedelta(seconds=1000), trained=T0 + timedelta(seconds=100), price="0.5")

    assert cost.settle_launches(job.pk, 1) == 1
    assert cost.settle_launches(job.pk, 1) == 0, "once"
    row.refresh_from_db()
    assert (row.billable_seconds, row.training_seconds) == (1000.0, 900.0)
    assert row.cost == Decimal("0.138889"), "1000 s × 0.5 / 3600 = 0.1388…, to 6 places half-up"
    figures = cost.job_cost(job)
    assert figures["cost"] == "0.138889" and figures["cost_display"] == "0.14"


def test_a_launch_that_never_trained_has_no_training_time(project):
    job = _job(project, status=JobStatus.FAILED, finished_at=T0 + timedelta(seconds=30), attempt=1)
    _launch(job, start=T0, end=T0 + timedelta(seconds=30))
    cost.settle_launches(job.pk)
    figures = cost.job_cost(job)
    assert (figures["billable_time_seconds"], figures["training_time_seconds"]) == (30.0, 0.0)


def test_a_lost_node_ends_its_launch_with_its_billable_time(project):
    node = _node()
    job = _job(project, status=JobStatus.TRAINING, attempt=1, retries=1, started_at=T0)
    _launch(job, start=timezone.now() - timedelta(seconds=60), trained=timezone.now() - timedelta(seconds=50),
            node=node, price="3.6")

    assert end_attempt(job.pk, 1, cause="test", lost_nodes=[node.name]) == "requeued"
    row = JobAttempt.objects.get(job=job)
    assert row.outcome == "lost"
    assert row.billable_seconds == pytest.approx(60, abs=2) and row.training_seconds == pytest.approx(50, abs=2)
    assert row.cost == cost.cost_of(row.billable_seconds, Decimal("3.6"))


def test_a_silent_agent_ends_its_launch_with_its_billable_time(project):
    node = _node()
    job = _job(project, status=JobStatus.TRAINING, attempt=1, retries=0,
               lease_expires_at=timezone.now() - timedelta(seconds=1))
    _launch(job, start=timezone.now() - timedelta(seconds=20), node=node, price="1")

    assert expire_stale_leases() == [job.pk]
    row = JobAttempt.objects.get(job=job)
    assert row.billable_seconds == pytest.approx(20, abs=2)
    assert row.cost is not None and row.cost > 0


def test_warm_pool_time_is_billed_to_the_job_that_left_the_pool_until_it_expires(project):
    node = _node()
    job = _job(project, status=JobStatus.COMPLETED, attempt=1, keep_alive_seconds=300)
    finished = timezone.now() - timedelta(seconds=200)
    _launch(job, start=finished - timedelta(seconds=100), end=finished, node=node, price="36")
    cost.settle_launches(job.pk)
    Node.objects.filter(pk=node.pk).update(state=NodeState.WARM, warm_pool="p", warm_project=project,
                                           warm_instance_count=1, warm_from_job=job,
                                           warm_until=finished + timedelta(seconds=150))

    live = cost.job_cost(job)
    assert live["warm_pool_seconds"] == pytest.approx(150, abs=1), "shown while warm, up to warm_until"

    assert expire_warm_pools() == 1
    row = JobAttempt.objects.get(job=job)
    assert row.warm_seconds == pytest.approx(150, abs=0.01)
    assert row.cost == cost.cost_of(100 + row.warm_seconds, Decimal("36"))
    figures = cost.job_cost(job)
    assert figures["billable_time_seconds"] == 100 and figures["warm_pool_seconds"] == pytest.approx(150, abs=0.01)
    assert Decimal(figures["cost"]) == pytest.approx(Decimal("2.5"), abs=Decimal("0.001")), "(100 + 150) s × 36/h"


@pytest.mark.django_db(transaction=True)
def test_a_pool_taken_by_its_next_job_ends_the_previous_jobs_warm_time(project):
    node = _node()
    done = _job(project, status=JobStatus.COMPLETED, attempt=1, keep_alive_seconds=600)
    finished = timezone.now() - timedelta(seconds=40)
    _launch(done, start=finished - timedelta(seconds=10), end=finished, node=node, price="1")
    Node.objects.filter(pk=node.pk).update(state=NodeState.WARM, warm_pool="p", warm_project=project,
                                           warm_instance_count=1, warm_from_job=done,
                                           warm_until=timezone.now() + timedelta(seconds=500))
    nxt = _job(project)

    assert schedule_jobs() == [nxt.pk]
    row = JobAttempt.objects.get(job=done)
    assert row.warm_seconds == pytest.approx(40, abs=2)
    assert JobAttempt.objects.get(job=nxt).warm_start


# --- a job's figures ----------------------------------------------------------------------------------
def test_two_attempts_and_two_nodes_sum_to_the_job_figures(project):
    job = _job(project, nodes=2, status=JobStatus.COMPLETED, attempt=2, finished_at=T0 + timedelta(hours=2))
    for rank in (0, 1):
        _launch(job, attempt=1, rank=rank, start=T0, end=T0 + timedelta(seconds=600), trained=T0 + timedelta(seconds=60),
                price="2")
        _launch(job, attempt=2, rank=rank, start=T0 + timedelta(seconds=700), end=T0 + timedelta(seconds=1900),
                trained=T0 + timedelta(seconds=720), price="3")
    cost.settle_launches(job.pk)

    figures = cost.job_cost(job)
    assert figures["billable_time_seconds"] == 2 * 600 + 2 * 1200
    assert figures["training_time_seconds"] == 2 * 540 + 2 * 1180
    # 2 nodes × 600 s × 2/h + 2 nodes × 1200 s × 3/h = 0.6667 + 2.0
    assert figures["cost"] == "2.666666" and figures["cost_display"] == "2.67"
    assert [(a["attempt"], a["nodes"], a["price_per_hour"]) for a in figures["attempts"]] == [
        (1, 2, "2.000000"), (2, 2, "3.000000")]
    assert figures["projected_cost"] is None, "finished"


def test_a_running_attempt_counts_up_to_now(project):
    job = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0 + timedelta(seconds=10))
    _launch(job, start=T0, trained=T0 + timedelta(seconds=10), price="3600")
    figures = cost.job_cost(job, now=T0 + timedelta(seconds=100))
    assert (figures["billable_time_seconds"], figures["training_time_seconds"]) == (100.0, 90.0)
    assert figures["cost"] == "100.000000"
    assert figures["attempts"][0]["running"] is True


def test_the_projected_cost_follows_the_step_rate_to_max_steps(project):
    job = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0,
               hyperparameters={"max_steps": 100})
    _launch(job, start=T0, trained=T0, price="3600")  # 1 a second
    _log(job, "loss", [(step, 4.0 * step) for step in range(1, 26)])  # a step each 4 s: step 25 at 100 s

    figures = cost.job_cost(job, now=T0 + timedelta(seconds=100))
    # 75 steps to go at 4 s each: 300 s more at 1 a second, on top of the 100 so far.
    assert figures["cost"] == "100.000000"
    assert figures["projected_cost"] == "400.000000"


def test_the_projection_counts_neither_the_setup_before_step_one_nor_the_flushers_lag(project):
    """Seen in a walk: 0.567 projected at 22 s for a job that ended at 0.0795. The rate
    was the latest stored step over the whole training time, so the ~10 s of imports before
    step 1 counted as slow training, and so did the steps logged but not flushed yet."""
    job = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0,
               hyperparameters={"max_steps": 1000})
    _launch(job, start=T0, trained=T0, price="3600")
    # Training starts at T0 (processes launched); step 1 comes at 10 s, then 20 steps a
    # second: step 101 at 15 s, the newest point flushed; now is 17 s (the run is at step 141).
    _log(job, "loss", [(step, 10 + (step - 1) / 20) for step in range(1, 102)])
    now = T0 + timedelta(seconds=17)
    figures = cost.job_cost(job, now=now)
    # It ends at 10 + 999/20 = 59.95 s: a cost of 59.95 at 1 a second.
    assert Decimal(figures["projected_cost"]) == pytest.approx(Decimal("59.95"), abs=Decimal("0.01"))
    assert figures["cost"] == "17.000000"


def test_a_resumed_attempts_rate_does_not_span_the_downtime_before_it(project):
    job = _job(project, status=JobStatus.TRAINING, attempt=2, training_started_at=T0 + timedelta(seconds=300),
               hyperparameters={"max_steps": 200})
    _launch(job, attempt=1, start=T0, end=T0 + timedelta(seconds=100), trained=T0, price="3600",
            billable_seconds=100, training_seconds=100, cost=Decimal(100))
    _launch(job, attempt=2, start=T0 + timedelta(seconds=300), trained=T0 + timedelta(seconds=300), price="3600")
    _log(job, "loss", [(step, step) for step in range(1, 91)])  # attempt 1: a step a second, to step 90
    # Attempt 2 resumes from step 80 at 310 s, a step a second again: step 120 at 350 s.
    _log(job, "loss", [(step, 310 + step - 80) for step in range(80, 121)])
    figures = cost.job_cost(job, now=T0 + timedelta(seconds=350))
    # 100 + 50 so far, 80 steps to go at 1 s each.
    assert figures["projected_cost"] == "230.000000"


def test_the_projection_is_null_until_a_rate_is_known(project):
    job = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0, hyperparameters={"max_steps": 100})
    _launch(job, start=T0, trained=T0, price="3600")
    assert cost.job_cost(job, now=T0 + timedelta(seconds=5))["projected_cost"] is None, "no point yet"
    _log(job, "loss", [(1, 4.0)])
    assert cost.job_cost(job, now=T0 + timedelta(seconds=5))["projected_cost"] is None, "one point has no rate"
    _log(job, "loss", [(2, 5.0)])
    assert cost.job_cost(job, now=T0 + timedelta(seconds=5))["projected_cost"] == "103.000000"


def test_the_projected_cost_by_epochs_reads_the_epoch_series_and_is_null_when_unknowable(project):
    job = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0, hyperparameters={"epochs": 4})
    _launch(job, start=T0, trained=T0, price="3600")
    now = T0 + timedelta(seconds=50)
    _log(job, "loss", [(step, 5.0 * step) for step in range(1, 11)])  # a step each 5 s: step 10 at 50 s
    assert cost.job_cost(job, now=now)["projected_cost"] is None, "no epoch reported yet"
    _log(job, "epoch", [(10, 50.0)])
    assert cost.job_cost(job, now=now)["projected_cost"] == "200.000000", "1 of 4 epochs in 50 s"

    unknown = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0, hyperparameters={"lr": 0.1})
    _launch(unknown, start=T0, trained=T0)
    _log(unknown, "loss", [(step, 5.0 * step) for step in range(1, 11)])
    assert cost.job_cost(unknown, now=now)["projected_cost"] is None


# --- a project's month, a tuning job ---------------------------------------------------------------------
def test_the_spend_of_a_month_by_instance_type_and_by_user(project, owner, teammate):
    def launched(kind: str, user, start: datetime, seconds: int, price: str) -> None:
        job = _job(project, kind=kind, user=user, status=JobStatus.COMPLETED, attempt=1,
                   finished_at=start + timedelta(seconds=seconds))
        _launch(job, start=start, end=start + timedelta(seconds=seconds), price=price)
        cost.settle_launches(job.pk)

    launched("cpu", owner, T0, 3600, "1")
    launched("gpu", owner, T0 + timedelta(days=1), 1800, "10")
    launched("cpu", teammate, T0 + timedelta(days=2), 7200, "1")
    launched("cpu", teammate, datetime(2026, 10, 31, 23, 59, tzinfo=UTC), 60, "1000")  # October: not counted

    spend = cost.project_spend(project, "2026-11")
    assert spend["total"]["cost"] == "8.000000" and spend["total"]["jobs"] == 3
    by_type = {row["instance_type"]: row for row in spend["by_instance_type"]}
    assert (by_type["cpu"]["cost"], by_type["cpu"]["jobs"], by_type["cpu"]["node_hours"]) == ("3.000000", 2, 3.0)
    assert by_type["gpu"]["cost"] == "5.000000"
    by_user = {row["user"]: row["cost"] for row in spend["by_user"]}
    assert by_user == {"owner": "6.000000", "teammate": "2.000000"}
    assert [row["instance_type"] for row in spend["by_instance_type"]] == ["gpu", "cpu"], "dearest first"
    assert cost.project_spend(project, "2026-10")["total"]["cost"] == "16.666667"


@pytest.mark.parametrize("month", ["2026-13", "2026-1", "26-11", "2026-00", "abcd-ef", "", "2026-11-01", "2026-\uff11\uff12",
                                   "\u0662\u0660\u0662\u0666-12"])
def test_a_month_that_is_not_yyyy_mm_is_refused(month):
    with pytest.raises(ValueError):
        cost.month_bounds(month)


def test_december_ends_at_new_year():
    assert cost.month_bounds("2026-12") == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


# --- the API ------------------------------------------------------------------------------------------------
def _finished_job(project, seconds: int = 1800, price: str = "2") -> TrainingJob:
    job = _job(project, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now())
    _launch(job, start=timezone.now() - timedelta(seconds=seconds), end=timezone.now(), price=price)
    cost.settle_launches(job.pk)
    return job


def test_the_job_detail_and_list_carry_the_cost(project, owner, client_for, django_assert_max_num_queries):
    job = _finished_job(project)
    client = client_for(owner)
    detail = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert Decimal(detail["cost"]) == pytest.approx(Decimal("1"), abs=Decimal("0.001"))
    assert detail["billable_time_seconds"] == pytest.approx(1800, abs=1)
    assert detail["currency"] == "USD" and detail["projected_cost"] is None
    assert detail["cost_attempts"][0]["nodes"] == 1

    for _ in range(5):
        _finished_job(project)
    with django_assert_max_num_queries(12):
        rows = client.get("/api/v1/jobs/?project=acme").json()["results"]
    assert len(rows) == 6 and all(Decimal(row["cost"]) > 0 for row in rows)


def test_the_spend_api_names_a_bad_month_and_hides_other_projects(project, owner, viewer, outsider, client_for):
    _finished_job(project)
    month = cost.current_month()
    body = client_for(viewer).get(f"/api/v1/projects/acme/spend/?month={month}").json()
    assert Decimal(body["total"]["cost"]) > 0 and body["by_user"][0]["user"] == "(deleted user)"

    bad = client_for(owner).get("/api/v1/projects/acme/spend/?month=2026-13")
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["month"]
    assert client_for(outsider).get("/api/v1/projects/acme/spend/").status_code == 404


def test_prices_are_listed_for_readers_and_set_by_admins_only(project, owner, teammate, viewer, client_for, settings):
    settings.STUDIO_INSTANCE_PRICES = PRICES
    listed = client_for(viewer).get("/api/v1/projects/acme/instance-prices/").json()["results"]
    assert [(p["instance_type"], p["source"]) for p in listed] == [("cpu", "settings"), ("gpu", "settings")]

    url = "/api/v1/projects/acme/instance-prices/cpu/"
    for user in (viewer, teammate):
        refused = client_for(user).put(url, {"price_per_node_hour": "1"}, format="json")
        assert refused.status_code == 403, refused.content
    # The settings' gpu price is in USD: an EUR cpu price would add EUR and USD in the sums.
    mixed = client_for(owner).put(url, {"price_per_node_hour": "0.5", "currency": "eur"}, format="json")
    assert mixed.status_code == 400 and "Use USD" in mixed.json()["error"]["fields"]["currency"][0], mixed.content
    assert not InstancePrice.objects.exists()
    put = client_for(owner).put(url, {"price_per_node_hour": "0.5", "price_per_gpu_hour": 0, "currency": "usd"},
                                format="json")
    assert put.status_code == 200, put.content
    assert put.json()["source"] == "project" and put.json()["currency"] == "USD"
    assert put.json()["updated_by"] == "owner"
    assert cost.price_for(project.pk, "cpu", 0) == (Decimal("0.500000"), "USD")
    assert client_for(viewer).get(url).json()["price_per_node_hour"] == "0.500000"

    assert client_for(viewer).delete(url).status_code == 403
    assert client_for(owner).delete(url).status_code == 204
    assert client_for(owner).delete(url).status_code == 404
    assert client_for(owner).get(url).json()["source"] == "settings"


@pytest.mark.parametrize("value", [-1, "-0.01", "NaN", "Infinity", "1e9", "lots", True, None, [], "0.1234567"])
def test_a_bad_price_is_a_400_naming_the_field(project, owner, client_for, value):
    response = client_for(owner).put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": value},
                                     format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["price_per_node_hour"]
    if value == "1e9":  # one message, naming the maximum (it also said how many digits the column holds)
        assert response.json()["error"]["fields"]["price_per_node_hour"] == ["Ensure this value is less than or equal to 100000."]
    assert not InstancePrice.objects.exists()


def test_a_price_in_another_currency_than_the_projects_launches_is_refused(project, owner, client_for):
    job = _job(project, nodes=1, status=JobStatus.COMPLETED, attempt=1)
    _launch(job, attempt=1, rank=0, start=T0, end=T0 + timedelta(seconds=60), price="1")  # USD
    client = client_for(owner)
    refused = client.put("/api/v1/projects/acme/instance-prices/gpu/", {"price_per_node_hour": 2, "currency": "EUR"},
                         format="json")
    assert refused.status_code == 400, refused.content
    assert "jobs have run at prices in USD" in refused.json()["error"]["fields"]["currency"][0]
    assert not InstancePrice.objects.exists()
    from django.test import Client

    browser = Client()
    browser.force_login(owner)
    page = browser.post("/projects/acme/prices/", {"instance_type": "gpu", "price_per_node_hour": "2", "currency": "EUR"})
    assert page.status_code == 400 and b"Use USD" in page.content
    assert not InstancePrice.objects.exists()
    assert client.put("/api/v1/projects/acme/instance-prices/gpu/", {"price_per_node_hour": 2, "currency": "USD"},
                      format="json").status_code == 200


def test_a_bad_currency_or_instance_type_is_a_400_naming_it(project, owner, client_for):
    client = client_for(owner)
    response = client.put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": 1, "currency": "dollars"},
                          format="json")
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["currency"]
    # Three letters are not a currency: ISO 4217 has no ZZZ, and XTS is its code for tests.
    for code, said in (("ZZZ", "ZZZ is not an ISO 4217 currency code"), ("xts", "XTS is ISO 4217's code for no currency")):
        response = client.put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": 1, "currency": code},
                              format="json")
        assert response.status_code == 400 and said in response.json()["error"]["fields"]["currency"][0], response.content
    assert not InstancePrice.objects.exists()
    response = client.put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": 1, "currency": "chf"},
                          format="json")  # lower case is taken as the code it spells
    assert response.status_code == 200 and response.json()["currency"] == "CHF", response.content
    response = client.put("/api/v1/projects/acme/instance-prices/-bad/", {"price_per_node_hour": 1}, format="json")
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["instance_type"]


def test_the_tuning_job_detail_sums_its_trials(project, owner, client_for):
    from tuning.models import TuningJob

    tuning = TuningJob.objects.create(project=project, name="search", objective={"metric": "loss", "type": "Minimize"},
                                      max_trials=2, max_parallel=1, parameter_ranges={}, base_job={}, strategy="random")
    for number in (1, 2):
        trial = _finished_job(project, seconds=3600, price="1.5")
        TrainingJob.objects.filter(pk=trial.pk).update(tuning_job=tuning, trial_number=number)
    body = client_for(owner).get(f"/api/v1/tuning-jobs/{tuning.pk}/").json()
    assert body["cost"]["trials"] == 2
    assert Decimal(body["cost"]["cost"]) == pytest.approx(Decimal("3"), abs=Decimal("0.001"))


# --- a real worker ----------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_job_run_by_a_real_worker_costs_its_billable_seconds_at_the_snapshotted_price(node, make_job, project,
                                                                                      owner, client_for):
    from tests.conftest import wait_for
    from tests.jobs.conftest import run_to_end

    InstancePrice.objects.create(project=project, instance_type="cpu", price_per_node_hour=Decimal("360"))
    job = run_to_end(make_job(script="quick.py"))
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    row = wait_for(lambda: JobAttempt.objects.filter(job=job, billable_seconds__isnull=False).first(), timeout=30,
                   message="the agent to settle the launch")
    assert row.price_per_hour == Decimal("360") and row.training_started_at is not None
    assert 0 < row.training_seconds <= row.billable_seconds
    InstancePrice.objects.filter(project=project).update(price_per_node_hour=Decimal("9999"))

    body = client_for(owner).get(f"/api/v1/jobs/{job.pk}/").json()
    expected = cost.to_cents(Decimal(repr(row.billable_seconds)) * Decimal("360") / 3600)
    assert Decimal(body["cost"]).quantize(Decimal("0.01")) == expected
    assert body["billable_time_seconds"] == row.billable_seconds


def test_roles_for_a_price_are_checked_before_the_body(project, owner, client_for):
    viewer = make_member(project, "v2", Role.VIEWER)
    response = client_for(viewer).put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": -1},
                                      format="json")
    assert response.status_code == 403


def test_a_launch_never_closed_after_its_gang_moved_on_ends_with_its_gang(project):
    # A peer killed mid-attempt whose row the lost-node sweep never reached (the job had been
    # placed again first): it stops counting when its gang's other launches ended.
    job = _job(project, nodes=2, status=JobStatus.TRAINING, attempt=2)
    _launch(job, attempt=1, rank=0, start=T0, end=T0 + timedelta(seconds=300), price="3600")
    _launch(job, attempt=1, rank=1, start=T0, price="3600")
    cost.settle_launches(job.pk)
    figures = cost.job_cost(job, now=T0 + timedelta(days=1))
    assert figures["attempts"][0]["billable_seconds"] == 600
    assert figures["cost"] == "600.000000"


def test_the_tuning_job_cost_reads_the_same_queries_for_many_trials(project, owner, client_for):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tuning.models import TuningJob

    tuning = TuningJob.objects.create(project=project, name="wide", objective={"metric": "loss", "type": "Minimize"},
                                      max_trials=9, max_parallel=1, parameter_ranges={}, base_job={}, strategy="random")
    client = client_for(owner)

    def queries_with(trials: int) -> int:
        for number in range(TrainingJob.objects.filter(tuning_job=tuning).count(), trials):
            trial = _finished_job(project)
            TrainingJob.objects.filter(pk=trial.pk).update(tuning_job=tuning, trial_number=number + 1)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/api/v1/tuning-jobs/{tuning.pk}/").status_code == 200
        return len(captured)

    few = queries_with(2)
    assert queries_with(8) <= few, "no query per trial"


def test_the_projection_takes_whichever_of_max_steps_and_epochs_ends_the_run_first(project):
    job = _job(project, status=JobStatus.TRAINING, attempt=1, training_started_at=T0,
               hyperparameters={"epochs": 10, "max_steps": 0})
    _launch(job, start=T0, trained=T0, price="3600")
    _log(job, "epoch", [(20, 20.0)])
    _log(job, "train_loss", [(step, float(step)) for step in range(1, 31)])  # a step a second
    now = T0 + timedelta(seconds=30)
    # max_steps 0 = no limit: 10 epochs of 20 steps; 30 of 200 steps in 30 s → 170 s more.
    assert cost.job_cost(job, now=now)["projected_cost"] == "200.000000"
    TrainingJob.objects.filter(pk=job.pk).update(hyperparameters={"epochs": 10, "max_steps": 60})
    job.refresh_from_db()
    assert cost.job_cost(job, now=now)["projected_cost"] == "60.000000", "max_steps 60 ends it first"


@pytest.mark.django_db(transaction=True)
def test_a_real_workers_warm_pool_time_is_billed_to_the_job_that_left_it(node, make_job, project):
    from tests.conftest import wait_for
    from tests.jobs.conftest import run_to_end

    InstancePrice.objects.create(project=project, instance_type="cpu", price_per_node_hour=Decimal("3600"))
    job = run_to_end(make_job(script="quick.py", keep_alive_seconds=120))
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    wait_for(lambda: Node.objects.filter(pk=node.pk, state=NodeState.WARM, warm_from_job=job).exists(), timeout=30,
             message="the node to stay warm")
    row = wait_for(lambda: JobAttempt.objects.filter(job=job, billable_seconds__isnull=False).first(), timeout=30,
                   message="the launch to be settled")
    assert row.warm_seconds == 0
    # The pool expires 2 s after the launch ended.
    Node.objects.filter(pk=node.pk).update(warm_until=row.finished_at + timedelta(seconds=2))

    wait_for(lambda: expire_warm_pools() == 1, timeout=10, message="the pool to expire")
    row.refresh_from_db()
    assert row.warm_seconds == pytest.approx(2, abs=0.01)
    assert row.cost == cost.cost_of(row.billable_seconds + row.warm_seconds, Decimal("3600"))
    figures = cost.job_cost(job)
    assert figures["warm_pool_seconds"] == pytest.approx(2, abs=0.01)
    assert Decimal(figures["cost"]) == row.cost


def test_sums_over_launches_priced_in_two_currencies_say_so(project):
    # The site's currency changed under old jobs: the sum is never labelled one currency's.
    job = _job(project, nodes=1, status=JobStatus.COMPLETED, attempt=2)
    _launch(job, attempt=1, rank=0, start=T0, end=T0 + timedelta(seconds=3600), price="1")
    eur = _launch(job, attempt=2, rank=0, start=T0 + timedelta(hours=2), end=T0 + timedelta(hours=3), price="2")
    JobAttempt.objects.filter(pk=eur.pk).update(currency="EUR")
    assert cost.project_spend(project, "2026-11", now=T0 + timedelta(days=1))["currency"] == "EUR+USD"
    figures = cost.job_cost(job, now=T0 + timedelta(days=1))
    assert figures["currency"] == "EUR+USD"
    assert [a["currency"] for a in figures["attempts"]] == ["USD", "EUR"]


def test_the_price_schema_refuses_a_negative_price_as_the_api_does(project, owner, client_for):
    import jsonschema

    client = client_for(owner)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    body = schema["paths"]["/api/v1/projects/{slug}/instance-prices/{instance_type}/"]["put"]["requestBody"]
    validator = jsonschema.Draft202012Validator({**body["content"]["application/json"]["schema"],
                                                 "components": schema["components"]})
    for price, taken in (("1.25", True), ("0", True), ("-1", False), ("-0.5", False)):
        assert validator.is_valid({"price_per_node_hour": price}) is taken, price
        response = client.put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": price},
                              format="json")
        assert (response.status_code == 200) is taken, (price, response.content)


def test_a_project_price_replaces_the_sites_for_its_type_in_another_currency(project, owner, client_for):
    """Before any launch, a project may price in EUR a type the site prices in USD: its own
    price replaces the site's, so nothing would add EUR to USD. Another type still priced by
    the site in USD is what makes EUR a mix."""
    client = client_for(owner)
    InstancePrice.objects.create(project=None, instance_type="gpu", price_per_node_hour=Decimal("3"), currency="USD")
    put = client.put("/api/v1/projects/acme/instance-prices/gpu/", {"price_per_node_hour": "2.5", "currency": "EUR"},
                     format="json")
    assert put.status_code == 200 and put.json()["currency"] == "EUR", put.content

    InstancePrice.objects.create(project=None, instance_type="cpu", price_per_node_hour=Decimal("0.2"), currency="USD")
    mixed = client.put("/api/v1/projects/acme/instance-prices/gpu/", {"price_per_node_hour": "2", "currency": "EUR"},
                       format="json")
    assert mixed.status_code == 400 and "are in USD" in mixed.json()["error"]["fields"]["currency"][0], mixed.content
    # A cpu price of its own in EUR replaces the site's USD one: then no type of the project is
    # priced in USD, and gpu may change in EUR again.
    assert client.put("/api/v1/projects/acme/instance-prices/cpu/", {"price_per_node_hour": "0.1", "currency": "EUR"},
                      format="json").status_code == 200
    assert client.put("/api/v1/projects/acme/instance-prices/gpu/", {"price_per_node_hour": "2", "currency": "EUR"},
                      format="json").status_code == 200
    assert client.put("/api/v1/projects/acme/instance-prices/tpu/", {"price_per_node_hour": "9", "currency": "USD"},
                      format="json").status_code == 400, "USD beside the project's EUR prices"
