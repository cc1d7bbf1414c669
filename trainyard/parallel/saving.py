"""Sharded checkpoints of a wrapped model, over torch.distributed.checkpoint (DCP):

    trainyard.parallel.save({"model": model, "optimizer": optimizer, "epoch": epoch}, step)
    step = trainyard.parallel.load({"model": model, "optimizer": optimizer, "epoch": 0})  # None: none yet

Every process writes its own part: FSDP its shards, a pipeline each stage's blocks, DDP
one copy of what all hold. Keys are the script's parameter names, so a checkpoint loads
into another world size (FSDP reshards), another partition of the pipeline, or one process.
Other values in the dict (numbers, lists, tensors) are the same on every rank (rank 0's are
kept) and come back in place.

Layout in SM_CHECKPOINT_DIR, which the node agent syncs to the job's checkpoint URI (hidden
names are not synced) and restores before a resumed attempt:
- `.step-<N>.partial/`: being written;
- `step-<N>/`: DCP's files, renamed from the partial folder once every rank has written;
  complete once `metadata` is there, a visible copy of DCP's `.metadata` written last
  (the sync skips hidden names; load puts it back);
- the newest KEEP_NEWEST are kept.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from trainyard import checkpoints
from trainyard.errors import DataError
from trainyard.parallel.context import Context, current
from trainyard.parallel.processes import emit

KEEP_NEWEST = 2
MARKER = "metadata"  # the visible copy of DCP's .metadata: a step folder with it is complete
_DCP_METADATA = ".metadata"
_STEP = re.compile(r"^step-(\d+)$")


def step_folder(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}"


def checkpoint_dir() -> Path:
    return Path(os.environ.get("SM_CHECKPOINT_DIR") or "/opt/ml/checkpoints")


def complete_steps(directory: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete sharded checkpoint here, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _STEP.match(entry.name)
        if match and entry.is_dir() and ((entry / MARKER).is_file() or (entry / _DCP_METADATA).is_file()):
            found.append((int(match.group(1)), entry))
    return sorted(found)


# --- what is saved ---------------------------------------------------------------------------------
def _module(value: Any) -> nn.Module:
    """The module whose state this process keeps (a pipeline: its stage; else the model)."""
    return getattr(value, "state_module", value)


def _optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by the parameters' names in `module` (only theirs: an
    optimizer made over a whole pipelined model has state only for this stage)."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    groups = {id(parameter): index for index, group in enumerate(optimizer.param_groups) for parameter in group["params"]}
    state: dict[str, Any] = {}
    for parameter, values in optimizer.state.items():
        name = names.get(id(parameter))
        if name is not None:
            state[name] = {"values": dict(values), "group": groups.get(id(parameter), 0)}
    hyper = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    return {"state": state, "param_groups": hyper}


def _initialise(module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of `module` optimizer state of the right shapes (one step with
    zero gradients at learning rate 0), so DCP has tensors to load into."""
    parameters = [parameter for parameter in module.parameters()
                  if parameter.requires_grad and parameter not in optimizer.state]
    if not parameters:
        return
    kept = [(parameter, parameter.grad) for parameter in module.parameters()]
    rates = [group["lr"] for group in optimizer.param_groups]
    for parameter, _ in kept:
        parameter.grad = torch.zeros_like(parameter) if parameter.requires_grad else None
    for group in optimizer.param_groups:
        group["lr"] = 0.0 if not isinstance(group["lr"], torch.Tensor) else group["lr"].fill_(0.0)
    try:
        optimizer.step()
    finally:
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        for parameter, grad in kept:
            parameter.grad = grad


def _state(items: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, nn.Module, torch.optim.Optimizer | None]]]:
    """(the dict DCP saves or fills, the modules and optimizers it came from)."""
    module: nn.Module | None = None
    for value in items.values():
        if isinstance(value, nn.Module):
            module = _module(value)
    state: dict[str, Any] = {}
    parts: list[tuple[str, nn.Module, torch.optim.Optimizer | None]] = []
    for key, value in items.items():
        if isinstance(value, nn.Module):
            state[key] = get_model_state_dict(_module(value))
            parts.append((key, _module(value), None))
        elif isinstance(value, torch.optim.Optimizer):
            if module is None:
                raise ValueError("save/load: an optimizer needs the model beside it in the dict")
            state[key] = _optimizer_state(module, value)
            parts.append((key, module, value))
        else:
            state[key] = value
    return state, parts


