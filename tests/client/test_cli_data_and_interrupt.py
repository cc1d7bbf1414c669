"""The CLI's datasets and inputs, and a followed job on a terminal (a pseudo-terminal):
rich's progress bar, then Ctrl-C, which asks whether to stop the job."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from datasets.models import DatasetVersion
from jobs.models import JobStatus, TrainingJob
from tests.client.conftest import SCRIPTS
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow


def test_datasets_upload_then_run_with_the_dataset_as_an_input(running_studio, cli, tmp_path):
    data = tmp_path / "iris"
    data.mkdir()
    (data / "train.csv").write_text("x,y,label\n" + "".join(f"{i},{i * 2},{'ab'[i % 2]}\n" for i in range(40)))

    uploaded = cli("datasets", "upload", "iris", str(data), "--label-column", "label", "--json")

    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    version = json.loads(uploaded.stdout)
    assert (version["name"], version["version"], version["status"], version["num_records"]) == ("iris", 1, "ready", 40)
    listed = cli("datasets", "list")
    assert re.search(rf"\biris\s+1\s+{version['id']}\s+ready\s+40\b", listed.stdout), listed.stdout

    ran = cli("run", str(SCRIPTS / "reads_channel" / "train.py"), "--input", "train=iris:1", "--follow")

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "channel file train.csv: x,y,label" in ran.stdout
    job = TrainingJob.objects.get()
    assert list(job.inputs.values_list("channel", "dataset_version")) == [("train", version["id"])]

    missing = cli("run", str(SCRIPTS / "reads_channel" / "train.py"), "--input", "train=iris:7")
    assert missing.returncode == 2 and "inputs: dataset 'iris' has no version 7 (it has 1)" in missing.stderr
    assert DatasetVersion.objects.count() == 1 and TrainingJob.objects.count() == 1


def read_until(master: int, pattern: str, seen: list[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = "".join(seen)
        if re.search(pattern, text):
            return text
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                seen.append(os.read(master, 65536).decode(errors="replace"))
            except OSError:  # the child closed the terminal
                break
    raise AssertionError(f"no {pattern!r} on the terminal in {timeout:.0f} s:\n{''.join(seen)[-4000:]}")


def test_ctrl_c_without_a_terminal_leaves_the_job_running_and_exits_130(running_studio):
    process = subprocess.Popen([sys.executable, "-m", "trainyard.client.cli", "run", str(SCRIPTS / "endless" / "train.py"),
                                "--name", "left-running", "--follow"], cwd=ROOT, env=running_studio.env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: TrainingJob.objects.filter(name="left-running", status=JobStatus.TRAINING).exists(), timeout=90,
                 message="the job to train")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()

    assert process.returncode == 130, stdout + stderr
    job = TrainingJob.objects.get(name="left-running")
    assert f"job {job.pk} keeps running; `trainyard jobs logs -f {job.pk}` follows it again." in stderr
    assert "Traceback" not in stderr
    job.refresh_from_db()
    assert job.status == JobStatus.TRAINING


def test_on_a_terminal_follow_draws_a_bar_and_ctrl_c_asks_then_stops_the_job(running_studio):
    master, slave = pty.openpty()
    env = {**running_studio.env, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
    process = subprocess.Popen([sys.executable, "-m", "trainyard.client.cli", "run", str(SCRIPTS / "endless" / "train.py"),
                                "--name", "endless", "--hp", "steps=1000", "--follow"], cwd=ROOT, env=env,
                               stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen: list[str] = []
    try:
        # rich's bar: the status, the steps out of the hyperparameter's total, the loss.
        read_until(master, r"Training.*step \d+/1000.*loss=", seen)
        process.send_signal(signal.SIGINT)
        read_until(master, r"Stop job \d+\? \[y/N\]", seen)
        os.write(master, b"y\n")
        text = read_until(master, r"job \d+ Stopped", seen)
        assert process.wait(60) == 1, text
        # On a terminal the bar stands for the plain progress lines; the job is named once.
        assert "progress:" not in text and text.count("(endless): http") == 1, text
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    job = TrainingJob.objects.get(name="endless")
    assert job.status == JobStatus.STOPPED and job.stop_reason == "StopRequested"
