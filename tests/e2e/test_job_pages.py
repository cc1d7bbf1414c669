"""A real browser (Debian chromium through Playwright) against the live server, a real
node worker and real torch processes: submit a job from the form, watch the loss chart
gain points without a reload, stop the job. Plus the form's inline field errors, a failed
job's page and the compare page, with screenshots of each (/tmp/trainyard-job-*.png)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from datasets.storage import join_uri, object_uri, store_for
from jobs.models import JobEvent, JobInput, JobStatus, MetricPoint, SystemMetric, TrainingJob
from tests.conftest import wait_for
from tests.e2e.conftest import PASSWORD, SCREENSHOTS
from tests.factories import make_job, make_version
from tests.jobs import conftest as job_fixtures
from tests.jobs.conftest import wait_status

# The session's real node worker (`studio worker --queue cpu`) with its Node row, reused
# rather than copied.
node_worker = job_fixtures.node_worker
node = job_fixtures.node

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def ready_version(project, scientist, tmp_path):
    """A separable table, big enough that an epoch takes several logged steps."""
    rows = ["x1,x2,label"] + [f"{i % 13 - 6},{(i * 7) % 11 - 5},{'pos' if i % 13 > 6 else 'neg'}" for i in range(1200)]
    return make_version(project, tmp_path, {"train.csv": "\n".join(rows) + "\n"}, name="points", user=scientist)


def sign_in(page, base_url: str) -> None:
    page.goto(base_url + "/login/")
    page.fill("#id_username", "sam")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def trace_points(page, metric: str) -> int:
    """How many points the metric's chart holds now (all its traces)."""
    return page.evaluate(
        """(metric) => {
            const div = document.querySelector(`.chart[data-metric="${metric}"]`);
            if (!div || !div.data) return 0;
            return div.data.reduce((sum, trace) => sum + trace.x.length, 0);
        }""", metric)


