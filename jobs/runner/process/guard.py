"""Keeping a job inside its limits, and ending it.

ProcessGuard samples the job's process tree every half second: resident memory summed over
the job's processes (the launcher, our own torchrun process, is not counted) against the
job's limit, and the number of processes against a fork-bomb cap. Over either → the whole
group is SIGKILLed at once (no grace: memory that keeps growing would take the node down
first) and the verdict becomes the job's failure reason. It also trims torchrun's --tee
spool files behind their reader, so a job printing for days does not fill the disk.

SystemSampler publishes the node's CPU, memory and GPU use to SYSTEM_STREAM every few seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from trainyard.protocol import SYSTEM_STREAM, SYSTEM_STREAM_MAXLEN, key

log = logging.getLogger(__name__)
MIB = 1024 * 1024
# Every process of a job carries this variable with a value of its own launch (the way
# Jenkins finds a build's processes): a descendant that left the tree — its parent died and
# it was reparented, or it called setsid — is still found and ended with the job.
JOB_MARK_VARIABLE = "TRAINYARD_JOB_MARK"
SPOOL_TRIM_THRESHOLD = 64 * MIB  # spool files smaller than this are left alone
SPOOL_READER_MARGIN = 8 * MIB  # never punch closer than this behind the reader's file position


# --- ending a process group ---------------------------------------------------------------------
def signal_group(pgid: int, sig: int, extra_pids: set[int] | frozenset[int] = frozenset()) -> None:
    """Signal the group, and processes of the job that left it (setsid) but were seen.
    Never our own group: the worker must outlive every job it runs."""
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to signal process group {pgid}: it is not a job's")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in extra_pids - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def group_alive(process: subprocess.Popen, pgid: int) -> bool:
    process.poll()  # reap the launcher, or its zombie keeps the group "alive"
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def any_alive(pids: set[int]) -> bool:
    """True while one of the processes runs (a zombie has ended; its parent reaps it)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def new_job_mark() -> str:
    return uuid.uuid4().hex


def marked_pids(mark: str) -> set[int]:
    """Live processes whose environment carries `mark` (ours excepted). Only processes
    of our own user can be read, which is where a job's processes run. Linux only."""
    if not mark or not sys.platform.startswith("linux"):
        return set()
    needle = f"{JOB_MARK_VARIABLE}={mark}".encode()
    found: set[int] = set()
    own = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        if needle in variables:
            found.add(int(entry.name))
    return found


