"""What every built-in algorithm shares once it runs inside a training process: start-up
and failure reporting, metrics, torch.distributed, reading channel files, the seeded
hold-out, the deterministic and resumable training loop, and writing model/.

Only training processes (and predict.py) import this module: it imports torch at the top.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from algorithms.base import AlgorithmSpec, DataError, validate_hyperparameters
from trainyard import checkpoints, protocol
from trainyard import flush as flush_metrics
from trainyard import log_metrics as sdk_log_metrics
from trainyard.data import iter_lines, read_manifest
from trainyard.env import TrainingEnvironment

TABLE_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".ndjson")
LABEL_NAMES = ("label", "target", "class", "y", "category")  # as datasets/formats infers them
HOLDOUT_FRACTION = 0.1
EVAL_BATCH_SIZE = 512


# --- metrics -------------------------------------------------------------------------------
def emit(line: str, stream: Any = None) -> None:
    """One whole line in one write: ranks sharing a pipe then never interleave mid-line
    (print() writes the text and the newline separately)."""
    target = sys.stdout if stream is None else stream
    target.write(line + "\n")
    target.flush()


def format_value(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:.6g}"


class MetricLogger:
    """Prints `step=120 train_loss=0.3124 ...` (one line, flushed, for metric_definitions)
    and hands the same points to trainyard.log_metrics, which never blocks or raises."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        emit(f"step={step} " + " ".join(f"{name}={format_value(value)}" for name, value in metrics.items()))
        # The SDK never raises (a Redis outage is its problem to buffer); the points it
        # sends and the stdout line carry the same (name, step, rank), so a runner that
        # also applies metric_definitions to this line stores each point once.
        sdk_log_metrics(metrics, step)

    def close(self) -> None:
        """Wait (a bounded while) for the SDK to hand every point to Redis: the runner
        reads final metrics soon after the process exits."""
        if not flush_metrics(5.0):
            emit("warning: some metric points were not sent before the end of training", sys.stderr)