# --- save ------------------------------------------------------------------------------------------
def save(items: Mapping[str, Any], step: int, *, directory: str | os.PathLike[str] | None = None,
         keep: int = KEEP_NEWEST) -> Path:
    """Every rank calls it (collective). Returns the step's folder."""
    ctx = current()
    folder = Path(directory) if directory is not None else checkpoint_dir()
    state, _ = _state(items)
    partial = folder / f".step-{step:09d}.partial"
    final = step_folder(folder, step)
    if ctx.local_rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
    ctx.barrier()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(partial)))
    ctx.barrier()
    if ctx.local_rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        checkpoints.fsync_directory(folder)
    ctx.barrier()
    if ctx.is_main:
        _write_visible(final / MARKER, (final / _DCP_METADATA).read_bytes())
        _write_visible(final / "trainyard.json", json.dumps({"step": step, "world_size": ctx.world_size,
                                                             "kind": ctx.kind}).encode())
    if ctx.local_rank == 0:
        _rotate(folder, keep)
    ctx.barrier()
    return final


def _write_visible(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def _rotate(folder: Path, keep: int) -> None:
    steps = sorted((int(match.group(1)), entry) for entry in folder.iterdir() if (match := _STEP.match(entry.name)))
    for _, entry in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(entry, ignore_errors=True)
    for entry in folder.glob(".step-*.partial"):
        if entry.name != f".step-{steps[-1][0]:09d}.partial" if steps else True:
            shutil.rmtree(entry, ignore_errors=True)


# --- load ------------------------------------------------------------------------------------------
def load(items: MutableMapping[str, Any], *, directory: str | os.PathLike[str] | None = None,
         step: int | None = None) -> int | None:
    """Every rank calls it (collective). Loads the newest complete checkpoint (or `step`)
    into the model and optimizer in `items` and replaces its other values; returns its step,
    None when there is none. A checkpoint that does not fit the model is a DataError saying
    what differs."""
    ctx = current()
    folder = Path(directory) if directory is not None else checkpoint_dir()
    chosen = _agreed_step(ctx, folder, step)
    if chosen is None:
        return None
    path = step_folder(folder, chosen)
    if not path.is_dir():
        raise DataError(f"checkpoint step {chosen} is not in {folder} on this node ({ctx.rank=})")
    if not (path / _DCP_METADATA).is_file() and (path / MARKER).is_file():
        # Restored by the node agent, which syncs visible names only: DCP reads .metadata.
        _write_visible(path / _DCP_METADATA, (path / MARKER).read_bytes())
    for _, module, optimizer in _parts(items):
        if optimizer is not None:
            _initialise(module, optimizer)
    state, parts = _state(items)
    unknown = sorted(_saved_model_keys(path, items) - _model_keys(items))
    if unknown:
        raise DataError(f"checkpoint {path.name} does not fit this model (were the architecture or its "
                        f"hyperparameters changed?): the model has no {', '.join(unknown[:5])}")
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)))
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        cause: BaseException = exc
        if isinstance(exc, CheckpointException) and exc.failures:
            cause = next(iter(exc.failures.values()))[0]
        raise DataError(f"checkpoint {path.name} does not fit this model (were the architecture or its "
                        f"hyperparameters changed?): {_first_line(cause)}") from None
    for key, module, optimizer in parts:
        if optimizer is None:
            set_model_state_dict(module, state[key])
        else:
            _restore_optimizer(module, optimizer, state[key])
    for key, value in state.items():
        if key not in {part[0] for part in parts}:
            items[key] = value
    return chosen


def _parts(items: Mapping[str, Any]) -> list[tuple[str, nn.Module, torch.optim.Optimizer | None]]:
    module = next((_module(value) for value in items.values() if isinstance(value, nn.Module)), None)
    return [(key, module, value) for key, value in items.items()
            if isinstance(value, torch.optim.Optimizer) and module is not None]