def test_submit_watch_the_loss_grow_live_and_stop(live_server, node_worker, node, scientist, ready_version, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)

    page.goto(base + "/jobs/new/")
    page.fill("#id_name", "live-e2e")
    page.select_option("#id_algorithm", "tabular-classifier")
    page.fill("#hp-epochs", "500")            # long enough to be stopped mid-training
    page.fill("#hp-batch_size", "16")
    page.fill("#hp-log_every_steps", "2")
    page.fill("#hp-label_column", "label")
    assert page.input_value("#channel-0") == str(ready_version.pk)  # the only dataset, preselected for train
    page.fill("#id_max_runtime_seconds", "300")  # a safety net if the stop below never arrives
    page.fill("#id_tags", "e2e, live")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-form.png"), full_page=True)
    page.click("#job-submit")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = TrainingJob.objects.get(name="live-e2e")
    assert job.tags == ["e2e", "live"] and job.hyperparameters["epochs"] == 500

    # A marker that a reload would wipe: the charts must grow in this same document.
    page.evaluate("window.__sameDocument = true")
    from jobs.scheduling import schedule_jobs

    wait_for(lambda: job.pk in schedule_jobs() or TrainingJob.objects.get(pk=job.pk).status != JobStatus.PENDING,
             timeout=30, message="the job to be placed on the node")
    try:
        page.locator('#job-status [data-status="training"]').wait_for(timeout=90_000)
    except Exception:
        job.refresh_from_db()
        raise AssertionError(f"the page never showed Training; the job is {job.status} ({job.failure_reason}); timeline: "
                             f"{list(job.events.values_list('status', 'message'))}\nnode log:\n{node_worker.log()[-3000:]}") from None
    page.wait_for_function("() => { const d = document.querySelector('.chart[data-metric=\"train_loss\"]');"
                           " return d && d.data && d.data.length && d.data[0].x.length >= 2; }", timeout=90_000)
    first = trace_points(page, "train_loss")
    page.wait_for_function(f"() => document.querySelector('.chart[data-metric=\"train_loss\"]').data[0].x.length > {first}",
                           timeout=60_000)
    assert trace_points(page, "train_loss") > first
    assert page.evaluate("window.__sameDocument") is True
    page.locator("#log .log-line").first.wait_for(timeout=30_000)

    # A fresh page draws the history from the metrics API (what the flusher wrote), then
    # keeps growing from the stream.
    from jobs.metrics.ingest import flush_once

    wait_for(lambda: flush_once() and MetricPoint.objects.filter(job=job, name="train_loss").count() >= 3,
             timeout=30, message="points written to the database")
    stored = MetricPoint.objects.filter(job=job, name="train_loss").count()
    page.reload()
    page.wait_for_function(f"() => {{ const d = document.querySelector('.chart[data-metric=\"train_loss\"]');"
                           f" return d && d.data && d.data.length && d.data[0].x.length >= {stored}; }}", timeout=30_000)
    reloaded = trace_points(page, "train_loss")
    page.evaluate("window.__sameDocument = true")
    page.wait_for_function(f"() => document.querySelector('.chart[data-metric=\"train_loss\"]').data[0].x.length > {reloaded}",
                           timeout=60_000)
    steps = page.evaluate("() => document.querySelector('.chart[data-metric=\"train_loss\"]').data[0].x")
    assert steps == sorted(set(steps))  # history and live joined without repeats…
    assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 2, steps  # …and without a gap (log_every_steps=2)
    # The log too: its history (read up to where the page's stream starts, not from the
    # file, which lags) and its live lines meet without a repeat or a gap.
    log_steps = "() => [...document.querySelectorAll('#log .log-line')].map(l => (l.textContent.match(/step=(\\d+) train_loss=/) || [])[1]).filter(Boolean).map(Number)"
    shown = len(page.evaluate(log_steps))
    page.wait_for_function(f"() => ({log_steps})().length > {shown} + 2", timeout=60_000)
    logged = page.evaluate(log_steps)
    assert logged == sorted(set(logged)), logged
    assert max(b - a for a, b in zip(logged, logged[1:], strict=False)) <= 2, logged
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-running.png"), full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-job")
    page.locator('#job-status [data-status="stopped"]').wait_for(timeout=90_000)
    assert page.evaluate("window.__sameDocument") is True
    assert wait_status(job, JobStatus.STOPPED).stop_reason == "StopRequested"
    assert page.locator("#stop-job").count() == 0
    assert "Stopped on request" in page.locator("#job-state").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-stopped.png"), full_page=True)
    assert not page.console_errors, page.console_errors