def end_group(process: subprocess.Popen, pgid: int, *, grace: float, extra_pids: set[int] | None = None,
              mark: str = "") -> bool:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL until the group is empty.
    Returns True if SIGKILL was needed. torchrun starts each worker in a session of its
    own, so the job's processes outside the launcher's group (`extra_pids`, seen by the
    guard, and those carrying the job's `mark`) count too: a worker's child that ignores
    SIGTERM must not outlive the job, even once its parent has died."""
    extra = (extra_pids or set()) | marked_pids(mark)
    signal_group(pgid, signal.SIGTERM, extra)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_alive(process, pgid) and not any_alive(extra | marked_pids(mark)):
            return False
        time.sleep(0.1)
    kill_group(process, pgid, extra, mark=mark)
    return True


def kill_group(process: subprocess.Popen, pgid: int, extra_pids: set[int] | None = None, timeout: float = 10.0,
               mark: str = "") -> None:
    """SIGKILL, again and again: a fork bomb makes new members while the first kill lands.
    The marked processes are looked up afresh each round for the same reason."""
    extra = extra_pids or set()
    deadline = time.monotonic() + timeout
    targets = extra | marked_pids(mark)
    while True:
        signal_group(pgid, signal.SIGKILL, targets)
        targets = extra | marked_pids(mark)  # one /proc scan a round: what is still there is signalled next
        if (not group_alive(process, pgid) and not any_alive(targets)) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


# --- limits --------------------------------------------------------------------------------------
class ProcessGuard(threading.Thread):
    def __init__(self, process: subprocess.Popen, *, memory_limit_bytes: int, max_processes: int,
                 spool_dir: Path | None = None, interval: float = 0.5, mark: str = "") -> None:
        super().__init__(name=f"guard-{process.pid}", daemon=True)
        self.process = process
        self.pgid = process.pid  # start_new_session: the launcher leads its own group
        self.memory_limit_bytes = memory_limit_bytes
        self.max_processes = max_processes
        self.spool_dir = spool_dir
        self.interval = interval
        self.mark = mark  # the job's JOB_MARK_VARIABLE value
        self.verdict = ""  # set once, when a limit was broken and the group killed
        self.peak_rss = 0
        self.seen_pids: set[int] = set()
        self._punched: dict[str, int] = {}
        self._stopping = threading.Event()
        self._ticks = 0

    def run(self) -> None:
        while not self._stopping.wait(self.interval) and self.process.poll() is None:
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a sampling hiccup must not end the guard
                log.exception("process guard sample failed")

    def check(self) -> None:
        rss, count = self.sample()
        self.peak_rss = max(self.peak_rss, rss)
        if rss > self.memory_limit_bytes:
            self.trip(f"OutOfMemory: the job's processes used {rss // MIB} MiB, over the limit of "
                      f"{self.memory_limit_bytes // MIB} MiB; they were killed")
        elif count > self.max_processes:
            self.trip(f"the job started {count} processes, more than the limit of {self.max_processes} "
                      "(a fork bomb?); they were killed")
        self._ticks += 1
        if self.spool_dir is not None and self._ticks % 4 == 0:
            trim_spool(self.process.pid, self.spool_dir, self._punched)

    def sample(self) -> tuple[int, int]:
        """(resident bytes of the job's processes, number of processes including the launcher)."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            return 0, 0
        rss = 0
        for child in children:
            self.seen_pids.add(child.pid)
            with contextlib.suppress(psutil.Error):
                rss += child.memory_info().rss
        return rss, len(children) + 1

    def trip(self, verdict: str) -> None:
        if self.verdict:
            return
        self.verdict = verdict
        log.warning("pid %s: %s", self.process.pid, verdict)
        kill_group(self.process, self.pgid, self.live_seen_pids(), mark=self.mark)
        self._stopping.set()

    def live_seen_pids(self) -> set[int]:
        """Seen descendants still alive outside the group (pid reuse is checked loosely:
        they must still not be us)."""
        return {pid for pid in self.seen_pids if pid != os.getpid() and psutil.pid_exists(pid)}

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(2)


def memory_limit_bytes(limit_mb: Any, node_memory_bytes: int, fraction: float) -> int:
    if limit_mb:
        return int(float(limit_mb) * MIB)
    total = node_memory_bytes or int(psutil.virtual_memory().total)
    return int(total * fraction)


# --- the --tee spool ------------------------------------------------------------------------------
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc: Any = None


def _fallocate() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return _libc.fallocate


def trim_spool(launcher_pid: int, spool_dir: Path, punched: dict[str, int]) -> int:
    """Free the disk blocks of spool text the launcher has already read and forwarded.

    torchrun's --tee writes each rank's output to a file and tails it; those files would
    grow for as long as the job prints. The launcher's read position of each file is in
    /proc/<pid>/fdinfo; everything well behind it is punched out (the file keeps its size,
    the blocks are freed, the tail reader never goes back). Linux only; elsewhere a no-op.
    Returns the bytes freed."""
    if not sys.platform.startswith("linux"):
        return 0
    freed = 0
    prefix = str(spool_dir.resolve()) + os.sep
    fd_dir = Path(f"/proc/{launcher_pid}/fd")
    try:
        descriptors = list(fd_dir.iterdir())
    except OSError:
        return 0
    for descriptor in descriptors:
        try:
            target = os.readlink(descriptor)
            if not target.startswith(prefix) or os.path.getsize(target) < SPOOL_TRIM_THRESHOLD:
                continue
            info = Path(f"/proc/{launcher_pid}/fdinfo/{descriptor.name}").read_text()
        except OSError:
            continue
        position = next((int(line.split()[1]) for line in info.splitlines() if line.startswith("pos:")), 0)
        end = (position - SPOOL_READER_MARGIN) // 4096 * 4096
        if end <= punched.get(target, 0):
            continue
        try:
            fd = os.open(target, os.O_WRONLY)
        except OSError:
            continue
        try:
            if _fallocate()(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, 0, end) == 0:
                freed += end - punched.get(target, 0)
                punched[target] = end
        finally:
            os.close(fd)
    return freed


# --- system metrics -------------------------------------------------------------------------------
class SystemSampler(threading.Thread):
    """Node CPU %, memory in use, and GPU utilisation / memory (NVML) every few seconds."""

    def __init__(self, redis: Any, job_id: int, node_name: str, interval: float) -> None:
        super().__init__(name=f"system-{job_id}", daemon=True)
        self.redis = redis
        self.job_id = job_id
        self.node_name = node_name
        self.interval = interval
        self._stopping = threading.Event()
        self._nvml: Any = None
        self._warned = False

    def run(self) -> None:
        psutil.cpu_percent(None)  # the first call only sets the baseline
        self._nvml = _open_nvml()
        try:
            while not self._stopping.wait(self.interval):
                self.publish()
        finally:
            if self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()

    def sample(self) -> dict[str, str]:
        memory = psutil.virtual_memory()
        gpu, gpu_memory, per_gpu = _gpu_usage(self._nvml)
        return {"n": self.node_name, "t": f"{time.time():.3f}", "cpu": f"{psutil.cpu_percent(None):.1f}",
                "mem": str(memory.total - memory.available), "gpu": "" if gpu is None else f"{gpu:.1f}",
                "gpu_mem": "" if gpu_memory is None else str(gpu_memory),
                # Each GPU's utilisation by index (the low_gpu_utilization rule names the GPU).
                "gpus": ",".join(f"{u:.1f}" for u in per_gpu)}

    def publish(self) -> None:
        try:
            self.redis.xadd(key(SYSTEM_STREAM, self.job_id), self.sample(), maxlen=SYSTEM_STREAM_MAXLEN, approximate=True)
        except Exception as exc:  # noqa: BLE001 - system metrics are best effort
            if not self._warned:
                self._warned = True
                log.warning("job %s: system metrics could not reach Redis: %s", self.job_id, exc)

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(2)


def _open_nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no driver (NVMLError_LibraryNotFound) or no module: no GPU metrics
        return None


def _gpu_usage(nvml: Any) -> tuple[float | None, int | None, list[float]]:
    """(mean utilisation %, memory used in bytes, each GPU's utilisation %) — Nones and []
    where there is no GPU or no driver."""
    if nvml is None:
        return None, None, []
    try:
        count = nvml.nvmlDeviceGetCount()
        if not count:
            return None, None, []
        per_gpu: list[float] = []
        used = 0
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            per_gpu.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            used += nvml.nvmlDeviceGetMemoryInfo(handle).used
        return sum(per_gpu) / count, int(used), per_gpu
    except Exception:  # noqa: BLE001
        return None, None, []