def _restore_optimizer(module: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """DCP loaded the state tensors in place; the hyperparameters (a scheduled lr, …) and
    non-tensor values come back here."""
    parameters = dict(module.named_parameters())
    for name, entry in saved["state"].items():
        parameter = parameters.get(name)
        if parameter is None:
            continue
        current_state = optimizer.state[parameter]
        for key, value in entry["values"].items():
            if not isinstance(value, torch.Tensor) or key not in current_state:
                current_state[key] = value
    for group, hyper in zip(optimizer.param_groups, saved["param_groups"], strict=False):
        for key, value in hyper.items():
            if isinstance(group.get(key), torch.Tensor) and not isinstance(value, torch.Tensor):
                group[key].fill_(value)
            else:
                group[key] = value


def _agreed_step(ctx: Context, folder: Path, wanted: int | None) -> int | None:
    """Rank 0's newest complete step (or `wanted` if it is complete there), on every rank."""
    box: list[Any] = [None]
    if ctx.is_main:
        steps = {number: path for number, path in complete_steps(folder) if _whole(path)}
        if wanted is not None:
            box[0] = wanted if wanted in steps else ("missing", wanted)
        else:
            box[0] = max(steps) if steps else None
    if ctx.world_size > 1:
        torch.distributed.broadcast_object_list(box, src=0)
    if isinstance(box[0], tuple):
        raise DataError(f"no complete checkpoint of step {box[0][1]} in {folder}")
    return box[0]


def _whole(path: Path) -> bool:
    """Every file the checkpoint's metadata names is here, at least as long as it says: a
    checkpoint whose node died before its sync uploaded that node's shards is passed over
    for an older one. Read at the start of an attempt, after the agent restored every
    node's files."""
    if not (path / _DCP_METADATA).is_file() and (path / MARKER).is_file():
        _write_visible(path / _DCP_METADATA, (path / MARKER).read_bytes())
    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as exc:
        emit(f"warning: checkpoint {path.name} has unreadable metadata ({_first_line(exc)}); trying an older one")
        return False
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), int(info.offset) + int(info.length))
    missing = [name for name, size in needed.items()
               if not (path / name).is_file() or (path / name).stat().st_size < size]
    if missing:
        emit(f"warning: checkpoint {path.name} lacks {', '.join(sorted(missing)[:4])} (a node's part that never "
             "reached the store); trying an older one")
        return False
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:400]


# --- the whole model ---------------------------------------------------------------------------------
def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict, unsharded and on the CPU, under the script's names, on
    rank 0; {} on the others. Every rank calls it (it gathers shards or stages): what a
    script saves to SM_MODEL_DIR at the end."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.tensor import DTensor

    ctx = current()
    built: nn.Module = getattr(model, "model", model)
    stage = _module(model)
    if stage is not built:  # a pipeline: each stage holds its blocks
        piece = {name: tensor.detach().cpu() for name, tensor in stage.state_dict().items()}
        pieces: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
        torch.distributed.gather_object(piece, pieces, dst=0)
        whole: dict[str, torch.Tensor] = {}
        for part in pieces or []:
            whole.update(part)
        return whole
    if any(isinstance(parameter, DTensor) for parameter in built.parameters()):
        gathered = get_model_state_dict(built, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {name: value for name, value in gathered.items() if isinstance(value, torch.Tensor)}
    return {name: tensor.detach().cpu() for name, tensor in built.state_dict().items()} if ctx.is_main else {}


def _model_keys(items: Mapping[str, Any]) -> set[str]:
    """The names the script's whole model has (a pipeline stage loads a part of them)."""
    return {f"{key}.{name}" for key, value in items.items() if isinstance(value, nn.Module)
            for name in get_model_state_dict(getattr(value, "model", value))}


def _saved_model_keys(path: Path, items: Mapping[str, Any]) -> set[str]:
    """The model entries a checkpoint holds."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    prefixes = tuple(f"{key}." for key, value in items.items() if isinstance(value, nn.Module))
    return {key for key in metadata.state_dict_metadata if key.startswith(prefixes)}