def test_form_puts_api_errors_next_to_their_fields(live_server, scientist, ready_version, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(base + "/jobs/new/")
    page.fill("#id_name", "bad-values")
    page.fill("#id_processes_per_node", "0")   # below the serializer's minimum
    page.click("#job-submit")
    per_node = page.locator('.field[data-field="resources.processes_per_node"] .field-error')
    per_node.wait_for()
    assert "greater than or equal to 1" in per_node.inner_text()
    assert page.locator("#form-error").is_visible()

    # Fixed, the next problem comes from the algorithm's schema: a dotted path to its field.
    page.fill("#id_processes_per_node", "1")
    page.fill("#hp-learning_rate", "50")       # above the schema's max
    page.click("#job-submit")
    lr_error = page.locator('.field[data-field="hyperparameters.learning_rate"] .field-error')
    lr_error.wait_for()
    assert "≤ 1" in lr_error.inner_text()
    assert per_node.is_hidden()                # the fixed field's error is gone
    assert "/jobs/new/" in page.url and not TrainingJob.objects.exists()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-form-errors.png"), full_page=True)


def test_script_job_from_the_form(live_server, scientist, ready_version, browser_page):
    """Custom script: the file goes to POST /api/v1/scripts/ as soon as it is chosen, the
    entry point is filled from the answer, and the job names the stored script."""
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(base + "/jobs/new/")
    page.get_by_text("Custom script", exact=True).click()
    page.fill("#id_name", "my-script")
    page.set_input_files("#id_script_file", str(job_fixtures.SCRIPTS / "quick.py"))
    page.wait_for_function("() => document.getElementById('script-summary').textContent.startsWith('Uploaded quick.py')")
    assert page.input_value("#id_entry_point") == "quick.py"
    page.fill("#id_script_hyperparameters", "epochs=3\nlr=0.01\nname=<b>x</b>")
    page.locator("#metric-rows .metric-name").fill("loss")
    page.locator("#metric-rows .metric-regex").fill("loss=([0-9.]+)")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-form-script.png"), full_page=True)
    page.click("#job-submit")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = TrainingJob.objects.get(name="my-script")
    assert job.entry_point == "quick.py" and job.script_uri.endswith("quick.py") and not job.algorithm
    assert job.hyperparameters == {"epochs": 3, "lr": 0.01, "name": "<b>x</b>"}
    assert job.metric_definitions == [{"name": "loss", "regex": "loss=([0-9.]+)"}]
    assert job.inputs.get().dataset_version_id == ready_version.pk
    assert not page.console_errors, page.console_errors


def finished_job(project, user, version, *, name: str, status: str, hyperparameters: dict, final: dict, curve: float,
                 failure: str = "") -> TrainingJob:
    """A finished job as the runner leaves it: timeline, metric points, system samples."""
    now = timezone.now()
    started = now - timezone.timedelta(minutes=4)
    job = make_job(
        project, name=name, algorithm="tabular-classifier", hyperparameters=hyperparameters, created_by=user,
        resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1}, status=status, attempt=1,
        started_at=started, training_started_at=started, finished_at=now, final_metrics=final, failure_reason=failure,
        tags=["e2e"],
    )
    job.output_uri = object_uri(f"jobs/{job.pk}")
    job.save(update_fields=["output_uri"])
    log_uri = join_uri(job.output_uri, "logs", "rank-0.log")
    with store_for(log_uri).open_write(log_uri) as out:
        out.write("".join(f"epoch={step // 100} step={step} train_loss={curve / (1 + step / 40):.4f}\n" for step in range(0, 400, 20)).encode())
        if failure:
            out.write(("Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n" + failure + "\n").encode())
    JobInput.objects.create(job=job, channel="train", dataset_version=version)
    for offset, step_status, message in ((0, "Pending", "Submitted"), (5, "Starting", "Placed on node e2e-1"),
                                         (20, "Training", "Processes started"), (230, status, failure.splitlines()[0] if failure else "Done")):
        JobEvent.objects.create(job=job, status=step_status, at=started + timezone.timedelta(seconds=offset), message=message, attempt=1)
    MetricPoint.objects.bulk_create(
        [MetricPoint(job=job, name="train_loss", step=step, value=curve / (1 + step / 40) + 0.02 * ((step * 7) % 5), time=now)
         for step in range(0, 400, 4)]
        + [MetricPoint(job=job, name="validation_accuracy", step=step, value=min(0.98, 0.5 + step / (900 * curve)), time=now)
           for step in range(40, 400, 40)]
    )
    SystemMetric.objects.bulk_create([
        SystemMetric(job=job, node_name="e2e-1", time=started + timezone.timedelta(seconds=5 * i), cpu_percent=60 + (i * 13) % 35,
                     memory_bytes=int((1.2 + 0.01 * i) * 2**30)) for i in range(45)
    ])
    return job


