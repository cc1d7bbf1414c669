"""The demo tabular model, trained for real once per session (the demo dataset's recipe,
a slice of it, three epochs, in-process: the same code the runner launches) and stored as
the runner stores it (model/ tarred into the object store); per test, a Completed job in
project acme that points at it, and a ready dataset version to predict on."""

from __future__ import annotations

import csv
import json
from itertools import islice
from pathlib import Path

import pytest

from datasets.actions import VersionOptions, register_local_files
from datasets.storage import object_uri
from datasets.validation_run import run_validation
from hosting import serving
from jobs.models import JobInput, JobStatus, TrainingJob
from review.models import FlowDefinition, WorkTeam

TRAIN_ROWS = 1500
HELD_ROWS = 600
HYPERPARAMETERS = {"epochs": 3, "batch_size": 64, "log_every_steps": 50, "label_column": "label", "seed": 3}


def _head(source: Path, target: Path, rows: int) -> None:
    with open(source, newline="") as inp, open(target, "w", newline="") as out:
        out.writelines(islice(inp, rows + 1))


@pytest.fixture(scope="session")
def demo_model_artifact(isolated_storage, tmp_path_factory) -> dict:
    from datasets.demo import write_tabular
    from jobs.runner.artifacts import upload_archive
    from tests.algorithms.test_algorithms import JobDir, assert_ok, run_in_process

    root = tmp_path_factory.mktemp("demo-model")
    demo = root / "demo"
    demo.mkdir()
    files = write_tabular(demo)
    job = JobDir(root / "job", HYPERPARAMETERS)
    _head(files["train.csv"], job.channel("train") / "train.csv", TRAIN_ROWS)
    _head(files["validation.csv"], job.channel("validation") / "validation.csv", 300)
    assert_ok(run_in_process(job, "algorithms.tabular"))
    uri = object_uri("tests/demo-tabular/model.tar.gz")
    upload_archive(job.model, uri)
    held = root / "held.csv"  # validation rows the model never saw: what the tests predict on
    with open(files["validation.csv"], newline="") as inp:
        reader = csv.reader(inp)
        rows = [next(reader)] + list(islice(reader, 300, 300 + HELD_ROWS))
    with open(held, "w", newline="") as out:
        csv.writer(out).writerows(rows)
    config = json.loads((job.model / "config.json").read_text())
    return {"uri": uri, "metrics": config["metrics"], "held_csv": held, "model_dir": job.model}


@pytest.fixture(scope="session", autouse=True)
def model_cache_dir(tmp_path_factory):
    """Extracted artifacts go under the session's tmp, not the checkout's var/."""
    from django.test import override_settings

    override = override_settings(STUDIO_MODEL_CACHE_DIR=str(tmp_path_factory.mktemp("model-cache")))
    override.enable()
    yield
    override.disable()


@pytest.fixture(autouse=True)
def fresh_predictors():
    serving.clear_cache()
    yield
    serving.clear_cache()


def held_rows(artifact: dict) -> list[dict]:
    with open(artifact["held_csv"], newline="") as inp:
        return list(csv.DictReader(inp))


def features(row: dict) -> dict:
    return {name: value for name, value in row.items() if name != "label"}


@pytest.fixture
def demo_version(project, owner, demo_model_artifact):
    version, _ = register_local_files(project=project, name="demo-held-out", description="", user=owner,
                                      files={"held.csv": demo_model_artifact["held_csv"]},
                                      options=VersionOptions(format="csv", label_column="label"))
    assert run_validation(version.pk) == "ready"
    version.refresh_from_db()
    return version


@pytest.fixture
def demo_job(project, owner, demo_model_artifact, demo_version) -> TrainingJob:
    job = TrainingJob.objects.create(
        project=project, name="demo-tabular", algorithm="tabular-classifier", status=JobStatus.COMPLETED,
        model_uri=demo_model_artifact["uri"], final_metrics=demo_model_artifact["metrics"],
        hyperparameters=HYPERPARAMETERS, created_by=owner)
    JobInput.objects.create(job=job, channel="train", dataset_version=demo_version)
    return job


def make_flow(project, user, *, confidence_below: float | None = 0.8, sample_percent: float = 0.0,
              name: str = "check-uncertain") -> FlowDefinition:
    team, _ = WorkTeam.objects.get_or_create(project=project, name="labellers", defaults={"created_by": user})
    team.members.add(user)
    return FlowDefinition.objects.create(
        project=project, name=name, work_team=team, labels=["alpine", "coastal", "desert"], title="Which biome?",
        task_count=1, activation={"confidence_below": confidence_below, "sample_percent": sample_percent,
                                  "combine": "any"}, created_by=user)
