"""The command line that starts a job's processes on one node: `torch.distributed.run`
(a subprocess, since torch.multiprocessing cannot spawn from a daemonic Celery
process) — pure functions, unit-tested for the single-node, multi-node and GPU forms.

Output: `--tee 3` sends each worker's stdout and stderr through spool files in `--log_dir`
to the launcher's own stdout and stderr, each line prefixed. The prefix template names the
*global* rank ("[rank3]:"), which the default ("[trainer<local_rank>]:") cannot tell
apart across nodes; jobs.runner.process.capture parses both forms.
"""

from __future__ import annotations

import re
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

ROLE = "trainer"
LINE_PREFIX_TEMPLATE = "[rank${rank}]:"
# Node 0 publishes "host:port" of its rendezvous store here; the other nodes of the attempt read it.
RENDEZVOUS_KEY = "trainyard:job:{job_id}:attempt:{attempt}:rendezvous"


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt: int
    python: str
    spool_dir: Path
    module: str = ""  # a built-in algorithm: run with -m
    script: str = ""  # a custom script: its path (relative to the code dir, the cwd)
    args: list[str] = field(default_factory=list)
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int | None = None  # None: one per GPU, else one
    gpus: int = 0
    rendezvous_endpoint: str = ""  # "host:port" of node 0's store; multi-node only

    def __post_init__(self) -> None:
        if bool(self.module) == bool(self.script):
            raise ValueError("a launch runs either a module or a script")
        if self.nnodes > 1 and not self.rendezvous_endpoint:
            raise ValueError("a multi-node launch needs node 0's rendezvous endpoint")

    @property
    def processes(self) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.gpus if self.gpus > 0 else 1

    @property
    def rendezvous_id(self) -> str:
        # One id per attempt: a retried job never joins the previous attempt's rendezvous.
        return f"job-{self.job_id}-{self.attempt}"


def build_command(spec: LaunchSpec) -> list[str]:
    command = [spec.python, "-m", "torch.distributed.run",
               "--nnodes", str(spec.nnodes), "--nproc_per_node", str(spec.processes)]
    if spec.nnodes == 1:
        # A private store on a free local port: nothing to share, nothing to collide with.
        command += ["--standalone"]
    else:
        # The static rendezvous: node i hosts global ranks i*p .. i*p+p-1 (c10d would
        # assign ranks in join order, ignoring --node_rank), so node 0 holds rank 0 — the
        # rank that writes the model node 0 uploads — and SM_HOSTS lists nodes in rank
        # order. Node 0 hosts the store at the endpoint it published.
        command += ["--node_rank", str(spec.node_rank), "--rdzv_backend", "static",
                    "--rdzv_endpoint", spec.rendezvous_endpoint, "--rdzv_id", spec.rendezvous_id]
    # No elastic restarts: a failed process ends the attempt; retries are the scheduler's,
    # with a fresh attempt number and directory.
    command += ["--max_restarts", "0", "--role", ROLE, "--tee", "3", "--log_dir", str(spec.spool_dir)]
    if spec.module:
        command += ["--module"]
    # "--": everything after it is the target and its arguments, never torchrun's options.
    # Without it torchrun's parser (abbreviations allowed) reads a hyperparameter `--start`
    # as an ambiguous prefix of --start-method and fails, or `--log` as --log_dir ...
    # (nothing between the launcher and the script parses them: docs/SPEC.md §3.5).
    return command + ["--", *(torchrun_literal(arg) for arg in (spec.module or spec.script, *spec.args))]


def torchrun_literal(arg: str) -> str:
    """`arg` escaped for torchrun's one rewrite of its workers' arguments: it substitutes
    `${local_rank}` in each with string.Template, which also turns `$$` into `$`. Escaped,
    every `$` reaches the process as it was given."""
    return arg.replace("$", "$$")


def launch_environment(spec: LaunchSpec) -> dict[str, str]:
    """Variables the launcher itself needs, beside the job's (jobs.runner.process.jobdir)."""
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LINE_PREFIX_TEMPLATE}
    if spec.gpus > 0:
        env.update({
            "TRAINYARD_DIST_BACKEND": "nccl",
            # A rank that dies mid-collective makes the others fail fast instead of hanging
            # until the NCCL timeout (minutes of a GPU node doing nothing).
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "NCCL_DEBUG": "WARN",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        })
    else:
        env["TRAINYARD_DIST_BACKEND"] = "gloo"
    return env


def free_port(host: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def default_node_address() -> str:
    """The address other nodes use to reach this one: the one the OS picks for the way
    out (no packet is sent), else the loopback address for a single machine."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed, only resolves a route
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"


# --- reading the launcher's verdict ------------------------------------------------------------
_ROOT_CAUSE = re.compile(r"Root Cause")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


@dataclass(frozen=True)
class RankFailure:
    rank: int | None  # global rank (from the root-cause block), None if unknown
    exit_code: int  # negative: killed by that signal


def parse_root_cause(launcher_lines: list[str]) -> RankFailure | None:
    """The first failed rank and its exit code, from torchrun's ChildFailedError summary
    ("Root Cause (first observed failure): ... rank : 1 (local_rank: 1) exitcode : 3").
    Falls back to the agent's "failed (exitcode: N) local_rank: K" line."""
    start = max((i for i, line in enumerate(launcher_lines) if _ROOT_CAUSE.search(line)), default=-1)
    if start >= 0:
        rank: int | None = None
        for line in launcher_lines[start + 1:start + 12]:
            if rank is None and (match := _RANK.match(line)):
                rank = int(match.group(1))
            elif match := _EXITCODE.match(line):
                return RankFailure(rank, int(match.group(1)))
    for line in reversed(launcher_lines):
        if match := _FAILED_LINE.search(line):
            return RankFailure(None, int(match.group(1)))
    return None


def describe_exit(code: int) -> str:
    """'exit code 3' or 'killed by SIGKILL'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
