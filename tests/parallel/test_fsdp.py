"""char-lm with distribution "fsdp" (fully_shard over gloo, two processes): it trains like DDP,
checkpoints and resumes the full state, saves a whole model that serves, says what ran in
its `fsdp` report, and falls back loudly where sharding cannot run."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.algorithms.test_algorithms import RunResult, assert_ok, run_in_process, run_torchrun, weights
from tests.parallel.test_pipeline import char_lm_job

# Sharding changes how gradients are averaged (reduce-scatter instead of all-reduce), not
# what they are: the same float32 figures summed in another order.
LOSS_TOLERANCE = 1e-4


def losses_by_rank(result: RunResult) -> dict[int, list[float]]:
    """step → both ranks' train_loss (each rank logs its own half of the batch), sorted."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for step, value in result.metric("char-lm", "train_loss"):
        by_step[step].append(value)
    return {step: sorted(values) for step, values in by_step.items()}


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    job = char_lm_job(tmp_path_factory.mktemp("ddp"), "ddp")
    result = run_torchrun(job, "algorithms.charlm", processes=2)
    assert_ok(result)
    return job, result


def test_fsdp_trains_like_ddp_resumes_and_saves_the_whole_model(tmp_path, replicated):
    import torch

    from algorithms.predict import load_predictor
    from trainyard import checkpoints

    ddp_job, ddp = replicated
    job = char_lm_job(tmp_path / "job", "fsdp", max_steps=10)
    first = run_torchrun(job, "algorithms.charlm", processes=2, checkpoint_every_steps=5)
    assert_ok(first)
    assert "fsdp fallback" not in first.stdout
    report = job.report("fsdp")
    assert {key: report[key] for key in ("api", "sharding", "backend", "world_size", "fallbacks")} == {
        "api": "fully_shard", "sharding": "FULL_SHARD", "backend": "gloo", "world_size": 2, "fallbacks": []}

    # The checkpoint holds the full, unsharded state, in the format of an unsharded run.
    step, path = checkpoints.latest_checkpoint(job.checkpoints)
    state = checkpoints.load_checkpoint(path)
    assert step == 10 and state["algorithm"] == "char-lm"
    reference = weights(ddp_job.model)
    assert {name: tuple(value.shape) for name, value in state["model"].items()} == {
        name: tuple(value.shape) for name, value in reference.items()}
    assert set(state["optimizer"]["state"]) == set(reference)  # a full AdamW state per parameter

    job.hyperparameters.pop("max_steps")
    resumed = run_torchrun(job, "algorithms.charlm", processes=2, checkpoint_every_steps=5)
    assert_ok(resumed)
    assert "resumed from checkpoint step 10" in resumed.stdout
    expected, found = losses_by_rank(ddp), {**losses_by_rank(first), **losses_by_rank(resumed)}
    assert found.keys() == expected.keys() and max(expected) == 16  # 499 windows / 2 ranks / 16
    for step, values in expected.items():
        assert found[step] == pytest.approx(values, rel=LOSS_TOLERANCE), step
    assert resumed.metric("char-lm", "validation_loss")[-1][1] == pytest.approx(
        ddp.metric("char-lm", "validation_loss")[-1][1], rel=LOSS_TOLERANCE)

    saved = weights(job.model)
    assert saved.keys() == reference.keys()
    assert max(float((saved[name] - reference[name]).abs().max()) for name in saved) < 3e-3
    predictor = load_predictor(job.model)
    assert predictor.config["distribution"] == "fsdp"
    assert len(predictor.generate("The", max_new_tokens=10, temperature=0)) == 10
    with torch.no_grad():
        assert predictor.model(torch.ones(1, 4, dtype=torch.long)).shape[-1] == predictor.config["architecture"]["vocabulary_size"]


def test_fsdp_on_one_process_falls_back_loudly(tmp_path):
    job = char_lm_job(tmp_path / "job", "fsdp", max_steps=3)
    result = run_in_process(job, "algorithms.charlm")
    assert_ok(result)
    line = ("fsdp fallback: sharding did not run (a single process has no process group to shard over); "
            "using the whole model on one process, unsharded")
    assert line in result.stdout.splitlines()
    report = job.report("fsdp")
    assert (report["api"], report["sharding"], report["fallbacks"]) == ("none", "NO_SHARD", [line.removeprefix("fsdp fallback: ")])
    assert (job.model / "model.safetensors").exists()
