"""char-lm as a two-stage pipeline, launched as the runner launches it (torch.distributed.run,
two processes, a SageMaker job directory, TRAINYARD_DISTRIBUTION=pipeline): it trains like
the unsplit model, reports its partition, checkpoints and resumes, and saves a model that
serves like any other.

The data leave a last batch of 3 windows: it cannot split into 4 equal microbatches, so it
runs as 3, and the loss still matches the unsplit model's."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.algorithms.test_algorithms import JobDir, RunResult, assert_ok, run_in_process, run_torchrun, weights

# Small enough for two cores; dropout 0 so the two runs draw nothing differently.
HYPERPARAMETERS = {"epochs": 1, "context_length": 16, "embedding_dim": 32, "heads": 2, "layers": 2, "batch_size": 16,
                   "log_every_steps": 5, "dropout": 0}
TRAIN_WINDOWS = 499  # 31 batches of 16 and one of 3
# Per logged point (the mean loss over 5 steps, printed to 6 significant digits). Cutting a
# batch into microbatches only changes the order of float32 sums (one loss per microbatch,
# scaled by the whole batch's token count, so the gradients are the batch's); over 32 AdamW
# steps the two runs have stayed equal to the printed digits. 1e-4 leaves room for other
# BLAS builds while still catching any real difference (a wrong loss scale, a dropped
# microbatch, gradients left to accumulate across steps all move the loss by > 1e-2).
LOSS_TOLERANCE = 1e-4
REPORT_KEYS = {"mode", "stages", "schedule", "microbatches", "layers", "stage_layers", "predicted_ms", "measured_ms",
               "balance_predicted", "balance_measured", "memory_mb", "memory_cap_mb", "notes"}


class DistributedJob(JobDir):
    """A job directory whose processes also get the job's distribution, as the runner sets it."""

    def __init__(self, root: Path, hyperparameters: dict, distribution: str = "none", pipeline: dict | None = None) -> None:
        super().__init__(root, hyperparameters)
        self.distribution, self.pipeline = distribution, dict(pipeline or {})

    report_dir = property(lambda self: self.output / "report")

    def env(self, **options: int) -> dict[str, str]:
        return {**super().env(**options), "TRAINYARD_DISTRIBUTION": self.distribution,
                "TRAINYARD_PIPELINE": json.dumps(self.pipeline), "TRAINYARD_REPORT_DIR": str(self.report_dir)}

    def report(self, name: str) -> dict:
        return json.loads((self.report_dir / f"{name}.json").read_text())


def char_lm_job(root: Path, distribution: str = "none", pipeline: dict | None = None, **overrides) -> DistributedJob:
    from datasets.demo import generate_text

    job = DistributedJob(root, {**HYPERPARAMETERS, **overrides}, distribution, pipeline)
    rng = random.Random(5)
    text = generate_text(TRAIN_WINDOWS * HYPERPARAMETERS["context_length"] + 400, rng)
    (job.channel("train") / "a.txt").write_text(text[:TRAIN_WINDOWS * HYPERPARAMETERS["context_length"] + 1])
    (job.channel("validation") / "b.txt").write_text(generate_text(1_500, rng))
    return job


def losses(result: RunResult, name: str = "train_loss") -> dict[int, float]:
    points = result.metric("char-lm", name)
    by_step = dict(points)
    # Every rank logs the same figure (the last stage broadcasts it).
    assert all(by_step[step] == value for step, value in points), points
    return by_step


def assert_same_losses(found: dict[int, float], expected: dict[int, float]) -> None:
    assert found.keys() == expected.keys()
    for step, value in expected.items():
        assert found[step] == pytest.approx(value, rel=LOSS_TOLERANCE), (step, found[step], value)


@pytest.fixture(scope="module")
def unsplit(tmp_path_factory) -> tuple[DistributedJob, RunResult]:
    job = char_lm_job(tmp_path_factory.mktemp("unsplit"))
    result = run_in_process(job, "algorithms.charlm")
    assert_ok(result)
    return job, result


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory) -> tuple[DistributedJob, RunResult]:
    job = char_lm_job(tmp_path_factory.mktemp("pipelined"), "pipeline", {"stages": 2, "microbatches": 4})
    result = run_torchrun(job, "algorithms.charlm", processes=2)
    assert_ok(result)
    return job, result


def test_two_stage_pipeline_trains_like_the_unsplit_model(unsplit, pipelined):
    (_, whole), (_, split) = unsplit, pipelined
    assert "pipeline stage 0/2: layers 0.." in split.stdout and "pipeline stage 1/2: layers " in split.stdout
    expected = losses(whole)
    assert sorted(expected) == [5, 10, 15, 20, 25, 30, 32]
    assert_same_losses(losses(split), expected)
    assert losses(split, "validation_loss")[32] == pytest.approx(losses(whole, "validation_loss")[32], rel=LOSS_TOLERANCE)
    assert split.stdout.count("wrote ") == 1  # model/ from rank 0 only


