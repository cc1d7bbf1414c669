"""How a launch ended, in words a person can act on (`failure_reason`, docs/SPEC.md §3.3).

Pure: the agent hands in what it observed (exit code, what the guard did, the launcher's
last lines, each rank's stderr tail, the job directory) and gets a verdict back.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from jobs.runner.process.launch import RankFailure, describe_exit, parse_root_cause

FAILURE_FILE_CHARS = 4000
TAIL_LINES_IN_REASON = 20
TAIL_CHARS_IN_REASON = 3000


@dataclass(frozen=True)
class Observed:
    returncode: int  # the launcher's
    guard_verdict: str  # set when the guard killed the job (memory, fork bomb)
    killed_by_us: bool  # a stop, a runtime limit or the guard sent the signals
    failure_file: Path
    model_dir: Path
    launcher_lines: list[str]
    stderr_tail: Callable[[int], list[str]]
    ranks: list[int]  # ranks that printed anything, lowest first
    teardown_abort_ranks: set[int]
    leader: bool = True  # node 0 of the attempt: its rank 0 writes the model


@dataclass(frozen=True)
class Verdict:
    succeeded: bool
    reason: str = ""  # failure_reason when not succeeded
    note: str = ""  # a timeline note (a teardown abort that did not cost the result)
    exit_code: int = 0  # of the first failed rank when known, else the launcher's
    leader_decides: bool = False  # a teardown abort on another node: the result is rank 0's, on node 0


def read_failure_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
    if len(text) > FAILURE_FILE_CHARS:
        text = text[:FAILURE_FILE_CHARS] + " …"
    return text


def judge(observed: Observed) -> Verdict:
    """1. Exit 0 → success. 2. The guard's verdict. 3. A teardown abort after rank 0
    recorded its result (gloo's "terminate called without an active exception",
    which it prints while tearing down after a clean run) → success, noted; on a node other
    than node 0 the model is not here to see, so the verdict is a failure that node 0's
    result may overrule (leader_decides). 4. The script's own words in output/failure. 5. The
    first failed rank's last stderr lines with its exit code or signal."""
    if observed.returncode == 0 and not observed.guard_verdict:
        return Verdict(True)
    if observed.guard_verdict:
        return Verdict(False, observed.guard_verdict, exit_code=observed.returncode)
    root = parse_root_cause(observed.launcher_lines)
    exit_code = root.exit_code if root else observed.returncode
    written = read_failure_file(observed.failure_file)
    aborted = bool(observed.teardown_abort_ranks) or exit_code == -signal.SIGABRT
    if aborted and not written and _has_files(observed.model_dir) and observed.teardown_abort_ranks:
        ranks = ", ".join(str(r) for r in sorted(observed.teardown_abort_ranks))
        return Verdict(True, note=(f"teardown abort after training finished: rank {ranks} aborted at exit "
                                   "(\"terminate called without an active exception\", a known gloo shutdown crash) "
                                   "after rank 0 had written the model; the result stands"), exit_code=exit_code)
    if written:
        return Verdict(False, written, exit_code=exit_code)
    verdict = _failed_rank(observed, root, exit_code)
    if aborted and observed.teardown_abort_ranks and not observed.leader:
        return replace(verdict, leader_decides=True)
    return verdict


def _failed_rank(observed: Observed, root: RankFailure | None, exit_code: int) -> Verdict:
    rank = root.rank if root and root.rank is not None else _first_rank_with_stderr(observed)
    how = describe_exit(exit_code)
    if exit_code == -signal.SIGKILL and not observed.killed_by_us:
        how += " (likely out of memory: the kernel's OOM killer sends SIGKILL)"
    who = f"rank {rank}" if rank is not None else "the launcher"
    tail = observed.stderr_tail(rank) if rank is not None else observed.launcher_lines[-TAIL_LINES_IN_REASON:]
    tail = [line for line in tail if line.strip()][-TAIL_LINES_IN_REASON:]
    text = "\n".join(tail)
    if len(text) > TAIL_CHARS_IN_REASON:
        text = "…" + text[-TAIL_CHARS_IN_REASON:]
    if text:
        return Verdict(False, f"{who} failed ({how}); the last lines of its stderr:\n{text}", exit_code=exit_code)
    return Verdict(False, f"{who} failed ({how}) without writing anything to stderr", exit_code=exit_code)


def _first_rank_with_stderr(observed: Observed) -> int | None:
    for rank in observed.ranks:
        if rank >= 0 and observed.stderr_tail(rank):
            return rank
    return None


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))