# --- processes -----------------------------------------------------------------------------
@dataclass
class Distributed:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so counts stay exact)."""
        if self.world_size == 1:
            return [float(value) for value in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return tensor.tolist()


def start_distributed(env: TrainingEnvironment) -> Distributed:
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{env.local_rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if env.world_size > 1:
        # env:// rendezvous: torch.distributed.run has set MASTER_ADDR/PORT, RANK, WORLD_SIZE.
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
    return Distributed(rank=env.rank, world_size=env.world_size, device=device)


def stop_distributed(dist: Distributed) -> None:
    # Explicit teardown: gloo has been seen to abort at interpreter exit without it.
    if dist.world_size > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def seed_everything(seed: int) -> None:
    # cuBLAS is only deterministic with a fixed workspace; must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


@dataclass
class Context:
    spec: AlgorithmSpec
    env: TrainingEnvironment
    hps: dict[str, Any]
    dist: Distributed
    logger: MetricLogger = field(default_factory=MetricLogger)
    # The job's `distribution` (TRAINYARD_DISTRIBUTION): "none" and "ddp" both replicate the
    # model (DDP once there are two processes); "fsdp" shards it; "pipeline" cuts it in stages.
    distribution: str = "none"

    def log(self, message: str) -> None:
        emit(message)


def write_failure(output_dir: Path, reason: str) -> None:
    """Atomic, so two ranks failing alike leave one whole message, never an interleaving."""
    failure = output_dir / "failure"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        temporary = output_dir / f".failure.tmp-{os.getpid()}"
        temporary.write_text(reason.strip() + "\n", encoding="utf-8")
        os.replace(temporary, failure)
    except OSError as exc:
        emit(f"could not write {failure}: {exc}", sys.stderr)


def _fail(output_dir: Path, reason: str) -> NoReturn:
    write_failure(output_dir, reason)
    emit(f"error: {reason}", sys.stderr)
    sys.exit(2)


def run_algorithm(spec: AlgorithmSpec, train: Callable[[Context], None]) -> None:
    """1. Read the environment and hyperparameters (strings coerced through the schema).
    2. Seed, join the process group, train. 3. On bad input write the reason to
    $SM_OUTPUT_DIR/failure and exit 2; the process group is always destroyed."""
    try:
        env = TrainingEnvironment.from_env()
    except ValueError as exc:  # SM_HPS that is not JSON, a RANK that is not a number
        _fail(Path(os.environ.get("SM_OUTPUT_DIR", "/opt/ml/output")), str(exc))
    try:
        hps, errors = validate_hyperparameters(spec, env.hyperparameters, allow_unknown=True)
        if errors:
            raise DataError("invalid hyperparameters: " + "; ".join(errors.values()))
        distribution = read_distribution(spec)
        emit(f"rank {env.rank}/{env.world_size} on host {env.current_host}: {spec.name} "
             f"WORLD_SIZE={env.world_size} LOCAL_RANK={env.local_rank} torch {torch.__version__} "
             f"threads={torch.get_num_threads()} distribution={distribution}")
        ignored = sorted(set(map(str, env.hyperparameters)) - set(hps))
        if ignored:
            emit(f"note: ignoring hyperparameters {spec.name} does not take: {', '.join(ignored)}")
        seed_everything(hps["seed"])
        dist = start_distributed(env)
        context = Context(spec=spec, env=env, hps=hps, dist=dist, distribution=distribution)
        try:
            train(context)
        finally:
            context.logger.close()
            stop_distributed(dist)
    except DataError as exc:
        _fail(env.output_dir, str(exc))


def read_distribution(spec: AlgorithmSpec) -> str:
    """TRAINYARD_DISTRIBUTION ("none" when unset, as in a run by hand), if the algorithm
    supports it; the API checks the same, so only a hand-made environment gets this far."""
    distribution = os.environ.get(protocol.ENV_DISTRIBUTION, "").strip() or "none"
    if distribution not in spec.distributions:
        raise DataError(f"{spec.name} does not support distribution {distribution!r}; it supports "
                        f"{', '.join(spec.distributions)}")
    return distribution


# --- reading channels ----------------------------------------------------------------------
def required_channel(ctx: Context, name: str) -> Path:
    folder = optional_channel(ctx, name)
    if folder is None:
        raise DataError(f"no {name!r} channel: this algorithm needs {name!r} input data")
    return folder


def optional_channel(ctx: Context, name: str) -> Path | None:
    folder = ctx.env.channel(name)
    if folder is not None and not folder.is_dir():
        raise DataError(f"channel {name!r} folder {folder} does not exist")
    return folder


def data_files(folder: Path, extensions: Iterable[str], channel: str) -> list[Path]:
    """Every file under folder with one of the extensions, recursively, in path order;
    hidden files (.DS_Store, partial downloads) are not data."""
    wanted = tuple(extensions)
    found = sorted((path for path in folder.rglob("*") if path.is_file()),
                   key=lambda path: path.relative_to(folder).as_posix())
    visible = [path for path in found if not any(part.startswith(".") for part in path.relative_to(folder).parts)]
    chosen = [path for path in visible if path.name.lower().endswith(wanted)]
    if not chosen:
        present = ", ".join(path.relative_to(folder).as_posix() for path in visible[:5]) or "nothing"
        more = f" and {len(visible) - 5} more" if len(visible) > 5 else ""
        raise DataError(f"no {', '.join(wanted)} files in channel {channel!r}; it holds {present}{more}")
    return chosen


@dataclass
class Table:
    name: str  # the first file's path inside the channel, for messages
    columns: list[str]
    rows: list[dict[str, Any]]


def read_table(folder: Path, channel: str) -> Table:
    """CSV/TSV (header row) and JSON Lines files of one channel as one list of rows."""
    if read_manifest(folder) is not None:
        return _read_streamed_table(folder, channel)
    files = data_files(folder, TABLE_EXTENSIONS, channel)
    name = files[0].relative_to(folder).as_posix()
    columns: list[str] = []
    rows: list[dict[str, Any]] = []
    for path in files:
        relative = path.relative_to(folder).as_posix()
        if path.name.lower().endswith((".csv", ".tsv")):
            header, file_rows = _read_csv(path, relative)
            if columns and set(header) != set(columns):
                raise DataError(f"{relative} has columns {', '.join(header)} but {name} has {', '.join(columns)}")
        else:
            header, file_rows = _read_jsonl(path, relative)
        columns.extend(column for column in header if column not in columns)
        rows.extend(file_rows)
    if not rows:
        raise DataError(f"channel {channel!r} has no records ({name})")
    return Table(name=name if len(files) == 1 else f"{name} (and {len(files) - 1} more files)", columns=columns, rows=rows)


def _read_streamed_table(folder: Path, channel: str) -> Table:
    """A `stream`-mode channel: the records come straight from the object store, through
    the manifest (trainyard.data keeps only this channel's records of a split version)."""
    manifest = read_manifest(folder) or {}
    name = f"{channel} (streamed from dataset version {manifest.get('dataset_version')})"
    text = "".join(iter_lines(folder))
    if manifest.get("format") == "jsonl":
        columns, rows = _parse_jsonl(text, name)
    else:
        columns, rows = _parse_csv(text, name, manifest.get("delimiter") or ",")
    if not rows:
        raise DataError(f"channel {channel!r} has no records ({name})")
    return Table(name=name, columns=columns, rows=rows)


def _read_csv(path: Path, relative: str) -> tuple[list[str], list[dict[str, Any]]]:
    delimiter = "\t" if path.name.lower().endswith(".tsv") else ","
    return _parse_csv(_read_text(path, relative), relative, delimiter)


def _parse_csv(text: str, relative: str, delimiter: str) -> tuple[list[str], list[dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = next(reader, None)
    if not header:
        raise DataError(f"{relative} is empty: a CSV file needs a header row")
    header = [column.strip() for column in header]
    rows = []
    for values in reader:
        if not values or values == [""]:
            continue
        if len(values) != len(header):
            raise DataError(f"{relative} line {reader.line_num}: {len(values)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, values, strict=True)))
    return header, rows


def _read_jsonl(path: Path, relative: str) -> tuple[list[str], list[dict[str, Any]]]:
    return _parse_jsonl(_read_text(path, relative), relative)


def _parse_jsonl(text: str, relative: str) -> tuple[list[str], list[dict[str, Any]]]:
    columns: dict[str, None] = {}
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{relative} line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{relative} line {number}: each line must be a JSON object")
        columns.update(dict.fromkeys(record))
        rows.append(record)
    return list(columns), rows


def _read_text(path: Path, relative: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{relative} is not UTF-8 text (byte {exc.start})") from None


def find_label_column(table: Table, requested: str) -> str:
    if requested:
        if requested not in table.columns:
            raise DataError(f"label column {requested!r} not found in {table.name}; columns are {', '.join(table.columns)}")
        return requested
    by_lower = {column.lower(): column for column in reversed(table.columns)}
    for candidate in LABEL_NAMES:
        if candidate in by_lower:
            return by_lower[candidate]
    raise DataError(f"no label column in {table.name}: set the hyperparameter label_column to one of "
                    f"{', '.join(table.columns)} (none is named {', '.join(LABEL_NAMES)})")


def label_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON 1.0 and CSV "1" are the same class
    return str(value).strip()


def label_vocabulary(labels: Iterable[str], where: str) -> list[str]:
    classes = sorted(set(labels))
    if len(classes) < 2:
        found = f"only {classes[0]!r}" if classes else "no labels"
        raise DataError(f"{where} has {found}: a classifier needs at least two classes")
    return classes


def encode_labels(labels: Sequence[str], classes: list[str], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(class indices, kept row indices): rows whose class train never saw cannot be scored."""
    index = {label: position for position, label in enumerate(classes)}
    kept = [row for row, label in enumerate(labels) if label in index]
    dropped = len(labels) - len(kept)
    if dropped:
        unseen = sorted({label for label in labels if label not in index})[:5]
        emit(f"warning: {where}: skipped {dropped} rows whose label is not in train ({', '.join(map(repr, unseen))})",
             sys.stderr)
    return np.array([index[labels[row]] for row in kept], dtype=np.int64), np.array(kept, dtype=np.int64)


def holdout_split(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, validation indices): a seeded 10% when there is no validation channel."""
    if count < 2:
        raise DataError(f"train has {count} record(s): need at least 2 to hold some out, or a validation channel")
    order = np.random.default_rng(seed).permutation(count)
    held = max(1, int(round(count * HOLDOUT_FRACTION)))
    return np.sort(order[held:]), np.sort(order[:held])


# --- training ------------------------------------------------------------------------------
class TensorBatches(torch.utils.data.Dataset):
    """Tensors indexed by a whole batch of indices at once: one gather per batch instead of
    one Python call and a collate per record."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        positions = torch.as_tensor(indices, dtype=torch.long)
        return tuple(tensor[positions] for tensor in self.tensors)


@dataclass
class Task:
    """A model whose forward takes every tensor of a batch but the last (the targets) and
    returns logits (..., classes); the loss is cross-entropy for classifiers and LMs alike."""

    model: nn.Module
    train: TensorBatches
    validation: TensorBatches | None
    test: TensorBatches | None = None
    report: Literal["accuracy", "perplexity"] = "accuracy"


def _batch_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    logits = model(*batch[:-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[-1].reshape(-1))


@torch.no_grad()
def evaluate(task: Task, model: nn.Module, data: TensorBatches, prefix: str, dist: Distributed, *,
             lockstep: bool = False) -> dict[str, float]:
    """Every rank scores its own stride of the data (no padding, so no record counts twice);
    sums are added over ranks, so every rank reports the same, global, figures. With
    lockstep every rank runs the same number of forwards (a sharded model all-gathers its
    weights in each), a rank that has run out scoring record 0 without counting it."""
    was_training = model.training
    model.eval()
    loss_sum = correct = count = 0.0
    mine = list(range(dist.rank, len(data), dist.world_size))
    chunks = [mine[start:start + EVAL_BATCH_SIZE] for start in range(0, len(mine), EVAL_BATCH_SIZE)]
    if lockstep:
        most = math.ceil(math.ceil(len(data) / dist.world_size) / EVAL_BATCH_SIZE)
        chunks += [[]] * (most - len(chunks))
    for chunk in chunks:
        batch = tuple(tensor.to(dist.device) for tensor in data[chunk or [0]])
        logits = model(*batch[:-1])
        if not chunk:
            continue
        flat_logits, targets = logits.reshape(-1, logits.shape[-1]), batch[-1].reshape(-1)
        loss_sum += F.cross_entropy(flat_logits, targets, reduction="sum").item()
        correct += (flat_logits.argmax(dim=-1) == targets).sum().item()
        count += targets.numel()
    loss_sum, correct, count = dist.sum([loss_sum, correct, count])
    model.train(was_training)
    loss = loss_sum / max(count, 1.0)
    if task.report == "perplexity":
        return {f"{prefix}_loss": loss, f"{prefix}_perplexity": math.exp(min(loss, 50.0))}
    return {f"{prefix}_loss": loss, f"{prefix}_accuracy": correct / max(count, 1.0)}


def rng_state() -> dict[str, Any]:
    legacy: Any = np.random.get_state(legacy=True)  # ("MT19937", keys, position, has_gauss, cached_gaussian)
    _, keys, position, has_gauss, cached_gaussian = legacy
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # As tensors and numbers: load_checkpoint's weights_only unpickler refuses ndarrays.
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(("MT19937", saved["keys"].numpy().astype(np.uint32), saved["position"], saved["has_gauss"],
                         saved["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _resume(ctx: Context, model: nn.Module, optimizer: torch.optim.Optimizer, strategy: Replicated) -> int:
    """The step of the newest readable checkpoint, its state loaded into model, optimizer
    and RNGs; 0 when there is none. An unreadable newest file (a sync cut short) falls
    back to the one before it."""
    for step, path in reversed(checkpoints.list_checkpoints(ctx.env.checkpoint_dir)):
        try:
            state = checkpoints.load_checkpoint(path)
        except Exception as exc:
            emit(f"warning: checkpoint {path.name} is unreadable ({exc}); trying an older one", sys.stderr)
            continue
        if state.get("algorithm") != ctx.spec.name:
            raise DataError(f"checkpoint {path.name} was written by {state.get('algorithm')!r}, not {ctx.spec.name}: "
                            "use an empty checkpoint location for a different algorithm")
        try:
            strategy.load(model, optimizer, state["model"], state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise DataError(f"checkpoint {path.name} does not fit this model (were the data or the architecture "
                            f"hyperparameters changed?): {str(exc).splitlines()[0]}") from None
        restore_rng(state["rng"])
        ctx.log(f"resumed from checkpoint step {step}")
        return step
    return 0


def _save_checkpoint(ctx: Context, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, epoch: int,
                     strategy: Replicated) -> None:
    if not (ctx.dist.is_main or strategy.collective_state):
        return
    model_state, optimizer_state = strategy.model_state(model), strategy.optimizer_state(model, optimizer)
    if not ctx.dist.is_main:
        return
    state = {"algorithm": ctx.spec.name, "step": step, "epoch": epoch, "model": model_state,
             "optimizer": optimizer_state, "rng": rng_state()}
    path = checkpoints.save_checkpoint(state, step, ctx.env.checkpoint_dir)
    ctx.log(f"saved checkpoint {path.name} at step {step}")


class Replicated:
    """How fit spreads a model over the processes, by default: each holds all of it and DDP
    averages the gradients (with one process, the model alone). algorithms.fsdp
    shards it instead; fit asks only these methods."""

    @property
    def collective_state(self) -> bool:
        """model_state/optimizer_state need every rank (they gather shards), not rank 0 alone."""
        return False

    @property
    def eval_in_lockstep(self) -> bool:
        """Every rank must run as many forwards as the others (a sharded forward all-gathers)."""
        return False

    def prepare(self, model: nn.Module, dist: Distributed) -> nn.Module:
        """The model whose parameters the optimizer steps."""
        return model.to(dist.device)

    def wrap(self, model: nn.Module, dist: Distributed) -> nn.Module:
        """The module the training steps call."""
        if dist.world_size == 1:
            return model
        device_ids = [dist.device.index] if dist.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        """The whole model's state dict, as one unsplit process would have it (rank 0's is
        the one saved)."""
        return model.state_dict()

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
             optimizer_state: dict[str, Any]) -> None:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)


def plan_steps(ctx: Context, task: Task, step: int, *, replicas: int,
               rank: int) -> tuple[DistributedSampler[int], int, int]:
    """(sampler, steps per epoch, last step) of a run over task.train: the order comes from
    DistributedSampler(seed, epoch) alone; epochs and max_steps bound the run. Logs the plan."""
    hps = ctx.hps
    sampler: DistributedSampler[int] = DistributedSampler(task.train, num_replicas=replicas, rank=rank, shuffle=True,
                                                          seed=hps["seed"])
    steps_per_epoch = math.ceil(len(sampler) / hps["batch_size"])
    last_step = hps["epochs"] * steps_per_epoch
    if hps["max_steps"]:
        last_step = min(last_step, hps["max_steps"])
    ctx.log(f"training {len(task.train)} records, {steps_per_epoch} steps per epoch, steps {step + 1}..{last_step}")
    return sampler, steps_per_epoch, last_step


def fit(ctx: Context, task: Task, strategy: Replicated | None = None) -> dict[str, float]:
    """1. Resume from the newest checkpoint, if any. 2. Train epoch by epoch: each epoch's
    order comes from DistributedSampler(seed, epoch) alone, so a resumed run skips the
    batches already done and sees exactly what an uninterrupted run would. 3. Evaluate
    after each epoch, checkpoint on schedule, stop at max_steps. Returns final metrics."""
    hps, dist = ctx.hps, ctx.dist
    strategy = strategy or Replicated()
    model = strategy.prepare(task.model, dist)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hps["learning_rate"], weight_decay=hps["weight_decay"])
    step = _resume(ctx, model, optimizer, strategy)
    trained = strategy.wrap(model, dist)
    lockstep = strategy.eval_in_lockstep
    sampler, steps_per_epoch, last_step = plan_steps(ctx, task, step, replicas=dist.world_size, rank=dist.rank)
    every = ctx.env.checkpoint_every_steps
    final: dict[str, float] = {}
    evaluated_at = checkpointed_at = -1
    loss_total: torch.Tensor | float = 0.0
    loss_count = 0
    started, first_step = time.monotonic(), step
    model.train()
    while step < last_step:
        epoch = step // steps_per_epoch
        sampler.set_epoch(epoch)
        batches = list(BatchSampler(sampler, hps["batch_size"], drop_last=False))[step - epoch * steps_per_epoch:]
        # Its own generator: without one, every DataLoader iterator draws its base seed
        # from the global RNG, which a resumed run would then consume at a different point
        # than an uninterrupted one, and dropout masks would diverge.
        loader = DataLoader(task.train, sampler=batches, batch_size=None,
                            generator=torch.Generator().manual_seed(hps["seed"] + epoch))
        for batch in loader:
            step += 1
            loss = _batch_loss(trained, tuple(tensor.to(dist.device) for tensor in batch))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            # Summed on the device and read only when reported: .item() every step would
            # make a GPU wait for each step to finish.
            loss_total = loss_total + loss.detach()
            loss_count += 1
            if step % hps["log_every_steps"] == 0 or step == last_step:
                final["train_loss"] = float(loss_total) / loss_count
                ctx.logger.log({"train_loss": final["train_loss"]}, step)
                loss_total, loss_count = 0.0, 0
            epoch_done = step % steps_per_epoch == 0
            if epoch_done:
                if task.validation is not None:
                    final.update(evaluate(task, model, task.validation, "validation", dist, lockstep=lockstep))
                    evaluated_at = step
                ctx.logger.log({"epoch": step // steps_per_epoch, **_only(final, "validation_")}, step)
            if (every and step % every == 0) or (not every and epoch_done):
                _save_checkpoint(ctx, model, optimizer, step, step // steps_per_epoch, strategy)
                checkpointed_at = step
            if step >= last_step:
                break
    elapsed = time.monotonic() - started
    if step > first_step:
        ctx.log(f"trained steps {first_step + 1}..{step} in {elapsed:.2f}s ({(step - first_step) / max(elapsed, 1e-9):.1f} steps/s)")
    if checkpointed_at != step and step > first_step:
        _save_checkpoint(ctx, model, optimizer, step, step // steps_per_epoch, strategy)
    if task.validation is not None and evaluated_at != step:
        final.update(evaluate(task, model, task.validation, "validation", dist, lockstep=lockstep))
        ctx.logger.log(_only(final, "validation_"), step)
    if task.test is not None:
        final.update(evaluate(task, model, task.test, "test", dist, lockstep=lockstep))
        ctx.logger.log(_only(final, "test_"), step)
    final["step"] = step
    return final


def _only(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {name: value for name, value in metrics.items() if name.startswith(prefix)}


# --- output --------------------------------------------------------------------------------
def save_model(ctx: Context, model: nn.Module, *, architecture: dict[str, Any], input_schema: dict[str, Any],
               labels: list[str] | None, metrics: dict[str, float], weights: dict[str, torch.Tensor] | None = None) -> None:
    """model/: model.safetensors, config.json (everything predict.py needs to rebuild the
    model and encode raw records) and labels.json (index → label). Rank 0 only. `weights`,
    when the model is split over processes: the whole model's state dict, gathered on rank 0."""
    if not ctx.dist.is_main:
        return
    from safetensors.torch import save_file

    model_dir = ctx.env.model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    state = model.state_dict() if weights is None else weights
    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"algorithm": ctx.spec.name})
    config = {
        "algorithm": ctx.spec.name,
        "format_version": 1,
        "framework": f"torch {torch.__version__}",
        "hyperparameters": ctx.hps,
        "architecture": architecture,
        "input": input_schema,
        "metrics": metrics,
        "world_size": ctx.dist.world_size,
        "distribution": ctx.distribution,
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if labels is not None:
        label_map = {str(index): label for index, label in enumerate(labels)}
        (model_dir / "labels.json").write_text(json.dumps(label_map, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    ctx.log(f"wrote {model_dir}: model.safetensors, config.json" + (", labels.json" if labels is not None else ""))
