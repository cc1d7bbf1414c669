"""Process supervision for `studio up`: start children, tag their output, notice a death,
and stop everything without leaving orphans.

Each child gets its own process group (start_new_session), so one signal reaches the
child and everything it forked (gunicorn's workers, Celery's pool and embedded beat), and
a Ctrl-C in the terminal reaches only the supervisor, which then stops the children in
order instead of all of them racing the same SIGINT. On Linux each child also asks the
kernel for SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), so even a SIGKILLed
supervisor does not leave a half-studio running: that signal reaches only the child, so a
reaper process (studio/reaper.py) outside the supervisor then signals each child's whole
group and kills what has not stopped after the grace period.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from io import TextIOBase
from pathlib import Path
from typing import TextIO

PR_SET_PDEATHSIG = 1


@dataclass
class ChildSpec:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen
    pump: threading.Thread | None = field(default=None)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.process.pid

    def group_alive(self) -> bool:
        """True while any process of the child's group exists (the child itself or
        something it forked that outlived it)."""
        if self.process.poll() is None:
            return True
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            # The group id was reused by another user's process: nothing of ours is left.
            return False
        return True

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)


def die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive SIGTERM when the supervisor dies (Linux).

    libc and prctl are resolved here, in the parent: the hook runs between fork and exec,
    where loading a library or taking an import lock could deadlock."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    parent_pid = os.getpid()
    sigterm = int(signal.SIGTERM)

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        # The parent may have died between fork and prctl; then no signal would ever come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sigterm)

    return hook


class Reaper:
    """The supervisor's side of studio/reaper.py: tell it each process group to end should
    the supervisor die, and tell it `done` once the supervisor has stopped them itself.
    Used from the supervisor's main thread only. Without Linux's PDEATHSIG, or if the
    reaper cannot start, there is none, and the children are on their own as before."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.process: subprocess.Popen | None = None

    def _send(self, line: str) -> None:
        if self.process is None and not line.startswith("+"):
            return
        if self.process is None:
            if not sys.platform.startswith("linux"):
                return
            # Its own session: a Ctrl-C or a signal to the supervisor's group is not for it.
            # Standard error is the supervisor's, so what it did shows where the studio's output goes.
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("reaper.py")), str(self.grace)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True, text=True,
            )
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()

    def watch(self, pgid: int, name: str) -> None:
        self._send(f"+{pgid} {name}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def release(self, timeout: float = 5.0) -> None:
        """Everything is stopped: the reaper exits without signalling anything."""
        if self.process is None:
            return
        self._send("done")
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class Supervisor:
    """Children started together, output merged onto one stream as `name | line`."""

    def __init__(self, out: TextIO | TextIOBase | None = None, grace: float = 15.0) -> None:
        self.out = out or sys.stdout
        self.children: list[Child] = []
        self.reaper = Reaper(grace)
        self._write_lock = threading.Lock()
        self._width = 0

    # --- output ----------------------------------------------------------------------
    def say(self, text: str = "") -> None:
        with self._write_lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _pump(self, child: Child) -> None:
        stream = child.process.stdout
        assert stream is not None
        prefix = f"{child.name:<{self._width}} | "
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with self._write_lock:
                self.out.write(prefix + line + "\n")
                self.out.flush()
        stream.close()

    # --- life cycle ------------------------------------------------------------------
    def start(self, specs: list[ChildSpec]) -> list[Child]:
        """Start every child, then the threads that copy their output. Forking before any
        pump thread exists keeps preexec_fn away from threads holding locks (the reason
        Python calls preexec_fn unsafe with threads); pipes buffer the first lines."""
        hook = die_with_parent_hook()
        self._width = max([self._width, *(len(spec.name) for spec in specs)])
        started: list[Child] = []
        for spec in specs:
            process = subprocess.Popen(
                spec.argv, cwd=spec.cwd, env=spec.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=hook,  # noqa: PLW1509 - see docstring
            )
            child = Child(spec=spec, process=process)
            started.append(child)
            self.children.append(child)
            self.reaper.watch(process.pid, spec.name)
        for child in started:
            child.pump = threading.Thread(target=self._pump, args=(child,), name=f"output-{child.name}", daemon=True)
            child.pump.start()
        return started

    def restart(self, child: Child) -> Child:
        """Start a dead child again with the same spec, in its place. Pump threads exist
        by now; the preexec hook only calls prctl and getppid, resolved beforehand, so it
        takes no lock a thread could hold across the fork."""
        process = subprocess.Popen(
            child.spec.argv, cwd=child.spec.cwd, env=child.spec.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent_hook(),  # noqa: PLW1509
        )
        fresh = Child(spec=child.spec, process=process)
        self.children[self.children.index(child)] = fresh
        self.reaper.watch(process.pid, fresh.name)
        if not child.group_alive():
            self.reaper.forget(child.pid)
        fresh.pump = threading.Thread(target=self._pump, args=(fresh,), name=f"output-{fresh.name}", daemon=True)
        fresh.pump.start()
        return fresh

    def exited(self) -> Child | None:
        """The first child whose main process has ended, if any."""
        for child in self.children:
            if child.process.poll() is not None:
                return child
        return None

    def watch(self, stop: threading.Event, until: Callable[[], bool] | None = None, timeout: float | None = None,
              interval: float = 0.2) -> str:
        """Wait for the first of: a stop request ("stop"), a child's death ("exited"),
        `until()` becoming true ("ready") or the timeout ("timeout")."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if stop.is_set():
                return "stop"
            if self.exited() is not None:
                return "exited"
            if until is not None and until():
                return "ready"
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            stop.wait(interval)

    def stop(self, grace: float = 15.0, kill_wait: float = 3.0) -> list[str]:
        """SIGTERM every child's group, wait up to `grace` seconds, SIGKILL what is left.
        Returns the names of children that had to be killed."""
        for child in self.children:
            if child.group_alive():
                child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(child.group_alive() for child in self.children):
            time.sleep(0.1)
        killed = [child.name for child in self.children if child.group_alive()]
        for child in self.children:
            if child.group_alive():
                child.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + kill_wait
        while time.monotonic() < deadline and any(child.group_alive() for child in self.children):
            time.sleep(0.05)
        for child in self.children:
            if child.pump is not None:
                child.pump.join(2.0)
        return killed
