"""Job processes never load Django (docs/SPEC.md §3.4): every module of `trainyard` and
`algorithms` imports without the studio's code, and a job's sys.path, cold or forked from a
warm pool, reaches `trainyard` and `algorithms` but not the studio's apps, so a script that
imports app code fails with that ImportError as its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.models import JobAttempt, JobStatus, Node, NodeState
from jobs.runner.process.jobdir import JOB_PACKAGES, REPO_ROOT, JobDir, LaunchFacts, build_environment
from tests.conftest import ROOT, wait_for
from tests.jobs.conftest import run_to_end

STUDIO_SIDE = ("django", "studio", "jobs", "datasets", "tuning", "hosting", "review")
# Imports every module, then reads a split stream channel: the record contract's path a
# module might reach only when called.
WALK = """
import importlib, json, pkgutil, sys
names = []
for package in ("trainyard", "algorithms"):
    root = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
from trainyard import data
records = list(data.iter_lines(sys.argv[1]))
print(json.dumps({"imported": names, "loaded": sorted(sys.modules), "records": len(records)}))
"""


def test_every_module_of_trainyard_and_algorithms_imports_without_the_studio(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(20)))
    (tmp_path / "channel").mkdir()
    (tmp_path / "channel" / "manifest.json").write_text(json.dumps({
        "format": "jsonl", "channel": "train", "split": {"train": 0.5, "test": 0.5, "seed": 3},
        "files": [{"path": "a.jsonl", "uri": (tmp_path / "a.jsonl").as_uri(), "split": True, "first_index": 0}]}))
    done = subprocess.run([sys.executable, "-c", WALK, str(tmp_path / "channel")], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "trainyard.records" in seen["imported"] and "algorithms.tabular" in seen["imported"]
    assert 0 < seen["records"] < 20
    studio_side = [name for name in seen["loaded"] if name.split(".")[0] in STUDIO_SIDE]
    assert studio_side == []


def test_a_jobs_python_path_is_its_code_and_links_to_trainyard_and_algorithms_only(tmp_path):
    job_dir = JobDir(tmp_path / "job")
    job_dir.create()
    job_dir.create()  # a second attempt in the same folder keeps the links
    facts = LaunchFacts(job_id=1, job_name="j", attempt=1, node_rank=0, hosts=["n0"], hyperparameters={},
                        channels={}, entry_point="train.py", num_gpus=0, num_cpus=1, redis_url="redis://x")

    path = build_environment(job_dir, facts, {"PYTHONPATH": str(REPO_ROOT)})["PYTHONPATH"].split(os.pathsep)

    assert path == [str(job_dir.code_dir), str(job_dir.packages_dir)]
    assert sorted(p.name for p in job_dir.packages_dir.iterdir()) == sorted(JOB_PACKAGES)
    for name in JOB_PACKAGES:
        link = job_dir.packages_dir / name
        assert link.is_symlink() and link.resolve() == REPO_ROOT / name
    assert not any(Path(entry).resolve() == REPO_ROOT for entry in path)


@pytest.mark.slow
def test_a_script_importing_app_code_fails_with_that_import_error_cold_and_warm(node, make_job):
    cold = run_to_end(make_job(script="import_app.py", keep_alive_seconds=120), timeout=120)
    wait_for(lambda: Node.objects.filter(pk=node.pk, state=NodeState.WARM).exists(), timeout=30,
             message="the node to turn warm")
    warm = run_to_end(make_job(script="import_app.py", keep_alive_seconds=120), timeout=120)

    assert not JobAttempt.objects.get(job=cold).warm_start and JobAttempt.objects.get(job=warm).warm_start
    for job in (cold, warm):
        assert job.status == JobStatus.FAILED
        assert "ModuleNotFoundError: No module named 'jobs'" in job.failure_reason, job.failure_reason