def test_failed_job_and_compare_pages(live_server, scientist, project, ready_version, browser_page):
    page = browser_page
    base = live_server.url
    reason = ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x3 and 2x64)\n"
              "  rank 0 exited with code 1 (last lines of stderr above)")
    failed = finished_job(project, scientist, ready_version, name="wide-net", status=JobStatus.FAILED,
                          hyperparameters={"epochs": 20, "learning_rate": 0.01, "hidden_units": 256}, final={}, curve=1.1,
                          failure=reason)
    small = finished_job(project, scientist, ready_version, name="baseline", status=JobStatus.COMPLETED,
                         hyperparameters={"epochs": 20, "learning_rate": 0.003, "hidden_units": 64},
                         final={"train_loss": 0.12, "validation_accuracy": 0.93}, curve=0.9)
    sign_in(page, base)

    page.goto(f"{base}/jobs/{failed.pk}/")
    assert "mat1 and mat2 shapes" in page.locator(".failure-reason").inner_text()
    page.locator("#system-chart .main-svg").first.wait_for()
    page.locator('.chart[data-metric="train_loss"] .main-svg').first.wait_for()
    page.locator("#log .log-line").first.wait_for()
    assert "mat1 and mat2" in page.locator("#log").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-failed.png"), full_page=True)

    page.goto(f"{base}/jobs/")
    page.check(f'input[name="ids"][value="{failed.pk}"]')
    page.check(f'input[name="ids"][value="{small.pk}"]')
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-list.png"), full_page=True)
    page.click("#compare-submit")
    page.wait_for_url(re.compile(r"/jobs/compare/\?"))
    differing = page.locator("#differing-table").inner_text()
    assert "learning_rate" in differing and "hidden_units" in differing and "epochs" not in differing
    page.wait_for_function("() => document.getElementById('compare-charts').hasAttribute('data-drawn')")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-compare.png"), full_page=True)
    assert not page.console_errors, page.console_errors


def test_a_finished_one_rank_jobs_log_keeps_the_launchers_notes(live_server, scientist, project, ready_version,
                                                                  browser_page):
    # While it ran, the page showed the launcher's own lines ("[trainyard] launched …", a
    # dropped regex, "processes ended") beside rank 0's; once it ended it read rank 0's file
    # alone and they were gone. Now it reads the live stream's lines of every rank.
    from studio.redis_conn import redis_client
    from trainyard.protocol import LOGS_STREAM, key

    job = finished_job(project, scientist, ready_version, name="noted", status=JobStatus.COMPLETED,
                       hyperparameters={"epochs": 1}, final={}, curve=1.0)
    log_uri = join_uri(job.output_uri, "logs", "rank-0.log")
    with store_for(log_uri).open_write(log_uri) as out:
        out.write(b"step 1 loss 0.5\n")
    stream = key(LOGS_STREAM, job.pk)
    for rank, text in ((-1, "[trainyard] launched 1 process(es) on node e2e-1, cold"), (0, "step 1 loss 0.5"),
                       (-1, "[trainyard] metric 'evil': its regex ran out of time"), (-1, "[trainyard] processes ended")):
        redis_client().xadd(stream, {"r": rank, "t": "1700000000.000", "s": "err" if rank < 0 else "out", "l": text})
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.locator("#log .log-line").nth(3).wait_for()
    lines = page.locator("#log .log-line").all_inner_texts()
    assert lines[1] == "step 1 loss 0.5" and lines[0].startswith("[trainyard] launched"), lines
    assert any("ran out of time" in line for line in lines) and any("processes ended" in line for line in lines), lines

    # No stream left (Redis restarted): rank 0's file, as before.
    redis_client().delete(stream)
    page.reload()
    page.locator("#log .log-line").first.wait_for()
    assert page.locator("#log .log-line").all_inner_texts() == ["step 1 loss 0.5"]


def test_relative_times_keep_up_by_the_second(live_server, scientist, project, ready_version, browser_page):
    # A new user watched "created 12 s ago" stay put for half a minute: the phrases were
    # re-rendered every 30 s. Now every 5 s (a page clock the test moves on).
    job = finished_job(project, scientist, ready_version, name="ticking", status=JobStatus.COMPLETED,
                       hyperparameters={"epochs": 1}, final={}, curve=1.0)
    TrainingJob.objects.filter(pk=job.pk).update(created_at=timezone.now())
    page = browser_page
    sign_in(page, live_server.url)
    page.clock.install()
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    created = page.locator("time.reltime").first
    assert created.inner_text() == "just now"
    page.clock.run_for(12_000)
    assert re.fullmatch(r"1[0-5] s ago", created.inner_text()), created.inner_text()
    assert not page.console_errors
