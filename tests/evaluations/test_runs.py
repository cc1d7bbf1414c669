"""Evaluations of the other kinds and the run's own robustness: a char-lm's perplexity as
its training measured it, an image folder's classes, isotonic steps offered only from
1,000 calibration items, and a run whose worker died requeued and finished."""

from __future__ import annotations

import csv
import json
import random
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from datasets.actions import VersionOptions, register_local_files
from datasets.storage import object_uri
from datasets.validation_run import run_validation
from evaluations.actions import calibrate_model_version, requeue_stalled_evaluations, submit_evaluation
from evaluations.models import Evaluation
from hosting.actions import create_endpoint, register_model
from jobs.models import JobStatus, TrainingJob
from tests.evaluations.conftest import evaluate


def _trained(tmp_path: Path, module: str, hyperparameters: dict, write) -> Path:
    from tests.algorithms.test_algorithms import JobDir, assert_ok, run_in_process

    job = JobDir(tmp_path / "job", hyperparameters)
    write(job)
    result = run_in_process(job, module)
    assert_ok(result)
    return job.model


def _version_of(project, owner, model_dir: Path, name: str, algorithm: str):
    from jobs.runner.artifacts import upload_archive

    uri = object_uri(f"tests/{name}/model.tar.gz")
    upload_archive(model_dir, uri)
    config = json.loads((model_dir / "config.json").read_text())
    job = TrainingJob.objects.create(project=project, name=name, algorithm=algorithm, status=JobStatus.COMPLETED,
                                     model_uri=uri, final_metrics=config.get("metrics", {}), created_by=owner)
    return register_model(project=project, name=name, job=job, user=owner), config


def _register(project, owner, name: str, files: dict[str, Path], **options):
    version, _ = register_local_files(project=project, name=name, description="", user=owner, files=files,
                                      options=VersionOptions(**options))
    assert run_validation(version.pk) == "ready"
    version.refresh_from_db()
    return version


def test_a_char_lm_gets_the_perplexity_its_training_measured(project, owner, tmp_path):
    from datasets.demo import generate_text

    rng = random.Random(5)
    validation_text = generate_text(3_000, rng)

    def write(job):
        (job.channel("train") / "a.txt").write_text(generate_text(20_000, rng))
        (job.channel("validation") / "b.txt").write_text(validation_text)

    model_dir = _trained(tmp_path, "algorithms.charlm", {"epochs": 1, "context_length": 32, "embedding_dim": 16,
                                                          "heads": 2, "batch_size": 32, "log_every_steps": 50}, write)
    version, config = _version_of(project, owner, model_dir, "writer", "char-lm")
    text = tmp_path / "held.txt"
    text.write_text(validation_text)
    data = _register(project, owner, "prose", {"held.txt": text}, format="text")
    evaluation = evaluate(project, owner, version, data)
    assert evaluation.status == "Completed", evaluation.failure_reason
    report = evaluation.report
    assert report["perplexity"] == pytest.approx(config["metrics"]["validation_perplexity"], rel=1e-4)
    assert report["bits_per_character"] == pytest.approx(__import__("math").log2(report["perplexity"]))
    assert evaluation.proposal == {} and evaluation.calibration == {}


def test_an_image_folder_is_evaluated_by_its_class_folders(project, owner, tmp_path):
    from tests.algorithms.test_algorithm_kinds import write_shapes

    def write(job):
        write_shapes(job.channel("train"), 30, seed=1, prefix="train")

    model_dir = _trained(tmp_path, "algorithms.image", {"epochs": 4, "batch_size": 16, "width": 8,
                                                         "log_every_steps": 50}, write)
    version, _ = _version_of(project, owner, model_dir, "shapes", "image-classifier")
    held = write_shapes(tmp_path / "held", 40, seed=9, prefix="test")
    data = _register(project, owner, "shapes-held", {str(p.relative_to(tmp_path / "held")): p for p in held},
                     format="image_folder")
    evaluation = evaluate(project, owner, version, data, channel="test", target_error=0.2)
    assert evaluation.status == "Completed", evaluation.failure_reason
    assert evaluation.report["n"] == 120
    assert [row["support"] for row in evaluation.report["per_class"]] == [40, 40, 40]


def test_isotonic_steps_need_a_thousand_calibration_items(owner, project, model_version, completed_evaluation, tmp_path,
                                                          demo_model_artifact):
    from datasets.demo import tabular_records
    from evaluations.actions import EvaluationError
    from tests.hosting.conftest import features

    with pytest.raises(EvaluationError) as refused:
        calibrate_model_version(model_version, {"evaluation": completed_evaluation.pk, "method": "isotonic"})
    assert refused.value.field == "method" and "1000" in refused.value.message
    rows = tabular_records(2100, seed=31, label_noise=0.0)
    path = tmp_path / "gold.csv"
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    gold = _register(project, owner, "gold", {"gold.csv": path}, format="csv", label_column="label")
    evaluation = evaluate(project, owner, model_version, gold)
    assert evaluation.status == "Completed", evaluation.failure_reason
    isotonic = evaluation.calibration["isotonic"]
    assert evaluation.calibration["calibration_items"] == 1050 and isotonic["after"]["accuracy"] > 0.9
    calibrate_model_version(model_version, {"evaluation": evaluation.pk, "method": "isotonic"})
    endpoint = create_endpoint(project=project, name="biomes-isotonic", model_version=model_version, user=owner)
    from hosting.invocation import endpoint_for_invocation, invoke

    instances = [features(row) for row in rows[:50]]
    served = invoke(endpoint_for_invocation(owner, endpoint.name), instances)
    assert served["calibrated"] is True and served["calibration"]["method"] == "isotonic"
    for prediction in served["predictions"]:
        assert sum(prediction["probabilities"].values()) == pytest.approx(1.0)
        assert prediction["confidence"] == prediction["probabilities"][prediction["label"]]


def test_a_run_whose_worker_died_is_requeued_and_finishes(owner, project, model_version, demo_version):
    evaluation = submit_evaluation(project=project, user=owner, body={
        "model_version": model_version.pk, "dataset_version": demo_version.pk, "target_error": 0.1})
    # The worker claimed it and died: Running, its last heartbeat long ago.
    Evaluation.objects.filter(pk=evaluation.pk).update(status="Running", heartbeat_at=timezone.now() - timedelta(minutes=5))
    from studio.celery import app

    app.conf.task_always_eager = True
    try:
        assert requeue_stalled_evaluations() == [evaluation.pk]
    finally:
        app.conf.task_always_eager = False
    evaluation.refresh_from_db()
    assert evaluation.status == "Completed" and evaluation.records_done == 600
    assert requeue_stalled_evaluations() == []
