#!/usr/bin/env python
"""What one CUDA machine shows of trainyard.parallel, each figure beside a baseline measured
in the same run. `bench/gpu_check.sh` runs it (a header, a global timeout); without CUDA it
says so and exits 0.

    bash bench/gpu_check.sh                          # CUDA: the whole check, in under 8 minutes
    python bench/gpu_check.py --device cpu --quick   # the same code on CPU and gloo, tiny sizes

The model is a user's own module (not a Sequential): an embedding, six residual MLP blocks of
uneven width (matmul-heavy, so bf16 shows) and a head over the vocabulary.
1. wrap(): DDP, FSDP (float32; with 2+ processes also bf16 mixed precision) and a pipeline,
   each launched as a job's processes are (python -m torch.distributed.run --standalone, one
   process per GPU, NCCL; gloo on CPU); the median step, samples/s, what ran (the report's
   api, fallbacks) and each rank's peak memory from model.measured(). With one GPU, DDP and
   FSDP run as one process (their reports say so) and the pipeline tries two processes on the
   one GPU (init() maps local ranks onto the GPUs present); NCCL refuses two ranks on one
   GPU, and the check says so rather than failing.
2. One device, in this process: bf16 mixed precision (torch.autocast around model.step)
   against float32 (TF32 off); activation checkpointing (wrap(checkpoint_activations=True))
   against none: what a step holds for backward (CUDA: peak allocated during the step above
   what it started with; both: the bytes of the tensors autograd saved) and its time.
3. The partitioner's profile on this device: each block's forward+backward ms as
   trainyard.parallel.cuts.profile_blocks measures it (what pipeline partition="auto" cuts
   by), beside the same block timed here with the device synchronised around each phase,
   and the cuts auto_partition makes from each, with their balance (slowest ÷ mean stage)
   under the synchronised times.
4. char-lm tokens/s: the built-in algorithm (`python -m algorithms.charlm` over a hand-made
   job directory under torch.distributed.run, as bench/ddp_scaling.py runs it) on one
   process and, with 2+ GPUs, on one per GPU (DDP).
5. All-reduce bandwidth with 2+ GPUs (NCCL, 64 MB to 1 GB of float32): algbw = bytes ÷ time
   and busbw = algbw × 2(n−1)/n, as nccl-tests define them. With --device cpu it runs on
   gloo with small tensors, to exercise the code.
Exits 1 when a section failed (its output says why), 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `datasets` here is our app, not a PyPI package
RESULT = "gpu-check-result "
MB = 1024 * 1024
STEPS_LINE = "trained steps "


@dataclass(frozen=True)
class Sizes:
    width: int
    vocabulary: int
    batch: int
    sequence: int
    steps: int
    warmup: int
    launch_timeout: int
    charlm: dict[str, Any]
    all_reduce_mb: tuple[int, ...]
    multipliers: tuple[int, ...] = (1, 2, 4, 4, 6, 8)  # each block's hidden width ÷ width


FULL = Sizes(width=2048, vocabulary=8192, batch=8, sequence=512, steps=10, warmup=3, launch_timeout=150,
             charlm={"max_steps": 150, "batch_size": 64, "context_length": 256, "embedding_dim": 512, "layers": 6,
                     "heads": 8, "log_every_steps": 50},
             all_reduce_mb=(64, 256, 1024))
QUICK = Sizes(width=64, vocabulary=256, batch=8, sequence=32, steps=3, warmup=1, launch_timeout=180,
              charlm={"max_steps": 10, "batch_size": 8, "context_length": 32, "embedding_dim": 32, "layers": 1,
                      "heads": 2, "log_every_steps": 5},
              all_reduce_mb=(1, 4))


# --- the model ---------------------------------------------------------------------------------
def build(sizes: Sizes) -> Any:
    """The seeded model: the same weights on every rank."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, width: int, hidden: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(F.gelu(self.up(self.norm(x))))

    class ResidualStack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(sizes.vocabulary, sizes.width)
            self.blocks = nn.ModuleList(Residual(sizes.width, sizes.width * m) for m in sizes.multipliers)
            self.norm = nn.LayerNorm(sizes.width)
            self.head = nn.Linear(sizes.width, sizes.vocabulary)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return ResidualStack()


