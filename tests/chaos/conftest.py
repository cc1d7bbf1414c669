"""Chaos tests: a real simulated studio (tests/cluster.py) with parts of it killed mid-job."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from datasets.storage import default_store, object_uri
from jobs.models import JobEvent, JobStatus, TrainingJob
from tests.cluster import INSTANCE_TYPE, cluster, cluster_processes  # noqa: F401 - package-scoped here: the cluster runs for this package only

SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB_SCRIPTS = Path(__file__).resolve().parents[1] / "jobs" / "scripts"


@pytest.fixture
def submit(project) -> Callable[..., TrainingJob]:
    """submit(script, hyperparameters=..., **fields) → a Pending job for the cluster's
    "sim" nodes; the cluster's own scheduler (beat, every 2 s) starts it."""

    def make(script: str, *, instance_count: int = 1, **fields) -> TrainingJob:
        uri = object_uri(f"scripts/{project.slug}/chaos/{script}")
        source = SCRIPTS / script if (SCRIPTS / script).exists() else JOB_SCRIPTS / script
        default_store().put_file(source, uri)
        job = TrainingJob.objects.create(
            project=project, name=fields.pop("name", f"chaos-{uuid.uuid4().hex[:6]}"), script_uri=uri,
            entry_point=script,
            resources={"instance_type": INSTANCE_TYPE, "instance_count": instance_count, "processes_per_node": 1},
            **fields)
        job.output_uri = object_uri(f"jobs/{job.pk}")
        job.save(update_fields=["output_uri"])
        JobEvent.objects.create(job=job, status=JobStatus.PENDING, message="Submitted")
        return job

    return make
