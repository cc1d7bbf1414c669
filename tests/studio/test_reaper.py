"""The reaper ends what a SIGKILLed supervisor started, grandchildren and children that
ignore SIGTERM included, and leaves alone what an orderly stop already handled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from studio.supervisor import Reaper
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper stands behind PR_SET_PDEATHSIG (Linux)")

# A child that ignores SIGTERM (PDEATHSIG cannot stop it) and forks a grandchild that
# inherits that; both report their pid.
STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.fork(); "
            "print(os.getpid(), flush=True); time.sleep(600)")

SUPERVISOR = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from studio.supervisor import ChildSpec, Supervisor
supervisor = Supervisor(grace=1.5)
supervisor.start([ChildSpec(name="stubborn", argv=[sys.executable, "-c", {STUBBORN!r}])])
print("started", flush=True)
time.sleep(600)
"""


def _alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def test_a_killed_supervisors_stubborn_child_and_grandchild_are_killed_after_the_grace(tmp_path):
    log = tmp_path / "supervisor.log"
    with log.open("w") as out:
        supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, stderr=out, text=True)
    try:
        assert supervisor.stdout is not None
        assert supervisor.stdout.readline().strip() == "started", log.read_text()
        def stubborn_and_reaper() -> list[int] | None:
            processes = psutil.Process(supervisor.pid).children(recursive=True)
            stubborn = [p.pid for p in processes if "signal.SIG_IGN" in " ".join(p.cmdline())]
            reapers = [p for p in processes if "reaper.py" in " ".join(p.cmdline())]
            return stubborn if len(stubborn) == 2 and reapers else None

        tree = wait_for(stubborn_and_reaper, timeout=20, message="the child, its grandchild and the reaper")
        assert len(tree) == 2
        started = time.monotonic()
        supervisor.kill()
        supervisor.wait()
        time.sleep(0.5)
        assert len(_alive(tree)) == 2, "they ignore SIGTERM: only the reaper's SIGKILL ends them"
        wait_for(lambda: _alive(tree) == [], timeout=20, message="the reaper to kill the child and grandchild")
        assert time.monotonic() - started >= 1.4
        wait_for(lambda: "killed after 1.5 s without stopping: stubborn" in log.read_text(), timeout=10,
                 message="the reaper to say what it killed")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        for pid in _alive(locals().get("tree") or []):
            psutil.Process(pid).kill()


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


def test_released_reaper_signals_nothing_and_a_dropped_one_stops_its_groups():
    kept, stopped = _sleeper(), _sleeper()
    try:
        released = Reaper(grace=5)
        released.watch(kept.pid, "kept")
        reaper_process = released.process
        assert reaper_process is not None
        released.release()
        assert reaper_process.returncode == 0
        time.sleep(0.3)
        assert kept.poll() is None, "`done` must leave the groups alone"

        dropped = Reaper(grace=5)
        dropped.watch(stopped.pid, "stopped")
        dropped.forget(12345678)  # an unknown group is ignored
        assert dropped.process is not None and dropped.process.stdin is not None
        dropped.process.stdin.close()  # what the supervisor's death looks like to the reaper
        assert stopped.wait(10) == -signal.SIGTERM
        assert dropped.process.wait(10) == 0
        assert kept.poll() is None
    finally:
        for process in (kept, stopped):
            if process.poll() is None:
                process.kill()
                process.wait()
