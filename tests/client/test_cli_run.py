"""`trainyard run … --follow` and the Python client against a real studio: the live
server, a control worker and a node worker, the CLI as a subprocess."""

from __future__ import annotations

import json
import re

import pytest

from jobs.models import JobStatus, TrainingJob
from tests.client.conftest import SCRIPTS
from tests.jobs.conftest import stored_text
from trainyard.client import Studio

pytestmark = pytest.mark.slow


def test_run_ddp_follow_exits_zero_with_the_job_completed_and_its_progress_shown(running_studio, cli, source_dir):
    result = cli("run", str(source_dir / "train.py"), "--distribution", "ddp", "--processes-per-node", "2",
                 "--hp", "steps=20", "--hp", "lr=0.05", "--max-file-size", "0.05", "--follow")

    output = result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    job = TrainingJob.objects.get()
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert job.distribution == "ddp" and job.resources["processes_per_node"] == 2
    # Parsed as JSON scalars on the way, so the script's SM_HPS sees numbers.
    assert job.hyperparameters == {"steps": 20, "lr": 0.05}
    # The status transitions, the progress of steps with the latest loss, the log, the outcome.
    for status in ("Training", "Completed"):
        assert re.search(rf"^\d\d:\d\d:\d\d {status}\b", output, re.M), output
    assert re.search(r"^progress: step 20/20 +loss=\d", output, re.M), output
    assert "[rank 0] step 20 loss" in output and "[rank 0] world size 2" in output, output
    assert f"job {job.pk} Completed" in output.splitlines()[-1]
    # What was packed: the folder with its module, not what .gitignore, the size limit or
    # the never-sent folders leave out; the size limit is said, not silent.
    sent = re.search(r"sent files: (.*)", output)
    assert sent and sent.group(1).split() == [".gitignore", "helpers.py", "keep.log", "train.py"], output
    assert "left out data.bin: 97.7 KiB, over the 51.2 KiB limit" in result.stderr, result.stderr
    assert "world size 2" in stored_text(f"{job.output_uri}/logs/rank-0.log")


def test_the_ddp_example_runs_from_the_cli_as_its_docstring_says(running_studio, cli):
    result = cli("run", "examples/ddp_classifier/train.py", "--distribution", "ddp", "--processes-per-node", "2",
                 "--hp", "epochs=2", "--follow")

    assert result.returncode == 0, result.stdout + result.stderr
    job = TrainingJob.objects.get()
    assert job.status == JobStatus.COMPLETED and job.script_uri and job.entry_point == "train.py"
    assert re.search(r"^progress: step \d+ +train_\w+=\d", result.stdout, re.M), result.stdout
    assert "[rank 0] epoch 2: train_loss=" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"job {job.pk} Completed")


def test_a_failing_script_exits_nonzero_printing_its_reason(running_studio, cli):
    result = cli("run", str(SCRIPTS / "failing" / "train.py"), "--name", "bad-epochs", "--follow")

    assert result.returncode == 1, result.stdout + result.stderr
    job = TrainingJob.objects.get(name="bad-epochs")
    assert job.status == JobStatus.FAILED
    assert "checking the hyperparameters" in result.stdout
    assert result.stdout.splitlines()[-1] == f"job {job.pk} Failed: epochs must be positive, got -1"


def test_the_python_client_runs_waits_and_reads_logs_and_metrics(running_studio, source_dir, cli):
    from jobs.metrics.ingest import flush_once

    # The estimator's shape: the entry point named inside its source folder; the project is
    # the owner's only one.
    studio = Studio(running_studio.url, running_studio.token)
    job = studio.run(entry_point="train.py", source_dir=source_dir, distribution="ddp", processes_per_node=2,
                     hyperparameters={"steps": 5}, name="from-python")
    assert job.status == "Pending" and job.source is not None and "data.bin" in job.source.packed.files

    job.wait(timeout=120)

    assert job.status == "Completed", job.failure_reason
    assert "step 5 loss" in "\n".join(job.logs(rank=0))
    assert job.logs(rank=1, tail=5) == []  # rank 1 prints nothing
    flush_once()
    series = {(s["name"], s["rank"]): s for s in job.metrics()["series"]}
    assert series[("loss", 0)]["count"] == 5 and series[("loss", 0)]["last_step"] == 5
    assert [p[0] for p in job.metrics("loss")["points"]] == [1, 2, 3, 4, 5]
    assert job.refresh().data["name"] == "from-python"
    shown = cli("jobs", "metrics", str(job.id))
    assert re.search(r"^loss\s+0\s+5\s+1\s+5\s+\d", shown.stdout, re.M), shown.stdout + shown.stderr


def test_jobs_list_show_logs_and_json(running_studio, cli):
    submitted = cli("run", str(SCRIPTS / "failing" / "train.py"), "--name", "listed", "--json", "--tag", "nightly",
                    "--rule", '{"type": "stalled", "name": "quiet", "parameters": {"threshold_seconds": 600}}')
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    ended = cli("jobs", "logs", str(job_id), "-f")
    assert ended.returncode == 0 and "checking the hyperparameters" in ended.stdout, ended.stdout + ended.stderr

    listed = cli("jobs", "list", "--json")
    assert [row["name"] for row in json.loads(listed.stdout)] == ["listed"]
    shown = cli("jobs", "show", str(job_id))
    assert "epochs must be positive, got -1" in shown.stdout and "Failed" in shown.stdout
    assert re.search(r"^tags +nightly *$", shown.stdout, re.M), shown.stdout
    # Its rules (the default non_finite and --rule's), with their states.
    assert re.search(r"^non_finite +non_finite +\w+", shown.stdout, re.M), shown.stdout
    assert re.search(r"^quiet +stalled +\w+", shown.stdout, re.M), shown.stdout
    assert {r.name: r.type for r in TrainingJob.objects.get(pk=job_id).rules.all()} == {"non_finite": "non_finite",
                                                                                      "quiet": "stalled"}
    logs = cli("jobs", "logs", str(job_id), "--json")
    assert [line["text"] for line in json.loads(logs.stdout)["lines"]] == ["checking the hyperparameters"]
    alarms = cli("alarms")
    assert alarms.returncode == 0 and "no rule is ALARM on a running job" in alarms.stdout, alarms.stdout + alarms.stderr
    refused = cli("run", str(SCRIPTS / "failing" / "train.py"), "--rule", '{"type": "custom"}')
    assert refused.returncode != 0 and "rules[0].parameters.metric" in refused.stderr, refused.stderr