def lm_loss(logits: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def batch(sizes: Sizes, seed: int, count: int | None = None) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    shape = (count or sizes.batch, sizes.sequence)
    return (torch.randint(0, sizes.vocabulary, shape, generator=generator),
            torch.randint(0, sizes.vocabulary, shape, generator=generator))


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], object], device: Any, steps: int, warmup: int, barrier: Callable[[], None] = lambda: None
          ) -> list[float]:
    """Milliseconds of each call after `warmup` calls, the device synchronised around each."""
    times = []
    for index in range(warmup + steps):
        barrier()
        synchronize(device)
        started = time.perf_counter()
        step()
        synchronize(device)
        if index >= warmup:
            times.append((time.perf_counter() - started) * 1000)
    return times


# --- 1. wrap() in each form, and 5. all-reduce: the processes' side -------------------------------
def worker(form: str, sizes: Sizes) -> None:
    """One process of a torchrun launch: `form` is ddp, fsdp, fsdp-bf16, pipeline or all-reduce."""
    import torch

    import trainyard.parallel as tp

    ctx = tp.init(seed=0)
    # A first collective now: NCCL refuses two ranks on one GPU here, not after profiling.
    ctx.barrier()
    if form == "all-reduce":
        rows = all_reduce(ctx, sizes)
        if ctx.is_main:
            print(RESULT + json.dumps({"rows": rows, "backend": ctx.backend, "world_size": ctx.world_size}), flush=True)
        finish()
    distribution: Any = {"fsdp-bf16": {"kind": "fsdp"}, "pipeline": {"kind": "pipeline", "stages": ctx.world_size}}.get(
        form, {"kind": form})
    options: dict[str, Any] = {"mixed_precision": "bf16"} if form == "fsdp-bf16" else {}
    if form == "pipeline":
        options["microbatches"] = 4
    # A pipeline's stages all read the same batch; DDP and FSDP ranks each their own.
    seed = 1 if form == "pipeline" else 1 + ctx.rank
    inputs, targets = (tensor.to(ctx.device) for tensor in batch(sizes, seed))
    # On the device before wrap: a pipeline profiles its blocks where the model is, at the
    # first step (with example_inputs alone it would profile with targets of the wrong shape
    # for a per-token loss).
    model = tp.wrap(build(sizes).to(ctx.device), distribution=distribution, loss_fn=lm_loss, **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model.step(inputs, targets)
        optimizer.step()

    times = timed(step, ctx.device, sizes.steps, sizes.warmup, ctx.barrier)
    stage_ms = model.measured()  # collective: every rank
    report = dict(model.report)
    if ctx.is_main:
        print(RESULT + json.dumps({
            "step_ms": statistics.median(times), "world_size": ctx.world_size, "replicas": ctx.replicas,
            "backend": ctx.backend, "device": str(ctx.device), "stage_ms": stage_ms,
            "api": report.get("api"), "why": report.get("why"), "fallbacks": report.get("fallbacks"),
            "param_dtype": report.get("param_dtype"), "memory_per_rank_mb": report.get("memory_per_rank_mb"),
            "memory_measure": report.get("memory_measure"), "stage_layers": report.get("stage_layers"),
            "balance_predicted": report.get("balance_predicted"), "balance_measured": report.get("balance_measured"),
        }), flush=True)
    finish()


def finish() -> None:
    """Tear the process group down and leave at once: the result is printed, and a rank
    that lingers in interpreter teardown would only hold its torchrun."""
    import trainyard.parallel as tp

    tp.destroy()
    sys.stdout.flush()
    os._exit(0)


def all_reduce(ctx: Any, sizes: Sizes) -> list[dict[str, float]]:
    import torch

    rows = []
    n = ctx.world_size
    for size_mb in sizes.all_reduce_mb:
        tensor = torch.ones(size_mb * MB // 4, dtype=torch.float32, device=ctx.device)
        iterations = 20 if size_mb <= 256 else 10
        for _ in range(3):
            torch.distributed.all_reduce(tensor)
        ctx.barrier()
        synchronize(ctx.device)
        started = time.perf_counter()
        for _ in range(iterations):
            torch.distributed.all_reduce(tensor)
        synchronize(ctx.device)
        seconds = (time.perf_counter() - started) / iterations
        algbw = size_mb * MB / seconds / 1e9
        rows.append({"size_mb": size_mb, "ms": seconds * 1000, "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n})
        del tensor
    return rows


# --- launching ----------------------------------------------------------------------------------
@dataclass
class Launched:
    returncode: int
    output: str
    timed_out: bool


def launch(command: list[str], env: dict[str, str], timeout: int, cwd: Path = ROOT) -> Launched:
    """A command in its own session, stopped if it outlives `timeout` (a hung rank must not
    hold the check until the global timeout). Its output goes to a file, not a pipe: a worker
    left behind by torchrun would keep a pipe open and block the read. torchrun puts each
    worker in a session of its own and stops them on SIGTERM, so that comes first, then
    SIGKILL for what is left of torchrun's group."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.seek(0)
        return Launched(process.returncode, log.read(), timed_out)


def torchrun(processes: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]


def child_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "TRAINYARD_"))}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(extra or {})})
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = "1"
    return env


def run_worker(form: str, processes: int, args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    distribution = {"fsdp-bf16": "fsdp", "all-reduce": "none"}.get(form, form)
    value = {"kind": distribution, "stages": processes} if distribution == "pipeline" else {"kind": distribution}
    env = child_env(args.device, {"TRAINYARD_DISTRIBUTION": json.dumps(value)})
    command = [*torchrun(processes), str(Path(__file__).resolve()), "--worker", form, "--device", args.device]
    if args.quick:
        command.append("--quick")
    done = launch(command, env, sizes.launch_timeout)
    for line in done.output.splitlines():
        if line.startswith(RESULT):
            return {"ok": True, **json.loads(line[len(RESULT):])}
    why = f"timed out after {sizes.launch_timeout}s" if done.timed_out else f"exit status {done.returncode}"
    return {"ok": False, "why": why, "output": done.output}


def failure_line(output: str) -> str:
    """The most telling line of a failed launch's output."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ranks = [line for line in lines if line.startswith("[rank")]  # a worker's own traceback
    for marker in ("Duplicate GPU", "Error: ", "Error", "error"):
        for pool in (ranks, lines):
            found = [line for line in pool if marker in line]
            if found:
                return found[-1][:300]
    return lines[-1][:300] if lines else "(no output)"


# --- sections -----------------------------------------------------------------------------------
class Check:
    def __init__(self, args: argparse.Namespace, sizes: Sizes, gpus: int) -> None:
        self.args, self.sizes, self.gpus = args, sizes, gpus
        self.failed: list[str] = []

    def section(self, title: str, body: Callable[[], None]) -> None:
        started = time.monotonic()
        print(f"\n== {title}", flush=True)
        try:
            body()
        except Exception as exc:  # a section's failure is reported and the others still run
            self.failed.append(title)
            print(f"  FAILED: {type(exc).__name__}: {exc}", flush=True)
            print("    " + "\n    ".join(traceback.format_exc().splitlines()[-12:]), flush=True)
        print(f"  ({time.monotonic() - started:.0f}s)", flush=True)

    # 1 --------------------------------------------------------------------------------------------
    def forms(self) -> None:
        sizes, cuda = self.sizes, self.args.device == "cuda"
        processes = self.gpus if cuda else 2
        print(f"  model: {len(sizes.multipliers)} residual MLP blocks, width {sizes.width}, hidden "
              f"{'/'.join(str(sizes.width * m) for m in sizes.multipliers)}, vocabulary {sizes.vocabulary}; "
              f"batch {sizes.batch} × {sizes.sequence} tokens per replica; median of {sizes.steps} steps after "
              f"{sizes.warmup} warm-up (forward, backward, AdamW)")
        if cuda and processes == 1:
            print("  one GPU: DDP and FSDP run as one process (nothing to replicate or shard over; the report says "
                  "so); FSDP's bf16 mixed precision needs 2+ processes, section 2 measures bf16 on one device")
        measure = "max_allocated_mb" if cuda else "peak_rss_mb"
        plans = [("ddp", processes), ("fsdp", processes)]
        if processes >= 2:
            plans.append(("fsdp-bf16", processes))
        stages = 2 if processes <= 2 else min(processes, 4)
        plans.append(("pipeline", stages))
        results: dict[str, dict[str, Any]] = {}
        print(f"  {'form':<11}{'procs':>6}{'api':>25}{'step ms':>10}{'samples/s':>11}{'tokens/s':>12}"
              f"  peak memory per rank (MB)")
        for form, count in plans:
            result = run_worker(form, count, self.args, sizes)
            results[form] = result
            if not result["ok"]:
                reason = failure_line(result["output"])
                if form == "pipeline" and cuda and self.gpus < count and "Duplicate GPU" in result["output"]:
                    print(f"  {form:<11}{count:>6}  skipped: {count} stages on {self.gpus} GPU — NCCL refuses two "
                          f"ranks on one GPU ({reason})")
                    continue
                self.failed.append(f"wrap {form}")
                print(f"  {form:<11}{count:>6}  FAILED ({result['why']}): {reason}")
                print("    " + "\n    ".join(result["output"].splitlines()[-15:]))
                continue
            seconds = result["step_ms"] / 1000
            samples = sizes.batch * result["replicas"] / seconds
            api = result["api"] or ("pipelining" if form == "pipeline" else "-")
            memory = ", ".join(f"{value:.0f}" for value in result["memory_per_rank_mb"] or [])
            print(f"  {form:<11}{count:>6}{api:>25}{result['step_ms']:>10.1f}{samples:>11.1f}{samples * sizes.sequence:>12.0f}"
                  f"  {memory} ({result['memory_measure'] or measure})")
            if result.get("why"):
                print(f"    {form}: {result['why']}")
            for note in result.get("fallbacks") or []:
                print(f"    {form} fallback: {note}")
            if form == "pipeline":
                print(f"    stages (blocks) {result['stage_layers']}, balance predicted {result['balance_predicted']}, "
                      f"measured {result['balance_measured']} (in-pipeline stage ms "
                      f"{[round(value, 1) for value in result['stage_ms'] or []]})")
        if results.get("fsdp", {}).get("ok") and results.get("fsdp-bf16", {}).get("ok"):
            fp32, bf16 = results["fsdp"]["step_ms"], results["fsdp-bf16"]["step_ms"]
            print(f"  FSDP bf16 mixed precision (param_dtype {results['fsdp-bf16']['param_dtype']}): {bf16:.1f} ms "
                  f"vs float32 {fp32:.1f} ms: speed-up {fp32 / bf16:.2f}×")
        if results.get("ddp", {}).get("ok") and results.get("fsdp", {}).get("ok"):
            ddp_memory = max(results["ddp"]["memory_per_rank_mb"] or [0])
            fsdp_memory = max(results["fsdp"]["memory_per_rank_mb"] or [0])
            if ddp_memory and fsdp_memory:
                print(f"  FSDP peak memory per rank {fsdp_memory:.0f} MB vs DDP {ddp_memory:.0f} MB "
                      f"({fsdp_memory / ddp_memory:.2f}× DDP's)")

    # 2 --------------------------------------------------------------------------------------------
    def one_device(self) -> None:
        import torch

        import trainyard.parallel as tp

        sizes = self.sizes
        device = torch.device(self.args.device)
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32: the baseline is not TF32
        torch.backends.cudnn.allow_tf32 = False
        ctx = tp.init(seed=0)
        inputs, targets = (tensor.to(device) for tensor in batch(sizes, 1))
        model = tp.wrap(build(sizes), distribution="none", loss_fn=lm_loss)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        print(f"  on {device} ({ctx.device}); batch {sizes.batch} × {sizes.sequence} tokens; median of {sizes.steps} "
              f"steps after {sizes.warmup} warm-up")

        def step(precision: str) -> Callable[[], None]:
            def run() -> None:
                optimizer.zero_grad(set_to_none=True)
                if precision == "bf16":
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        model.step(inputs, targets)
                else:
                    model.step(inputs, targets)
                optimizer.step()
            return run

        fp32 = statistics.median(timed(step("fp32"), device, sizes.steps, sizes.warmup))
        bf16 = statistics.median(timed(step("bf16"), device, sizes.steps, sizes.warmup))
        tokens = sizes.batch * sizes.sequence
        print(f"  bf16 mixed precision (autocast): {bf16:8.1f} ms/step {tokens / bf16 * 1000:>12.0f} tokens/s")
        print(f"  float32 (baseline):              {fp32:8.1f} ms/step {tokens / fp32 * 1000:>12.0f} tokens/s")
        print(f"  bf16 speed-up: {fp32 / bf16:.2f}×")

        plain = tp.wrap(build(sizes), distribution="none", loss_fn=lm_loss)
        checkpointed = tp.wrap(build(sizes), distribution="none", loss_fn=lm_loss, checkpoint_activations=True)
        rows = {}
        for label, wrapped in (("checkpointed", checkpointed), ("none (baseline)", plain)):
            step_memory(wrapped, inputs, targets, device)  # warm-up: kernels, allocator, grads' first allocation
            saved, peak = step_memory(wrapped, inputs, targets, device)

            def run(wrapped: Any = wrapped) -> None:
                wrapped.zero_grad(set_to_none=True)
                wrapped.step(inputs, targets)

            ms = statistics.median(timed(run, device, sizes.steps, sizes.warmup))
            rows[label] = (saved, peak, ms)
        print(f"  {'activation checkpointing':<26}{'saved for backward':>20}{'step peak above start':>24}{'fwd+bwd ms':>12}")
        for label, (saved, peak, ms) in rows.items():
            peak_text = f"{peak:.1f} MB" if peak is not None else "- (CPU)"
            print(f"  {label:<26}{saved:>17.1f} MB{peak_text:>24}{ms:>12.1f}")
        (saved_c, peak_c, ms_c), (saved_p, peak_p, ms_p) = rows["checkpointed"], rows["none (baseline)"]
        line = f"  checkpointing keeps {saved_c / saved_p:.2f}× the saved activations ({saved_p - saved_c:.1f} MB less)"
        if peak_c is not None and peak_p is not None:
            line += f", a {peak_c / peak_p:.2f}× step peak ({peak_p - peak_c:.1f} MB less)"
        print(line + f", for {ms_c / ms_p:.2f}× the step time (the blocks' forward runs again in backward)")

    # 3 --------------------------------------------------------------------------------------------
    def profile(self) -> None:
        import torch

        from trainyard.parallel import blocks as blocklist
        from trainyard.parallel.cuts import profile_blocks
        from trainyard.parallel.forms import BANDWIDTH_BYTES_PER_MS
        from trainyard.parallel.partition import CostModel, auto_partition, balance

        sizes = self.sizes
        device = torch.device(self.args.device)
        microbatches = 4
        model = build(sizes).to(device)
        inputs, targets = (tensor.to(device) for tensor in batch(sizes, 1, sizes.batch // microbatches))
        units = blocklist.execution_order(model, blocklist.candidates(model), (inputs,))
        costs = profile_blocks(model, units, (inputs,), targets, lm_loss)
        reference = synchronised_costs(model, units, inputs, targets, device)
        bandwidth = BANDWIDTH_BYTES_PER_MS["nccl" if device.type == "cuda" else "gloo"]
        profiled = CostModel(tuple(costs), microbatches=microbatches, bandwidth_bytes_per_ms=bandwidth)
        truth = CostModel(tuple(replace(cost, forward_ms=fwd, backward_ms=bwd) for cost, (fwd, bwd)
                                in zip(costs, reference, strict=True)), microbatches=microbatches,
                          bandwidth_bytes_per_ms=bandwidth)
        print(f"  {len(units)} blocks, a microbatch of {len(inputs)} × {sizes.sequence} tokens on {device}; ms "
              "forward+backward")
        print(f"  {'block':<12}{'profile_blocks':>16}{'synchronised':>14}{'ratio':>8}{'saved MB':>10}")
        for cost, (fwd, bwd) in zip(costs, reference, strict=True):
            mine = cost.forward_ms + cost.backward_ms
            print(f"  {cost.name:<12}{mine:>16.3f}{fwd + bwd:>14.3f}{mine / max(fwd + bwd, 1e-9):>8.2f}"
                  f"{cost.activation_bytes / MB:>10.1f}")
        total_profiled = sum(c.forward_ms + c.backward_ms for c in costs)
        total_true = sum(f + b for f, b in reference)
        print(f"  total: profile_blocks {total_profiled:.2f} ms, synchronised {total_true:.2f} ms "
              f"({total_profiled / total_true:.2f}×)")
        for stages in (2, 4):
            if stages > len(units):
                continue
            cut = auto_partition(profiled, stages)
            best = auto_partition(truth, stages)
            print(f"  {stages} stages: auto from profile_blocks {list(cut.ranges)} balance "
                  f"{balance(cut.predicted_ms(profiled)):.3f} predicted, {balance(cut.predicted_ms(truth)):.3f} under "
                  f"the synchronised times; from the synchronised times {list(best.ranges)} "
                  f"{balance(best.predicted_ms(truth)):.3f}")

    # 4 --------------------------------------------------------------------------------------------
    def charlm(self) -> None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
        import django

        django.setup()
        from datasets.demo import write_text

        work = Path(tempfile.mkdtemp(prefix="trainyard-gpu-check-"))
        (work / "data").mkdir()
        text = write_text(work / "data")
        hps = {"epochs": 100, **self.sizes.charlm}
        plans = [1] + ([self.gpus] if self.args.device == "cuda" and self.gpus >= 2 else [])
        tokens_per_step = hps["batch_size"] * hps["context_length"]
        print(f"  char-lm: embedding {hps['embedding_dim']}, {hps['layers']} layers, {hps['heads']} heads, batch "
              f"{hps['batch_size']} × {hps['context_length']} characters per process, {hps['max_steps']} steps")
        one = None
        for processes in plans:
            base = work / f"p{processes}"
            env = child_env(self.args.device, {**charlm_job_dir(base, text), "SM_HPS": json.dumps(hps)})
            done = launch([*torchrun(processes), "-m", "algorithms.charlm"], env, self.sizes.launch_timeout, cwd=base)
            found = [line for line in done.output.splitlines() if STEPS_LINE in line]
            if done.returncode != 0 or not found:
                self.failed.append(f"char-lm on {processes}")
                print(f"  {processes} process(es): FAILED ({done.returncode}): {failure_line(done.output)}")
                print("    " + "\n    ".join(done.output.splitlines()[-15:]))
                continue
            steps_per_second = float(found[-1].rsplit("(", 1)[1].split()[0])
            rate = steps_per_second * tokens_per_step * processes
            versus = f"  ({rate / one:.2f}× one process)" if one else "  (baseline)"
            one = one or rate
            print(f"  {processes} process(es): {rate:>12.0f} tokens/s ({steps_per_second:.1f} steps/s){versus}")

    # 5 --------------------------------------------------------------------------------------------
    def bandwidth(self) -> None:
        if self.args.device == "cuda" and self.gpus < 2:
            print(f"  skipped: it needs 2+ GPUs (this machine has {self.gpus})")
            return
        processes = self.gpus if self.args.device == "cuda" else 2
        result = run_worker("all-reduce", processes, self.args, self.sizes)
        if not result["ok"]:
            raise RuntimeError(f"{result['why']}: {failure_line(result['output'])}")
        print(f"  {result['backend']}, {result['world_size']} ranks; busbw = algbw × 2(n−1)/n")
        print(f"  {'size':>10}{'time ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for row in result["rows"]:
            print(f"  {row['size_mb']:>7} MB{row['ms']:>10.2f}{row['algbw']:>12.2f}{row['busbw']:>12.2f}")


def step_memory(model: Any, inputs: Any, targets: Any, device: Any) -> tuple[float, float | None]:
    """(MB of the tensors autograd saved for backward during one step, parameters excluded;
    on CUDA the step's peak allocation above what it started with, else None)."""
    import torch

    parameters = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    model.zero_grad(set_to_none=True)
    start = 0
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model.step(inputs, targets)
    peak = None
    if device.type == "cuda":
        synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - start) / MB
    return sum(saved.values()) / MB, peak


def synchronised_costs(model: Any, units: list[Any], inputs: Any, targets: Any, device: Any,
                       repeats: int = 5) -> list[tuple[float, float]]:
    """(forward ms, backward ms) of each block alone on what it received in one forward of the
    model, the device synchronised before each clock reading; the last block with the loss."""
    import torch

    captured: dict[int, tuple[Any, ...]] = {}
    def keep(index: int, args: tuple[Any, ...]) -> None:
        captured.setdefault(index, tuple(arg.detach() for arg in args))

    handles = [unit.module.register_forward_pre_hook(lambda _module, args, index=index: keep(index, args))
               for index, unit in enumerate(units)]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    results = []
    for index, unit in enumerate(units):
        forward_times, backward_times = [], []
        for repetition in range(repeats + 1):
            args = tuple(arg.clone().requires_grad_(arg.is_floating_point()) for arg in captured[index])
            synchronize(device)
            started = time.perf_counter()
            output = unit.module(*args)
            synchronize(device)
            middle = time.perf_counter()
            if index == len(units) - 1:
                lm_loss(output, targets).backward()
            else:
                output.backward(torch.ones_like(output))
            synchronize(device)
            finished = time.perf_counter()
            unit.module.zero_grad(set_to_none=True)
            if repetition:
                forward_times.append((middle - started) * 1000)
                backward_times.append((finished - middle) * 1000)
        results.append((statistics.median(forward_times), statistics.median(backward_times)))
    return results


def charlm_job_dir(base: Path, text: dict[str, Path]) -> dict[str, str]:
    for sub in ("model", "output/data", "checkpoints", "input/config", "input/data/train"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for name, path in text.items():
        if name.startswith("train"):
            (base / "input/data/train" / path.name).symlink_to(path)
    return {"SM_MODEL_DIR": str(base / "model"), "SM_OUTPUT_DIR": str(base / "output"),
            "SM_OUTPUT_DATA_DIR": str(base / "output/data"), "SM_CHECKPOINT_DIR": str(base / "checkpoints"),
            "SM_CHANNELS": json.dumps(["train"]), "SM_CHANNEL_TRAIN": str(base / "input/data/train"),
            "SM_HOSTS": json.dumps(["gpu-check"]), "SM_CURRENT_HOST": "gpu-check"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same measurements on CPU and gloo (to test the check without a GPU)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few steps")
    parser.add_argument("--only", nargs="+", choices=("forms", "one-device", "profile", "charlm", "all-reduce"),
                        help="some sections only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: init() then picks the CPU
    if args.worker:
        worker(args.worker, sizes)
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        build_note = ("this torch is a CPU-only build (torch.version.cuda is None): install a CUDA build of the "
                      f"same torch {torch.__version__.split('+')[0]}" if torch.version.cuda is None
                      else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
        print(f"CUDA is not available: {build_note}; nothing to check (bench/gpu_check.py --device cpu --quick runs "
              "the same code on CPU)")
        return 0
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    check = Check(args, sizes, gpus)
    started = time.monotonic()
    print(f"gpu_check on {args.device}" + (f" ({gpus} GPU{'s' if gpus > 1 else ''})" if gpus else " (gloo, 2 processes)")
          + (", quick sizes" if args.quick else ""), flush=True)
    sections = [
        ("forms", "1. wrap(): DDP, FSDP, pipeline", check.forms),
        ("one-device", "2. one device: bf16 mixed precision, activation checkpointing", check.one_device),
        ("profile", "3. the partitioner's profile on this device", check.profile),
        ("charlm", "4. char-lm tokens/s", check.charlm),
    ]
    sections.append(("all-reduce", "5. all-reduce bandwidth" + (" (gloo, to exercise the code)"
                                                                 if args.device == "cpu" else " (NCCL)"), check.bandwidth))
    for key, title, body in sections:
        if args.only is None or key in args.only:
            check.section(title, body)
    print(f"\ngpu_check done in {time.monotonic() - started:.0f}s" +
          (f"; FAILED: {', '.join(check.failed)}" if check.failed else "; every section ran"), flush=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
