"""trainyard.parallel's public API as a user's script drives it, without the studio: one script
(tests/parallel/scripts/user_api.py) launched by torch.distributed.run under each distribution
(none 1 process; ddp, fsdp, pipeline 2; a pipeline with ddp across 2 replicas, 4), each launch
running several checks and printing what it found as JSON. The same seeded model, the same
batches, so every distribution must train like the single process: data parallel ranks take
their half of each batch, pipeline stages the whole of it.

Checkpoints written under one distribution are resumed under others; the continued losses
must be the uninterrupted run's. The blocks a model is cut at, the Context's arithmetic and
init()'s checks of a hand-made environment run here, in the test process.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "parallel" / "scripts" / "user_api.py"
STEPS = 6  # the script's
SAVED_AT = 3
# Splitting a batch over ranks or microbatches only reorders float32 sums; six momentum-SGD
# steps keep the losses equal to ~1e-7. A wrong loss scale, a dropped microbatch or
# gradients left unaveraged move them by > 1e-2 from the second step on.
LOSS_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 1e-5
# What a training process reads; cleared so the developer's shell never leaks into a launch.
_JOB_VARIABLE = re.compile(r"^(SM_|TRAINYARD_|RANK$|WORLD_SIZE$|LOCAL_RANK$|LOCAL_WORLD_SIZE$|MASTER_)")
SEQUENTIAL_VARIANTS: list[dict[str, Any]] = [{"partition": "even"}, {"partition": [2, 3], "schedule": "1f1b"},
                                             {"partition": "auto", "schedule": "1f1b"}]


@dataclass
class Launch:
    """One torchrun launch of the script: its output and what rank 0 printed as RESULT."""

    returncode: int
    stdout: str
    stderr: str
    root: Path

    @property
    def results(self) -> dict[str, Any]:
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"no RESULT (exit {self.returncode})\n{self.stdout[-3000:]}\n{self.stderr[-5000:]}"
        return json.loads(lines[-1].removeprefix("RESULT "))

    def __getitem__(self, check: str) -> Any:
        found = self.results[check]
        assert "error" not in found, f"{check} raised:\n{found['error']}"
        return found

    def report(self, check: str, name: str) -> dict[str, Any]:
        return json.loads((self.root / "reports" / check / f"{name}.json").read_text())


def launch(root: Path, processes: int, distribution: dict[str, Any], checks: list[dict[str, Any]],
           timeout: float = 240) -> Launch:
    """torch.distributed.run in a new session (so a hung rank is killed with its launcher),
    one thread per process, the distribution as the runner sets it."""
    root.mkdir(parents=True, exist_ok=True)
    for check in checks:
        check.setdefault("reports", str(root / "reports" / check.get("as", check["check"])))
    env = {name: value for name, value in os.environ.items() if not _JOB_VARIABLE.match(name)}
    env.update({"TRAINYARD_DISTRIBUTION": json.dumps(distribution), "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               str(SCRIPT), json.dumps(checks)]
    process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{distribution} did not finish in {timeout} s\n{stdout[-3000:]}\n{stderr[-5000:]}")
    if process.returncode != 0 and "\nRESULT " in f"\n{stdout}":
        # Rank 0's results decide (ARCHITECTURE: gloo teardown); an abort after them is said, not hidden.
        warnings.warn(f"{distribution} exited {process.returncode} after printing its results: {stderr[-500:]}",
                      stacklevel=2)
    return Launch(process.returncode, stdout, stderr, root)


# --- the launches (each once per module) ---------------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Launch:
    root = tmp_path_factory.mktemp("fsdp")
    return launch(root, 2, {"kind": "fsdp"}, [
        {"check": "train", "save_at": SAVED_AT, "save_to": str(root / "checkpoints")},
        {"check": "accumulation"}, {"check": "activation_checkpointing"}, {"check": "context"},
        {"check": "shard_options"}])


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory) -> Launch:
    root = tmp_path_factory.mktemp("pipeline")
    return launch(root, 2, {"kind": "pipeline", "stages": 2, "microbatches": 4}, [
        {"check": "train", "save_at": SAVED_AT, "save_to": str(root / "checkpoints")},
        {"check": "sequential", "variants": SEQUENTIAL_VARIANTS}, {"check": "untraceable"}, {"check": "context"}])


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, fsdp_run) -> Launch:
    root = tmp_path_factory.mktemp("ddp")
    return launch(root, 2, {"kind": "ddp"}, [
        {"check": "train"}, {"check": "resume", "as": "resume_fsdp", "resume_from": str(fsdp_run.root / "checkpoints")},
        {"check": "accumulation"}])


@pytest.fixture(scope="module")
def replicated_pipeline_run(tmp_path_factory) -> Launch:
    root = tmp_path_factory.mktemp("pipeline-ddp")
    return launch(root, 4, {"kind": "pipeline", "stages": 2, "microbatches": 2, "ddp": True},
                  [{"check": "context"}, {"check": "train"}])


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, fsdp_run, pipeline_run) -> Launch:
    root = tmp_path_factory.mktemp("none")
    fsdp_checkpoints, own = str(fsdp_run.root / "checkpoints"), str(root / "checkpoints")
    return launch(root, 1, {"kind": "none"}, [
        {"check": "train", "save_at": SAVED_AT, "save_to": own}, {"check": "sequential"},
        {"check": "accumulation"}, {"check": "activation_checkpointing"}, {"check": "context"},
        {"check": "empty", "scratch": str(root)},
        {"check": "resume", "resume_from": own},
        {"check": "resume", "as": "resume_fsdp", "resume_from": fsdp_checkpoints},
        {"check": "resume", "as": "resume_pipeline", "resume_from": str(pipeline_run.root / "checkpoints")},
        {"check": "resume_without_hidden_metadata", "resume_from": fsdp_checkpoints, "scratch": str(root)},
        {"check": "wrong_architecture", "resume_from": fsdp_checkpoints}])


def assert_same_losses(found: list[float], expected: list[float]) -> None:
    assert len(found) == len(expected)
    for step, (value, reference) in enumerate(zip(found, expected, strict=True), start=1):
        assert value == pytest.approx(reference, rel=LOSS_TOLERANCE), (step, found, expected)


# --- one script, every distribution -----------------------------------------------------------------------
@pytest.mark.parametrize(("run", "kind", "api"), [
    ("ddp_run", "ddp", "DistributedDataParallel"), ("fsdp_run", "fsdp", "fully_shard"),
    ("pipeline_run", "pipeline", None), ("replicated_pipeline_run", "pipeline", None)])
def test_the_same_script_trains_like_one_process_under_every_distribution(request, single_run, run, kind, api):
    launched = request.getfixturevalue(run)
    expected = single_run["train"]["losses"]
    assert len(set(expected)) == STEPS  # six different batches: a stale or repeated step would show
    found = launched["train"]
    assert found["kind"] == kind and single_run["train"]["kind"] == "none"
    if api:
        assert found["report"]["api"] == api and found["report"]["world_size"] == 2
    assert_same_losses(found["losses"], expected)
    # model.evaluate after training: the trained models are the same too.
    assert found["evaluation"] == pytest.approx(single_run["train"]["evaluation"], rel=LOSS_TOLERANCE)
    assert launched.report("train", "parallel")["kind"] == kind


def test_a_pipeline_with_ddp_reports_its_replicas(replicated_pipeline_run):
    report = replicated_pipeline_run.report("train", "partition")
    assert (report["stages"], report["replicas"], report["microbatches"]) == (2, 2, 2)
    assert len(report["stage_layers"]) == 2


def test_a_sequential_pipelines_in_every_partition_and_schedule(single_run, pipeline_run):
    expected = single_run["sequential"]["{}"]["losses"]
    variants = pipeline_run["sequential"]
    assert set(variants) == {json.dumps(variant, sort_keys=True) for variant in SEQUENTIAL_VARIANTS}
    reports = {}
    for variant in SEQUENTIAL_VARIANTS:
        found = variants[json.dumps(variant, sort_keys=True)]
        assert_same_losses(found["losses"], expected)
        reports[json.dumps(variant["partition"])] = found["report"]
    assert reports['"even"']["stage_layers"] == [[0, 2], [3, 4]]
    assert reports["[2, 3]"]["stage_layers"] == [[0, 1], [2, 4]]
    assert (reports["[2, 3]"]["mode"], reports["[2, 3]"]["schedule"]) == ("manual", "1f1b")
    assert (reports['"auto"']["mode"], reports['"auto"']["schedule"]) == ("auto", "1f1b")
    assert reports['"even"']["schedule"] == "gpipe"
    assert reports["[2, 3]"]["layers"] == ["0", "1", "2", "3", "4"]


# --- checkpoints -------------------------------------------------------------------------------------------
def test_an_fsdp_checkpoint_resumes_in_one_process_and_under_ddp(single_run, ddp_run):
    uninterrupted = single_run["train"]["losses"]
    for launched in (single_run, ddp_run):
        resumed = launched["resume_fsdp"]
        assert (resumed["step"], resumed["epoch"]) == (SAVED_AT, SAVED_AT * 10)
        assert_same_losses(resumed["losses"], uninterrupted[SAVED_AT:])


def test_a_pipeline_checkpoint_resumes_in_one_process(single_run):
    resumed = single_run["resume_pipeline"]
    assert (resumed["step"], resumed["epoch"]) == (SAVED_AT, SAVED_AT * 10)
    assert_same_losses(resumed["losses"], single_run["train"]["losses"][SAVED_AT:])


def test_a_single_process_checkpoint_resumes_exactly(single_run):
    resumed = single_run["resume"]
    assert resumed["step"] == SAVED_AT
    assert resumed["losses"] == single_run["train"]["losses"][SAVED_AT:]


def test_a_step_folder_holds_every_ranks_part_and_a_visible_metadata(fsdp_run, pipeline_run, single_run):
    for launched, world_size, kind in ((fsdp_run, 2, "fsdp"), (pipeline_run, 2, "pipeline"), (single_run, 1, "none")):
        folder = launched.root / "checkpoints" / f"step-{SAVED_AT:09d}"
        parts = [f"__{rank}_0.distcp" for rank in range(world_size)]
        assert launched["train"]["files"] == {folder.name: sorted([".metadata", "metadata", "trainyard.json", *parts])}
        assert (folder / "metadata").read_bytes() == (folder / ".metadata").read_bytes()
        assert json.loads((folder / "trainyard.json").read_text()) == {"step": SAVED_AT, "world_size": world_size,
                                                                        "kind": kind}
        assert not list(folder.parent.glob(".step-*"))  # no partial folder left behind


def test_a_checkpoint_restored_without_its_hidden_metadata_still_loads(single_run):
    resumed = single_run["resume_without_hidden_metadata"]
    assert ".metadata" not in resumed["before"] and "metadata" in resumed["before"]
    assert resumed["step"] == SAVED_AT
    assert_same_losses(resumed["losses"], single_run["train"]["losses"][SAVED_AT:])


def test_load_without_a_checkpoint_returns_none(single_run):
    assert single_run["empty"] == {"step": None}


@pytest.mark.parametrize(("model", "differs"), [("wider", "embed.weight"), ("deeper", "blocks.4"),
                                                ("shallower", "blocks.3")])
def test_a_checkpoint_of_another_architecture_is_a_data_error_saying_it_does_not_fit(single_run, model, differs):
    found = single_run["wrong_architecture"][model]
    assert found.get("error_type") == "DataError", found
    assert f"checkpoint step-{SAVED_AT:09d} does not fit this model" in found["message"]
    assert differs in found["message"], found["message"]


# --- gradient accumulation, activation checkpointing -------------------------------------------------------
@pytest.mark.parametrize("run", ["single_run", "ddp_run", "fsdp_run"])
def test_gradient_accumulation_gives_the_gradients_of_the_whole_batch(request, run):
    found = request.getfixturevalue(run)["accumulation"]
    whole, accumulated = found["losses"]
    assert accumulated == pytest.approx(whole, rel=1e-6)
    assert found["largest_difference"] < GRADIENT_TOLERANCE


@pytest.mark.parametrize("run", ["single_run", "fsdp_run"])
def test_activation_checkpointing_recomputes_each_block_and_changes_no_gradient(request, run):
    found = request.getfixturevalue(run)["activation_checkpointing"]
    assert found["blocks"] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    assert found["calls"] == [1, 2]  # backward ran the block's forward again
    without, recomputed = found["losses"]
    assert recomputed == pytest.approx(without, rel=1e-6)
    assert found["largest_difference"] < GRADIENT_TOLERANCE


# --- a model torch.export cannot trace ------------------------------------------------------------------
def test_an_untraceable_model_under_a_pipeline_says_where_and_what_to_pass_instead(pipeline_run):
    found = pipeline_run["untraceable"]
    assert found["error_type"] == "DataError", found
    message = found["message"]
    assert message.startswith("pipeline: torch.export could not trace Branchy.forward")
    assert found["where"] == f"{SCRIPT}:{_line_of(SCRIPT, 'if x.sum() > 0:')}"
    assert f" at {found['where']} (if x.sum() > 0:)" in message, message
    assert "pass an nn.Sequential" in message


def _line_of(path: Path, text: str) -> int:
    (number,) = [index for index, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    return number


# --- reports -----------------------------------------------------------------------------------------------
def test_a_pipeline_reports_its_partition_predicted_and_measured(pipeline_run):
    report = pipeline_run.report("train", "partition")
    assert (report["mode"], report["stages"], report["schedule"], report["microbatches"]) == ("auto", 2, "gpipe", 4)
    assert report["layers"] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    (first, cut), (after, last) = report["stage_layers"]
    assert (first, after, last) == (0, cut + 1, 5) and 0 <= cut < 5
    assert len(report["predicted_ms"]) == 2 and all(value > 0 for value in report["predicted_ms"])
    assert report["balance_predicted"] == pytest.approx(max(report["predicted_ms"]) * 2 / sum(report["predicted_ms"]),
                                                        rel=1e-2)
    # model.measured() ran after training: every stage's own figure, in the report too.
    measured = pipeline_run["train"]["measured"]
    assert len(measured) == 2 and all(value > 0 for value in measured)
    assert report["measured_ms"] == [round(value, 3) for value in measured]
    assert report["balance_measured"] >= 1.0
    assert pipeline_run.report("train", "parallel") == {"kind": "pipeline", **report}


def test_an_fsdp_run_reports_fully_shard(fsdp_run):
    report = fsdp_run.report("train", "fsdp")
    assert {key: report[key] for key in ("api", "sharding", "backend", "world_size", "fallbacks", "cpu_offload")} == {
        "api": "fully_shard", "sharding": "FULL_SHARD", "backend": "gloo", "world_size": 2, "fallbacks": [],
        "cpu_offload": False}
    assert report["units"] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head", "(the whole model)"]


def test_shard_in_bf16_trains_close_and_cpu_offload_without_an_accelerator_falls_back_loudly(single_run, fsdp_run):
    expected = single_run["train"]["losses"]
    found = fsdp_run["shard_options"]
    bf16 = found["bf16"]
    assert (bf16["report"]["api"], bf16["report"]["param_dtype"], bf16["report"]["fallbacks"]) == (
        "fully_shard", "bfloat16", [])
    assert bf16["losses"] == pytest.approx(expected, rel=2e-2)  # bf16 keeps 8 bits of mantissa
    assert bf16["losses"] != pytest.approx(expected, rel=1e-6)  # and it did compute in bf16
    offload = found["cpu_offload"]
    (fallback,) = offload["report"]["fallbacks"]
    assert fallback.startswith("fully_shard did not run (") and fallback.endswith("); using DDP (replicated)")
    assert offload["report"]["api"] == "ddp" and f"fsdp fallback: {fallback}" in fsdp_run.stdout
    assert_same_losses(offload["losses"], expected)


# --- the process group --------------------------------------------------------------------------------
@pytest.mark.parametrize(("run", "stages", "replicas"), [
    ("single_run", 1, 1), ("fsdp_run", 1, 2), ("pipeline_run", 2, 1), ("replicated_pipeline_run", 2, 2)])
def test_init_is_idempotent_and_places_every_rank(request, run, stages, replicas):
    ranks = request.getfixturevalue(run)["context"]["ranks"]
    world_size = stages * replicas
    assert [rank["rank"] for rank in ranks] == list(range(world_size))
    for rank in ranks:
        assert rank["same"] and rank["reseeded"], rank  # init() again: the same Context, reseeded
        assert (rank["world_size"], rank["stages"], rank["replicas"]) == (world_size, stages, replicas)
        assert (rank["replica"], rank["stage"]) == divmod(rank["rank"], stages)
        assert rank["local_rank"] == rank["rank"] and rank["is_main"] == (rank["rank"] == 0)
        assert rank["backend"] == ("gloo" if world_size > 1 else None)
        assert rank["initialised"] == (world_size > 1)


@pytest.fixture
def fresh_context():
    import trainyard.parallel as tp

    tp.destroy()
    yield tp
    tp.destroy()


def test_a_context_counts_replicas_and_stages(fresh_context):
    import torch

    tp = fresh_context
    pipelined = {"kind": "pipeline", "stages": 2, "ddp": True}
    places = [tp.Context(rank=rank, world_size=4, local_rank=rank % 2, device=torch.device("cpu"), backend="gloo",
                         distribution=pipelined) for rank in range(4)]
    assert [(place.replicas, place.replica, place.stage, place.is_main) for place in places] == [
        (2, 0, 0, True), (2, 0, 1, False), (2, 1, 0, False), (2, 1, 1, False)]
    ddp = tp.Context(rank=3, world_size=4, local_rank=1, device=torch.device("cpu"), backend="gloo",
                     distribution={"kind": "ddp"})
    assert (ddp.stages, ddp.replicas, ddp.replica, ddp.stage) == (1, 4, 3, 0)


def test_init_without_a_launcher_is_one_process_and_idempotent(fresh_context):
    tp = fresh_context
    ctx = tp.init(environ={})
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.kind, ctx.is_main) == (0, 1, None, "none", True)
    assert tp.init(environ={"WORLD_SIZE": "2", "RANK": "1"}) is ctx  # later calls: the same Context
    assert tp.current() is ctx


@pytest.mark.parametrize(("environ", "message"), [
    ({"WORLD_SIZE": "4", "RANK": "4"}, "RANK 4 is outside WORLD_SIZE 4"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be a whole number, got 'two'"),
    ({"WORLD_SIZE": "4", "RANK": "0", "TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "stages": 3}'},
     "pipeline: 3 stages do not divide 4 processes"),
    ({"WORLD_SIZE": "4", "RANK": "0", "TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "stages": 2}'},
     'needs "ddp": true'),
])
def test_init_refuses_an_environment_it_cannot_run(fresh_context, environ, message):
    import torch

    from trainyard.errors import DataError
    from trainyard.parallel import context

    with pytest.raises(DataError, match=re.escape(message)):
        fresh_context.init(environ=environ)
    assert context._current is None and not torch.distributed.is_initialized()  # nothing kept, no group


# --- the blocks a model is cut at ----------------------------------------------------------------------------
def _out_of_order_model():
    import torch
    from torch import nn

    class OutOfOrder(nn.Module):
        """Defined head first, called embed first; `unused` never runs; `shared` runs twice."""

        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(8, 3)
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
            self.unused = nn.Linear(8, 8)
            self.shared = nn.Linear(8, 8)
            self.middle = nn.Linear(8, 8)
            self.embed = nn.Embedding(10, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            x = self.layers[1](x)
            x = self.layers[0](x)
            x = self.shared(x)
            x = self.middle(x)
            x = self.shared(x)
            return self.head(x)

    return OutOfOrder(), (torch.zeros(2, 4, dtype=torch.long),)


def test_blocks_come_in_the_order_forward_calls_them():
    from trainyard.parallel import blocks

    model, example = _out_of_order_model()
    units = blocks.candidates(model)
    assert [unit.name for unit in units] == ["head", "layers.0", "layers.1", "unused", "shared", "middle", "embed"]
    ordered = blocks.execution_order(model, units, example)
    # unused dropped; shared called twice: it and what ran between its calls are one block.
    assert [unit.name for unit in ordered] == ["embed", "layers.1", "layers.0", "shared+middle", "head"]
    merged = ordered[3].module
    assert [module for name, module in merged.named_modules() if name.count(".") == 1] == [model.shared, model.middle]
    assert ordered[0].module is model.embed and ordered[-1].module is model.head


def test_a_sequential_s_blocks_are_its_items_and_named_blocks_are_checked():
    from torch import nn

    from trainyard.parallel import blocks

    sequential = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    assert [(unit.name, unit.module) for unit in blocks.candidates(sequential)] == [
        ("0", sequential[0]), ("1", sequential[1]), ("2", sequential[2])]
    model, _ = _out_of_order_model()
    named = blocks.named(model, ["embed", model.layers[1], "head"])
    assert [unit.name for unit in named] == ["embed", "layers.1", "head"]
    with pytest.raises(ValueError, match="the model has no submodule 'nowhere'"):
        blocks.named(model, ["nowhere"])
    with pytest.raises(ValueError, match="Linear is not a submodule of the model"):
        blocks.named(model, [nn.Linear(2, 2)])


def test_wrap_checkpoints_the_blocks_it_is_given(fresh_context):
    import torch

    tp = fresh_context
    tp.init(environ={})
    model, (ids,) = _out_of_order_model()
    wrapped = tp.wrap(model, distribution="none", checkpoint_activations=True, blocks=["layers.1", model.middle])
    assert wrapped.report["activation_checkpointing"] == ["layers.1", "middle"]
    loss = wrapped.step(ids, torch.zeros(2, 4, dtype=torch.long))
    assert loss.shape == () and model.middle.weight.grad is not None
    assert wrapped.evaluate(ids, torch.zeros(2, 4, dtype=torch.long)) == pytest.approx(float(loss), rel=1e-6)


# --- the package's names ---------------------------------------------------------------------------------
def test_the_public_names_stay_what_they_name_after_their_modules_are_imported():
    """`tp.wrap` must stay the function after anything (tp.Parallel, a second tp.wrap,
    `import trainyard.parallel.forms`) has imported the modules."""
    import importlib

    import trainyard.parallel as tp

    for name in tp.__all__:
        getattr(tp, name)
    importlib.import_module("trainyard.parallel.forms")
    for name in tp.__all__:
        value = getattr(tp, name)
        assert not inspect.ismodule(value), f"trainyard.parallel.{name} is the module {value.__name__}"
        assert value is getattr(importlib.import_module(value.__module__), name)
