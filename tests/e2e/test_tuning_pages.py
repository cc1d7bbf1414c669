"""Tuning pages in a real browser (Debian chromium through Playwright) against the live
server: a search made in the database draws its three charts, its trials table sorts and
gains a finished trial without a reload; "Tune this" on a finished job opens a pre-filled
form that starts a search, and the API's field errors land next to their inputs.
Screenshots: /tmp/trainyard-tuning-*.png."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobStatus, TrainingJob
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_job_pages import finished_job, ready_version, sign_in  # noqa: F401 - fixtures
from tuning.models import TuningJob, TuningStatus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RANGES = {
    "learning_rate": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"},
    "hidden_units": {"type": "integer", "min": 16, "max": 256},
    "optimizer": {"type": "categorical", "values": ["adam", "sgd", "rmsprop"]},
}


def trial(search: TuningJob, number: int, lr: float, units: int, optimizer: str, *, status: str = JobStatus.COMPLETED,
          stop_reason: str = "", value: float | None = None, reported: dict | None = None) -> TrainingJob:
    """A trial whose accuracy peaks at lr 0.01 and grows a little with width."""
    now = timezone.now()
    if value is None and status == JobStatus.COMPLETED:
        value = round(0.95 - 0.12 * abs(math.log10(lr) + 2) + 0.0002 * units - (0.02 if optimizer == "sgd" else 0), 4)
    return TrainingJob.objects.create(
        project=search.project, name=f"{search.name}-{number}", algorithm="tabular-classifier", status=status,
        stop_reason=stop_reason, tuning_job=search, trial_number=number,
        trial_params={"learning_rate": lr, "hidden_units": units, "optimizer": optimizer}, objective_value=value,
        intermediate_values=reported or {}, hyperparameters={"epochs": 5, "learning_rate": lr, "hidden_units": units},
        started_at=now - timedelta(minutes=40 - 3 * number),
        finished_at=None if status == JobStatus.TRAINING else now - timedelta(minutes=36 - 3 * number))


@pytest.fixture
def search(project, scientist):
    search = TuningJob.objects.create(
        project=project, name="width-and-lr", status=TuningStatus.IN_PROGRESS, strategy="bayesian",
        base_job={"algorithm": "tabular-classifier", "hyperparameters": {"epochs": 5, "label_column": "label"},
                  "inputs": {}, "resources": {"instance_type": "cpu"}},
        parameter_ranges=RANGES, objective={"metric": "validation_accuracy", "goal": "maximize"}, max_trials=12,
        max_parallel=2, early_stopping="median", created_by=scientist, started_at=timezone.now() - timedelta(minutes=41))
    for number, (lr, units, optimizer) in enumerate([(0.001, 64, "adam"), (0.03, 128, "sgd"), (0.0003, 32, "rmsprop"),
                                                     (0.008, 200, "adam"), (0.05, 96, "sgd"), (0.012, 160, "rmsprop")]):
        trial(search, number, lr, units, optimizer)
    trial(search, 6, 0.0002, 24, "sgd", status=JobStatus.STOPPED, stop_reason="EarlyStopped",
          reported={"20": 0.41, "40": 0.48})
    trial(search, 7, 0.02, 180, "adam", status=JobStatus.TRAINING, reported={"20": 0.83})
    best = search.trials.filter(status=JobStatus.COMPLETED).order_by("-objective_value").first()
    TuningJob.objects.filter(pk=search.pk).update(best_trial=best, best_value=best.objective_value)
    search.refresh_from_db()
    return search


def column_values(page, index: int) -> list[str]:
    return page.eval_on_selector_all("#trials-table tbody tr", f"rows => rows.map(r => r.cells[{index}].innerText.trim())")


def test_detail_draws_three_charts_sorts_and_gains_a_trial_live(live_server, scientist, search, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(f"{base}/tuning/{search.pk}/")
    page.locator("#objective-chart .main-svg").first.wait_for()
    page.locator("#parcoords-chart .main-svg").first.wait_for()
    page.locator("#importance-chart .main-svg").first.wait_for()
    kinds = page.evaluate("""() => ['objective', 'parcoords', 'importance'].map(
        id => document.getElementById(id + '-chart').data.map(trace => trace.type))""")
    assert kinds[0][0] == "scatter" and "scatter" in kinds[0]  # best-so-far line and status groups
    assert kinds[1] == ["parcoords"] and kinds[2] == ["bar"]
    dims = page.evaluate("() => document.getElementById('parcoords-chart').data[0].dimensions.map(d => d.label)")
    assert dims == ["hidden_units", "learning_rate (log)", "optimizer", "validation_accuracy"]  # by name
    groups = page.evaluate("() => document.getElementById('objective-chart').data.map(t => t.name)")
    assert groups == ["best so far", "completed", "pruned", "running"]
    assert page.locator('#trials-table [data-status="pruned"]').count() == 1
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-detail.png"), full_page=True)

    # Sort by the objective: ascending, then descending (the best first).
    header = page.locator("#trials-table thead th").nth(2)
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    assert column_values(page, 0)[0] == f"#{search.best_trial.trial_number}"

    # A trial finishes with a new best: the page shows it without a reload, still sorted.
    page.evaluate("window.__sameDocument = true")
    TrainingJob.objects.filter(tuning_job=search, trial_number=7).update(
        status=JobStatus.COMPLETED, objective_value=0.99, finished_at=timezone.now())
    newest = search.trials.get(trial_number=7)
    TuningJob.objects.filter(pk=search.pk).update(best_trial=newest, best_value=0.99)
    page.wait_for_function("() => document.getElementById('best-value').textContent.trim() === '0.99'", timeout=20_000)
    page.wait_for_function("() => document.querySelector('#trials-table tbody tr').getAttribute('data-trial') === '7'",
                           timeout=10_000)
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("#trials-table thead th").nth(2).get_attribute("aria-sort") == "descending"
    assert page.evaluate("() => document.getElementById('objective-chart').data.find(t => t.name === 'completed').x.length") == 7

    # Stop: nothing is running any more, so the search ends at once; the page says so by itself.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-tuning")
    page.locator('#tuning-status [data-status="stopped"], #tuning-status [data-status="stopping"]').first.wait_for(
        timeout=20_000)
    search.refresh_from_db()
    assert search.status in (TuningStatus.STOPPING, TuningStatus.STOPPED) and search.end_reason == "StopRequested"
    page.locator('#tuning-status [data-status="stopped"]').wait_for(timeout=30_000)
    assert page.locator("#stop-tuning").count() == 0
    assert "someone asked it to stop" in page.locator("#tuning-state").inner_text()
    assert page.evaluate("window.__sameDocument") is True
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-stopped.png"), full_page=True)

    page.goto(f"{base}/tuning/")
    assert "width-and-lr" in page.locator("#tuning-table").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-list.png"), full_page=True)
    assert not page.console_errors, page.console_errors


def test_tune_this_prefills_the_form_and_starts_a_search(live_server, scientist, project, ready_version,  # noqa: F811
                                                         browser_page):
    page = browser_page
    base = live_server.url
    source = finished_job(project, scientist, ready_version, name="baseline", status=JobStatus.COMPLETED,
                          hyperparameters={"epochs": 20, "learning_rate": 0.003, "hidden_units": 64, "label_column": "label"},
                          final={"train_loss": 0.12, "validation_accuracy": 0.93}, curve=0.9)
    sign_in(page, base)
    page.goto(f"{base}/jobs/{source.pk}/")
    page.click("text=Tune this")
    page.wait_for_url(re.compile(rf"/tuning/new/\?from_job={source.pk}$"))
    page.locator('.range-row[data-range="learning_rate"]').wait_for()
    assert page.input_value("#id_name") == "baseline-tuning"
    assert page.input_value("#id_algorithm") == "tabular-classifier"
    lr = page.locator('.range-row[data-range="learning_rate"]')
    assert lr.locator(".range-type").input_value() == "continuous" and lr.locator(".range-scale").input_value() == "log"
    assert lr.locator(".range-min").input_value() == "0.0003" and lr.locator(".range-max").input_value() == "0.03"
    units = page.locator('.range-row[data-range="hidden_units"]')
    assert units.locator(".range-min").input_value() == "32" and units.locator(".range-max").input_value() == "128"
    assert page.locator('.range-row[data-range="epochs"]').count() == 0
    assert page.input_value("#hp-epochs") == "20" and page.input_value("#hp-label_column") == "label"
    assert page.locator("#hp-learning_rate").is_disabled()  # searched, so not fixed
    assert page.input_value("#id_objective_metric") == "validation_accuracy"
    assert page.input_value("#id_objective_goal") == "maximize"
    assert page.input_value("#channel-0") == str(ready_version.pk)
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-form.png"), full_page=True)

    # Keep two ranges, break one bound: the API's error lands on its row.
    for name in ("batch_size", "weight_decay", "dropout", "layers"):
        page.locator(f'.range-row[data-range="{name}"] button').click()
    lr.locator(".range-min").fill("0.5")
    page.fill("#id_max_trials", "4")
    page.click("#tuning-submit")
    error = lr.locator(".field-error")
    error.wait_for()
    assert "min" in error.inner_text().lower()
    assert page.locator("#form-error").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-form-errors.png"), full_page=True)

    lr.locator(".range-min").fill("0.001")
    page.click("#tuning-submit")
    page.wait_for_url(re.compile(r"/tuning/\d+/$"))
    created = TuningJob.objects.get(name="baseline-tuning")
    assert created.parameter_ranges["learning_rate"]["min"] == 0.001
    assert set(created.parameter_ranges) == {"learning_rate", "hidden_units"}
    assert created.base_job["algorithm"] == "tabular-classifier"
    assert created.base_job["hyperparameters"]["epochs"] == 20
    assert "learning_rate" not in created.base_job["hyperparameters"]
    assert created.objective == {"metric": "validation_accuracy", "goal": "maximize"}
    assert created.max_trials == 4
    page.locator("#tuning-head h1").wait_for()
    assert "baseline-tuning" in page.locator("#tuning-head h1").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-started.png"), full_page=True)
    # The browser logs the refused submission's 400 itself; nothing else may go wrong.
    unexpected = [e for e in page.console_errors if "status of 400" not in e]
    assert not unexpected, unexpected


def test_tune_this_from_a_script_job(live_server, scientist, project, ready_version, browser_page):  # noqa: F811
    """A script has no schema: its numeric hyperparameters get ranges by their values, the
    objective is typed (suggested from its metric definitions), the other values stay as lines."""
    from jobs.models import JobInput
    from jobs.scripts import store_script

    stored = store_script(project.slug, "train.py", b"import os\nprint('val_loss=0.5')\n")
    source = TrainingJob.objects.create(
        project=project, name="my-script", script_uri=stored.uri, entry_point="train.py", status=JobStatus.COMPLETED,
        hyperparameters={"lr": 0.02, "depth": 6, "mode": "fast"}, created_by=scientist,
        metric_definitions=[{"name": "val_loss", "regex": "val_loss=([0-9.]+)"}], final_metrics={"val_loss": 0.5})
    JobInput.objects.create(job=source, channel="train", dataset_version=ready_version)
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(f"{base}/tuning/new/?from_job={source.pk}")
    page.locator('.range-row[data-range="lr"]').wait_for()
    assert page.locator("#id_algorithm").count() == 0 and "train.py" in page.locator("#script-summary").inner_text()
    assert page.locator('.range-row[data-range="depth"] .range-type').input_value() == "integer"
    assert page.input_value("#id_script_hyperparameters") == "mode=fast"
    assert page.input_value("#id_objective_metric") == "val_loss"
    assert page.input_value("#id_objective_goal") == "minimize"
    page.fill("#id_max_trials", "3")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-tuning-form-script.png"), full_page=True)
    page.click("#tuning-submit")
    page.wait_for_url(re.compile(r"/tuning/\d+/$"))
    created = TuningJob.objects.get(name="my-script-tuning")
    assert created.base_job["script"]["uri"] == stored.uri
    assert created.base_job["hyperparameters"] == {"mode": "fast"}
    assert created.base_job["metric_definitions"] == [{"name": "val_loss", "regex": "val_loss=([0-9.]+)"}]
    assert created.objective == {"metric": "val_loss", "goal": "minimize"}
    assert set(created.parameter_ranges) == {"lr", "depth"}
    assert not page.console_errors, page.console_errors
