"""The warm pool's fork server (jobs.runner.process.forkserver): a launch forked from a process that
has torch imported behaves like a torchrun launch — the workers' environment, rank-prefixed
output the capture parses, the root-cause summary, signals, no orphans — and starts far
faster than a cold interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest

from jobs.runner.process.capture import LAUNCHER_RANK, OutputCapture, split_prefix
from jobs.runner.process.forkserver import (
    LOST_RETURNCODE,
    STOP_GRACE_SECONDS,
    ForkedLaunch,
    ForkServer,
    ForkServerError,
    LaunchRequest,
    worker_environment,
)
from jobs.runner.process.launch import RankFailure, parse_root_cause

pytestmark = pytest.mark.slow

SERVER_ONLY = "TRAINYARD_TEST_SERVER_ONLY"
JOB_ONLY = "TRAINYARD_TEST_JOB_ONLY"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ForkServer]:
    folder = tmp_path_factory.mktemp("pool")
    started = ForkServer.start(socket_path=folder / "pool.sock", env={**os.environ, SERVER_ONLY: "server"})
    try:
        assert started.ready(timeout=30), "the fork server did not listen within 30 s"
        yield started
    finally:
        started.close()


def job_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", **extra}


def script(folder: Path, body: str, name: str = "job.py") -> str:
    (folder / name).write_text(textwrap.dedent(body))
    return name


def launch_script(server: ForkServer, folder: Path, body: str, *, nproc: int = 1, args: list[str] | None = None,
                  **env: str) -> ForkedLaunch:
    return server.launch(LaunchRequest(script=script(folder, body), args=args or [], env=job_env(**env),
                                       cwd=str(folder), nproc=nproc))


class Output:
    """Both pipes of a launch read to their end in the background, like the agent's capture."""

    def __init__(self, launch: ForkedLaunch) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((launch.stdout, self.out), (launch.stderr, self.err))]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(stream: IO[bytes], lines: list[str]) -> None:
        for raw in stream:
            lines.append(raw.decode().rstrip("\n"))

    def finish(self, timeout: float = 10) -> Output:
        for thread in self._threads:
            thread.join(timeout)
        assert not any(thread.is_alive() for thread in self._threads), "a launch pipe stayed open"
        return self

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.out):
            assert time.monotonic() < deadline, f"timed out; stdout so far: {self.out}, stderr: {self.err}"
            time.sleep(0.02)

    def rank_lines(self, rank: int, stream: str = "out") -> list[str]:
        return [text for r, text in map(split_prefix, getattr(self, stream)) if r == rank]

    def launcher_lines(self) -> list[str]:
        return [text for r, text in map(split_prefix, self.out + self.err) if r == LAUNCHER_RANK]


def pids_printed(lines: list[str]) -> list[int]:
    return [int(text.split("=", 1)[1]) for _, text in map(split_prefix, lines) if text.startswith("pid=")]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[pid for pid in pids if running(pid)]}"
        time.sleep(0.05)


SLEEPER = """
    import os, time
    print(f"pid={os.getpid()}", flush=True)
    time.sleep(60)
"""