def test_the_auto_partition_report_has_the_documented_shape(pipelined):
    job, _ = pipelined
    report = job.report("partition")
    assert set(report) == REPORT_KEYS
    assert (report["mode"], report["stages"], report["schedule"], report["microbatches"]) == ("auto", 2, "gpipe", 4)
    assert report["layers"] == ["embedding", "block 1", "block 2", "head"]
    (first, cut), (after, last) = report["stage_layers"]
    assert first == 0 and after == cut + 1 and last == 3
    assert len(report["predicted_ms"]) == len(report["measured_ms"]) == len(report["memory_mb"]) == 2
    assert all(value > 0 for value in report["predicted_ms"] + report["measured_ms"] + report["memory_mb"])
    assert report["balance_predicted"] == pytest.approx(max(report["predicted_ms"]) * 2 / sum(report["predicted_ms"]), rel=1e-3)
    assert report["balance_measured"] >= 1.0 and report["memory_cap_mb"] is None
    assert "a batch of 3 records does not split into 4 equal microbatches: it ran as 3" in report["notes"]


def test_the_pipelined_model_is_whole_and_serves(unsplit, pipelined):
    import torch

    from algorithms.predict import load_predictor

    (whole_job, _), (job, _) = unsplit, pipelined
    config = json.loads((job.model / "config.json").read_text())
    assert config["distribution"] == "pipeline" and config["world_size"] == 2
    saved, reference = weights(job.model), weights(whole_job.model)
    assert saved.keys() == reference.keys()
    # Same training, other float order: AdamW's step turns a tiny gradient difference into
    # at most a fraction of a learning rate (0.003) per weight.
    assert max(float((saved[name] - reference[name]).abs().max()) for name in saved) < 3e-3
    predictor = load_predictor(job.model)
    text = predictor.generate("The old train", max_new_tokens=20, temperature=0.8, seed=3)
    assert len(text) == 20 and set(text) <= set(config["input"]["vocabulary"])
    with torch.no_grad():
        ids = torch.randint(1, config["architecture"]["vocabulary_size"], (2, 16))
        assert predictor.model(ids).shape == (2, 16, config["architecture"]["vocabulary_size"])


def test_even_1f1b_pipeline_resumes_from_its_checkpoint(tmp_path, unsplit, pipelined):
    """Interrupted at step 20, run again: it keeps its checkpoint's partition and ends where
    an uninterrupted run does."""
    (_, whole), (finished, _) = unsplit, pipelined
    settings = {"stages": 2, "microbatches": 4, "schedule": "1f1b", "partition": "even"}
    job = char_lm_job(tmp_path / "job", "pipeline", settings, max_steps=20)
    first = run_torchrun(job, "algorithms.charlm", processes=2, checkpoint_every_steps=10)
    assert_ok(first)
    report = job.report("partition")
    assert set(report) == REPORT_KEYS
    assert (report["mode"], report["schedule"], report["stage_layers"]) == ("even", "1f1b", [[0, 1], [2, 3]])
    assert [path.name for path in sorted(job.checkpoints.iterdir())] == ["checkpoint-000000010.pt", "checkpoint-000000020.pt"]

    job.hyperparameters.pop("max_steps")
    job.pipeline["partition"] = [1, 3]  # a changed setting does not move layers away from their optimizer state
    resumed = run_torchrun(job, "algorithms.charlm", processes=2, checkpoint_every_steps=10)
    assert_ok(resumed)
    assert "resumed from checkpoint step 20" in resumed.stdout
    expected = losses(whole)
    assert_same_losses({**losses(first), **losses(resumed)}, expected)
    assert min(losses(resumed)) == 25
    report = job.report("partition")
    assert report["stage_layers"] == [[0, 1], [2, 3]]
    assert any("resumed from checkpoint step 20" in note for note in report["notes"])
    # A stage's numbers do not depend on where the cut is, nor on the schedule: the result
    # is the auto, GPipe run's.
    saved, reference = weights(job.model), weights(finished.model)
    assert max(float((saved[name] - reference[name]).abs().max()) for name in saved) < 1e-5


def test_a_memory_cap_no_partition_fits_fails_naming_the_cap(tmp_path):
    job = char_lm_job(tmp_path / "job", "pipeline", {"stages": 2, "microbatches": 2, "memory_cap_mb": 1},
                      embedding_dim=64, context_length=64, batch_size=64)
    result = run_torchrun(job, "algorithms.charlm", processes=2)
    assert result.returncode != 0
    assert result.failure is not None
    assert "into 2 stages fits memory_cap_mb=1" in result.failure and "raise memory_cap_mb to at least" in result.failure


def test_a_pipeline_needs_one_process_per_stage(tmp_path):
    job = char_lm_job(tmp_path / "job", "pipeline", {"stages": 2})
    result = run_in_process(job, "algorithms.charlm")
    assert result.returncode == 2
    assert result.failure == "pipeline: 2 stages need 2 processes (one per stage), but WORLD_SIZE is 1\n"


def test_an_algorithm_refuses_a_distribution_it_does_not_support(tmp_path):
    from tests.algorithms.test_algorithms import write_small_tabular

    job = DistributedJob(tmp_path / "job", {"epochs": 1}, "pipeline", {"stages": 2})
    write_small_tabular(job.channel("train"), "train.csv", 40, seed=1)
    result = run_in_process(job, "algorithms.tabular")
    assert result.returncode == 2
    assert result.failure == ("tabular-classifier does not support distribution 'pipeline'; it supports none, ddp\n")
