"""Evaluations of the demo tabular model (trained for real once per session by
tests/hosting/conftest.py) on the 600 held-out rows it never saw."""

from __future__ import annotations

import pytest

from evaluations.actions import submit_evaluation
from evaluations.models import Evaluation
from evaluations.run import run_evaluation
from hosting.actions import register_model
from tests.hosting.conftest import (  # noqa: F401 - fixtures
    demo_job,
    demo_model_artifact,
    demo_version,
    fresh_predictors,
    make_flow,
    model_cache_dir,
)


@pytest.fixture
def model_version(project, owner, demo_job):  # noqa: F811 - the imported fixture
    return register_model(project=project, name="biomes", job=demo_job, user=owner)


def evaluate(project, owner, model_version, dataset_version, **body) -> Evaluation:
    """Submit and run in this process (the control worker's code, without the broker)."""
    evaluation = submit_evaluation(project=project, user=owner, body={
        "model_version": model_version.pk, "dataset_version": dataset_version.pk, **body})
    run_evaluation(evaluation.pk)
    evaluation.refresh_from_db()
    return evaluation


@pytest.fixture
def completed_evaluation(project, owner, model_version, demo_version) -> Evaluation:  # noqa: F811
    evaluation = evaluate(project, owner, model_version, demo_version, target_error=0.1)
    assert evaluation.status == "Completed", evaluation.failure_reason
    return evaluation
