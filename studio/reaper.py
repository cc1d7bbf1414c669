"""The reaper of `studio up`: a small process outside the supervisor that ends what the
supervisor started when the supervisor itself dies without stopping them (SIGKILL, an
out-of-memory kill, a crash in C).

PR_SET_PDEATHSIG sends each child SIGTERM when the supervisor dies, but only the child:
gunicorn's workers, Celery's pool and anything a child forked get nothing, and a child that
is slow to stop (a warm shutdown waiting on a task, a Redis that cannot write its file) is
never killed. The reaper does what Supervisor.stop does on an orderly stop: SIGTERM to each
child's process group, a grace period, then SIGKILL to whatever is left.

It is run as a file (`python studio/reaper.py`), not as a module of the `studio` package,
so that it starts without Django or Celery. Protocol on standard input, one line each:

    +PGID NAME   watch this process group
    -PGID        forget it (it ended and was started again under another id)
    done         the supervisor stopped everything itself: exit without signalling

End of input without `done` means the supervisor died: reap, then exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def reap(groups: dict[int, str], grace: float, say=print) -> list[str]:
    """SIGTERM every group, wait up to `grace` seconds for all to end, SIGKILL the rest.
    Returns the names of the groups that had to be killed."""
    for pgid in groups:
        _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pgid) for pgid in groups):
        time.sleep(0.1)
    killed = [name for pgid, name in groups.items() if _alive(pgid)]
    for pgid in groups:
        _signal(pgid, signal.SIGKILL)
    if killed:
        say(f"reaper: killed after {grace:g} s without stopping: {', '.join(killed)}")
    return killed


def main(argv: list[str]) -> int:
    grace = float(argv[1]) if len(argv) > 1 else 15.0
    # Ctrl-C in the terminal is the supervisor's to handle; the reaper waits for the outcome.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: dict[int, str] = {}
    for line in sys.stdin:
        command = line.strip()
        if command == "done":
            return 0
        if command.startswith("+"):
            pgid, _, name = command[1:].partition(" ")
            groups[int(pgid)] = name or pgid
        elif command.startswith("-"):
            groups.pop(int(command[1:]), None)
    if groups:
        print(f"reaper: the supervisor is gone; stopping {', '.join(groups.values())}", file=sys.stderr, flush=True)
        reap(groups, grace, say=lambda text: print(text, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