# --- pure -------------------------------------------------------------------------------------
def test_worker_environment_numbers_ranks_across_nodes_like_torchrun():
    request = LaunchRequest(module="m", args=[], env={"KEEP": "1"}, cwd="/", nproc=2, nnodes=2, node_rank=1,
                            master_addr="10.0.0.1", master_port=29400, run_id="job-7-1")
    env = worker_environment(request, 1, 29400)
    assert env["KEEP"] == "1"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "4", "2")
    assert (env["GROUP_RANK"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("1", "3", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["TORCHELASTIC_RUN_ID"]) == ("10.0.0.1", "29400", "job-7-1")
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
    assert env["OMP_NUM_THREADS"] == "1"  # torchrun's default for several workers per node
    with pytest.raises(ValueError, match="either a module or a script"):
        LaunchRequest(module="m", script="s.py", args=[], env={}, cwd="/")
    with pytest.raises(ValueError, match="published port"):
        LaunchRequest(module="m", args=[], env={}, cwd="/", nnodes=2)


# --- launches ---------------------------------------------------------------------------------
def test_two_ranks_get_their_env_prefixed_output_and_only_the_jobs_environment(server, tmp_path):
    body = f"""
        import json, os, sys
        preloaded = "torch" in sys.modules
        import torch
        print(json.dumps({{"preloaded": preloaded, "rank": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"],
                          "world": os.environ["WORLD_SIZE"], "port": os.environ["MASTER_PORT"], "cwd": os.getcwd(),
                          "argv": sys.argv[1:], "job": os.environ.get("{JOB_ONLY}"),
                          "server": os.environ.get("{SERVER_ONLY}"), "threads": torch.get_num_threads()}}))
        print("to stderr", file=sys.stderr)
    """
    launch = launch_script(server, tmp_path, body, nproc=2, args=["--lr", "0.1"], **{JOB_ONLY: "job"})
    capture = OutputCapture(logs_dir=tmp_path, max_bytes=1 << 20, rules=[], publisher=None)
    capture.start(launch.stdout, launch.stderr)

    assert launch.wait(30) == 0
    assert capture.join(10)
    capture.close()
    assert sorted(capture.ranks) == [0, 1]  # every line parsed as a rank's: nothing from the launcher
    seen = {}
    for rank in (0, 1):
        # Both streams of a rank share its log file, in arrival order.
        seen[rank] = next(json.loads(line) for line in capture.log_path(rank).read_text().splitlines() if line[:1] == "{")
        assert capture.stderr_tail(rank) == ["to stderr"]
    assert seen[0]["preloaded"] and seen[1]["preloaded"]
    assert [(s["rank"], s["local_rank"], s["world"]) for s in seen.values()] == [("0", "0", "2"), ("1", "1", "2")]
    assert seen[0]["port"] == seen[1]["port"] != "0"
    assert {s["cwd"] for s in seen.values()} == {str(tmp_path)}
    assert seen[0]["argv"] == ["--lr", "0.1"]
    assert (seen[0]["job"], seen[0]["server"]) == ("job", None)
    assert seen[0]["threads"] == 1  # OMP_NUM_THREADS=1 reached torch's pool, set up in the server


def test_warm_launch_starts_far_faster_than_a_cold_torch_import(server, tmp_path):
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    cold = time.monotonic() - started

    started = time.monotonic()
    launch = launch_script(server, tmp_path, "import torch\nprint('first step', flush=True)\n")
    first_line = launch.stdout.readline()
    warm = time.monotonic() - started
    Output(launch).finish()

    assert first_line == b"[rank0]:first step\n"
    assert launch.wait(10) == 0
    print(f"warm launch to first line {warm * 1000:.0f} ms, cold `import torch` {cold * 1000:.0f} ms")
    assert warm < cold / 3


def test_two_forked_ranks_all_reduce_over_gloo(server, tmp_path):
    body = """
        import os
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.ones(1)
        dist.all_reduce(total)
        print(f"rank={dist.get_rank()} sum={int(total.item())} port={os.environ['MASTER_PORT']}", flush=True)
        dist.destroy_process_group()
    """
    launch = launch_script(server, tmp_path, body, nproc=2)
    output = Output(launch)

    assert launch.wait(60) == 0, output.finish().err
    output.finish()
    for rank in (0, 1):
        assert output.rank_lines(rank)[0].startswith(f"rank={rank} sum=2 ")


def test_failing_rank_ends_the_others_and_reports_the_root_cause(server, tmp_path):
    body = """
        import os, sys, time
        print(f"pid={os.getpid()}", flush=True)
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """
    started = time.monotonic()
    launch = launch_script(server, tmp_path, body, nproc=2)
    output = Output(launch)

    assert launch.wait(30) == 1
    output.finish()
    assert time.monotonic() - started < 15  # rank 0 was ended, not waited for
    assert parse_root_cause(output.launcher_lines()) == RankFailure(rank=1, exit_code=3)
    wait_gone(pids_printed(output.out))


def test_an_exception_exits_one_with_the_traceback_on_that_ranks_stderr(server, tmp_path):
    launch = launch_script(server, tmp_path, "raise ValueError('bad hyperparameter')\n")
    output = Output(launch)

    assert launch.wait(30) == 1
    output.finish()
    errors = output.rank_lines(0, "err")
    assert errors[0] == "Traceback (most recent call last):"
    assert errors[-1] == "ValueError: bad hyperparameter"
    assert parse_root_cause(output.launcher_lines()) == RankFailure(rank=0, exit_code=1)


def test_sigterm_to_the_launchers_group_ends_every_worker(server, tmp_path):
    launch = launch_script(server, tmp_path, SLEEPER, nproc=2)
    output = Output(launch)
    output.wait_for(lambda lines: len(pids_printed(lines)) == 2)
    workers = pids_printed(output.out)
    assert os.getpgid(launch.pid) == launch.pid  # the launcher leads the group the agent signals
    assert all(os.getpgid(pid) == launch.pid for pid in workers)

    os.killpg(launch.pid, signal.SIGTERM)

    assert launch.wait(10) == -signal.SIGTERM
    output.finish()
    wait_gone([launch.pid, *workers])


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace(server, tmp_path):
    body = """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"pid={os.getpid()}", flush=True)
        time.sleep(60)
    """
    launch = launch_script(server, tmp_path, body)
    output = Output(launch)
    output.wait_for(lambda lines: len(pids_printed(lines)) == 1)

    os.killpg(launch.pid, signal.SIGTERM)

    with pytest.raises(subprocess.TimeoutExpired):
        launch.wait(STOP_GRACE_SECONDS - 1)  # the launcher waits for it ...
    assert launch.wait(10) == -signal.SIGTERM  # ... then SIGKILLs it and ends as it was told
    wait_gone(pids_printed(output.out))
    output.finish()


def test_wait_times_out_while_running_and_poll_turns_to_the_exit_code(server, tmp_path):
    launch = launch_script(server, tmp_path, "import time\ntime.sleep(1.5)\nraise SystemExit(4)\n")
    output = Output(launch)

    assert launch.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        launch.wait(0.2)
    assert launch.wait(20) == 1  # a rank's exit 4 fails the launch, like torchrun
    assert launch.poll() == 1 and launch.returncode == 1
    output.finish()
    assert parse_root_cause(output.launcher_lines()) == RankFailure(rank=0, exit_code=4)


def test_one_server_takes_launches_in_sequence(server, tmp_path):
    launchers = []
    for number in range(3):
        launch = launch_script(server, tmp_path, "import sys\nprint('run', sys.argv[1])\n", args=[str(number)])
        output = Output(launch)
        assert launch.wait(20) == 0
        assert output.finish().rank_lines(0) == [f"run {number}"]
        launchers.append(launch.pid)
    assert len(set(launchers)) == 3
    assert server.alive()


def test_a_killed_launcher_takes_its_workers_with_it(server, tmp_path):
    launch = launch_script(server, tmp_path, SLEEPER, nproc=2)
    output = Output(launch)
    output.wait_for(lambda lines: len(pids_printed(lines)) == 2)

    os.kill(launch.pid, signal.SIGKILL)  # the launcher alone: no SIGTERM forwarding possible

    assert launch.wait(10) == -signal.SIGKILL
    wait_gone(pids_printed(output.out))
    output.finish()


def test_a_killed_server_ends_its_launches_and_wait_still_returns(tmp_path):
    own = ForkServer.start(socket_path=tmp_path / "pool.sock")
    try:
        assert own.ready(timeout=30)
        launch = launch_script(own, tmp_path, SLEEPER, nproc=2)
        output = Output(launch)
        output.wait_for(lambda lines: len(pids_printed(lines)) == 2)

        os.kill(own.pid, signal.SIGKILL)

        assert launch.wait(15) == LOST_RETURNCODE
        wait_gone([launch.pid, *pids_printed(output.out)])
        output.finish()
        with pytest.raises(ForkServerError, match="has exited"):
            own.launch(LaunchRequest(script="job.py", args=[], env=job_env(), cwd=str(tmp_path)))
    finally:
        own.close()


def test_a_bad_launch_is_refused_and_the_pool_stays(server, tmp_path):
    with pytest.raises(ForkServerError, match="is not a directory"):
        server.launch(LaunchRequest(script="job.py", args=[], env=job_env(), cwd=str(tmp_path / "missing")))
    launch = launch_script(server, tmp_path, "print('still serving')\n")
    assert launch.wait(20) == 0
    assert Output(launch).finish().rank_lines(0) == ["still serving"]


def test_a_preload_that_fails_to_import_never_gets_ready(tmp_path):
    broken = ForkServer.start(socket_path=tmp_path / "pool.sock", preload=("trainyard_no_such_module",))
    try:
        assert not broken.ready(timeout=20)
        broken.process.wait(10)
        assert not broken.alive()
        with pytest.raises(ForkServerError, match="has exited"):
            broken.launch(LaunchRequest(script="job.py", args=[], env=job_env(), cwd=str(tmp_path)))
    finally:
        broken.close()
