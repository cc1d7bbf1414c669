"""A fork server for warm pools: a Python process that imported torch once and forks a
job's processes from that state, instead of starting them cold (torchrun imports torch,
then every worker imports it again: seconds; a fork: milliseconds).

    server = ForkServer.start(socket_path=path, preload=("torch",))   # once per pool
    server.ready(timeout=30)
    process = server.launch(LaunchRequest(module=..., args=[...], env={...}, cwd=..., nproc=2))
    process.wait(1)          # Popen-like: .pid .stdout .stderr .poll() .wait() .returncode

Three kinds of process:
    server    `python -m jobs.runner.process.forkserver`, a child of the node worker in a session of
              its own. Imports the preloads, listens on a Unix socket, forks one launcher per
              request and reports the launcher's exit status on that request's connection.
    launcher  a child of the server, leader of its own session and process group (the group
              the agent signals). Acts like `torchrun --max_restarts 0 --tee 3` for `nproc`
              local workers: their environment (RANK, WORLD_SIZE, MASTER_PORT ...), their
              output prefixed "[rank<N>]:" onto the pipes the agent reads, torchrun's
              root-cause summary on stderr when one fails.
    worker    a child of the launcher, in its group (no setsid: a signal to the group reaches
              it): the job's environment, cwd, argv and sys.path, then runpy.

Fork safety. fork() copies only the calling thread, so a child inherits every lock another
thread held at that moment. The server therefore starts no Python thread and runs no torch
op: torch creates its OpenMP/intra-op pool, the autograd engine's threads and the CUDA
context lazily, on first use, so a child starts with none of them (torch's "bad fork" flags
stay clear, CUDA can be initialised in the child, OMP_NUM_THREADS is applied there through
torch.set_num_threads). The one native thread an import starts here (OpenBLAS's pool, via
numpy) parks itself around fork through pthread_atfork. Launchers fork workers from their
only thread too.

What a fork does not give a job, unlike a cold start: whatever the interpreter or a library
reads once at its own start follows the server's environment, not the job's
(PYTHONHASHSEED, PYTHONWARNINGS, -X options, MKL/OpenBLAS thread counts, torch's import-time
settings). Start a pool with the environment its jobs would have.

Lifetime. The server gets SIGTERM when the node worker's thread that started it dies
(PR_SET_PDEATHSIG: start it from the worker's main thread); a launcher gets SIGTERM when the
server dies and ends its workers (SIGTERM, then SIGKILL after STOP_GRACE_SECONDS); a worker
gets SIGKILL when its launcher is gone. So close() of the server, or a crash of any of them,
orphans nothing, and ends the launches it started: close a pool only when the node has no job.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import ctypes.util
import importlib
import io
import json
import os
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from string import Template
from typing import IO, Any, NoReturn

from jobs.runner.process.launch import LINE_PREFIX_TEMPLATE, ROLE, free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
STOP_GRACE_SECONDS = 5.0  # launcher: SIGTERM to its workers, SIGKILL to those left after this
DRAIN_SECONDS = 2.0  # output still read after the last worker exited (a child of it may hold the pipe)
REPLY_TIMEOUT_SECONDS = 30.0  # launch(): the server answers with the launcher's pid within this
REQUEST_TIMEOUT_SECONDS = 5.0  # server: a client sends its whole request within this
MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_SOCKET_PATH_BYTES = 108  # sun_path, with its terminating NUL
READ_BYTES = 64 * 1024
LINE_PIECE_BYTES = 64 * 1024  # a longer line goes out in prefixed pieces of this size
# The launcher's status when the server died before reporting it: PDEATHSIG sent it SIGTERM.
LOST_RETURNCODE = -signal.SIGTERM
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("!I")

_libc: Any = None  # resolved in the server before any fork: children never load a library


class ForkServerError(RuntimeError):
    """The server cannot take a launch (not ready, gone, or it refused the request)."""


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    module: str = ""  # run like `python -m module`
    script: str = ""  # or a script, its path relative to cwd
    args: list[str]  # sys.argv[1:]
    env: dict[str, str]  # the complete environment of the job's processes
    cwd: str
    nproc: int = 1  # processes on this node
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"  # nnodes > 1: node 0's rendezvous host
    master_port: int = 0  # 0 with nnodes == 1: a free port; else node 0's published port
    run_id: str = ""

    def __post_init__(self) -> None:
        if bool(self.module) == bool(self.script):
            raise ValueError("a launch runs either a module or a script")
        if self.nproc < 1 or self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"bad layout: nproc={self.nproc} nnodes={self.nnodes} node_rank={self.node_rank}")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("a multi-node launch needs node 0's published port")


def worker_environment(request: LaunchRequest, local_rank: int, master_port: int) -> dict[str, str]:
    """The job's environment plus what torchrun gives each worker."""
    env = dict(request.env)
    if request.nproc > 1:
        # torchrun's default with several workers per node: no CPU oversubscription.
        env.setdefault("OMP_NUM_THREADS", "1")
    env.update({
        "RANK": str(request.node_rank * request.nproc + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(request.nnodes * request.nproc),
        "LOCAL_WORLD_SIZE": str(request.nproc),
        "GROUP_RANK": str(request.node_rank),
        "GROUP_WORLD_SIZE": str(request.nnodes),
        "ROLE_NAME": ROLE,
        "ROLE_RANK": str(request.node_rank * request.nproc + local_rank),
        "ROLE_WORLD_SIZE": str(request.nnodes * request.nproc),
        "MASTER_ADDR": request.master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": request.run_id or "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    })
    return env


# --- the client side: what the agent holds ----------------------------------------------------
class ForkedLaunch:
    """One launch, shaped like subprocess.Popen for the agent and jobs.runner.process.guard: the
    launcher's pid (its process group), its output pipes, and its exit status, which the
    server (the launcher's parent) reports on the launch's connection."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes], connection: socket.socket,
                 received: bytes = b"") -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._connection: socket.socket | None = connection
        self._received = received
        self._lock = threading.Lock()  # the guard's thread polls while the agent waits
        self._take_messages()

    def poll(self) -> int | None:
        # Like Popen.poll: never blocks; a wait() in progress in another thread will tell.
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._check(0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise subprocess.TimeoutExpired(f"forked launch {self.pid}", timeout or 0)
        try:
            while self.returncode is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired(f"forked launch {self.pid}", timeout or 0)
                self._check(remaining)
        finally:
            self._lock.release()
        return self.returncode

    def _check(self, timeout: float | None) -> None:
        """Wait up to `timeout` for the server's report; once the server is gone, for the
        launcher itself to disappear (it was sent SIGTERM by PR_SET_PDEATHSIG)."""
        if self._connection is None:
            if _running(self.pid):
                time.sleep(0.1 if timeout is None else min(0.1, timeout))
            else:
                self.returncode = LOST_RETURNCODE
            return
        readable, _, _ = select.select([self._connection], [], [], timeout)
        if not readable:
            return
        try:
            data = self._connection.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._disconnect()  # the server died before reporting: the launcher's status went with it
            return
        self._received += data
        self._take_messages()

    def _take_messages(self) -> None:
        while b"\n" in self._received:
            line, self._received = self._received.split(b"\n", 1)
            message = json.loads(line)
            if "exit" in message:
                self.returncode = int(message["exit"])
                self._disconnect()
                return

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class ForkServer:
    """A started server process and the socket it listens on (see the module docstring)."""

    def __init__(self, process: subprocess.Popen, socket_path: Path, ready_fd: int) -> None:
        self.process = process
        self.pid = process.pid
        self.socket_path = socket_path
        self._ready_fd: int | None = ready_fd
        self._ready = False

    @classmethod
    def start(cls, *, python: str = sys.executable, socket_path: Path, preload: Sequence[str] = ("torch",),
              env: Mapping[str, str] | None = None) -> ForkServer:
        """Spawn the server and return at once; it imports `preload`, then listens.
        Call it from a thread that lives as long as the pool (the worker's main thread):
        PR_SET_PDEATHSIG fires when the thread that started the server ends."""
        socket_path = Path(socket_path)
        if len(os.fsencode(socket_path)) >= MAX_SOCKET_PATH_BYTES:
            raise ValueError(f"socket path {socket_path} is too long for a Unix socket")
        ready_read, ready_write = os.pipe()
        command = [python, "-m", "jobs.runner.process.forkserver", "--socket", str(socket_path),
                   "--preload", ",".join(preload), "--ready-fd", str(ready_write), "--parent-pid", str(os.getpid())]
        try:
            # Its own session: a signal to a job's group or the worker's terminal never hits
            # it. cwd: where `jobs` imports from, whatever PYTHONPATH `env` has; a job forked
            # from it never has that folder on its sys.path (_inherited_sys_path).
            process = subprocess.Popen(command, cwd=REPO_ROOT, env=None if env is None else dict(env),
                                       stdin=subprocess.DEVNULL, pass_fds=(ready_write,), start_new_session=True)
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        return cls(process, socket_path, ready_read)

    def ready(self, timeout: float = 0) -> bool:
        """True once the server listens; waits up to `timeout` seconds for it."""
        if self._ready or self._ready_fd is None:
            return self._ready
        readable, _, _ = select.select([self._ready_fd], [], [], max(0.0, timeout))
        if not readable:
            return False
        self._ready = os.read(self._ready_fd, 64).startswith(b"ready")  # b"": it died first
        os.close(self._ready_fd)
        self._ready_fd = None
        return self._ready

    def alive(self) -> bool:
        return self.process.poll() is None

    def launch(self, request: LaunchRequest) -> ForkedLaunch:
        """1. Two pipes for the launch's stdout and stderr. 2. The request and the pipes'
        write ends to the server (SCM_RIGHTS); our copies of the write ends closed, so the
        read ends see EOF when the launch's last process is gone. 3. The launcher's pid."""
        if not self.alive():
            raise ForkServerError(f"the fork server (pid {self.pid}) has exited with {self.process.returncode}")
        if not self.ready():
            raise ForkServerError(f"the fork server (pid {self.pid}) is not ready yet")
        body = json.dumps(asdict(request)).encode()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                connection.settimeout(REPLY_TIMEOUT_SECONDS)
                connection.connect(str(self.socket_path))
                socket.send_fds(connection, [_HEADER.pack(len(body))], [out_write, err_write])
                connection.sendall(body)
            finally:
                os.close(out_write)
                os.close(err_write)
            line, received = _read_line(connection)
            reply = json.loads(line)
            if "error" in reply:
                raise ForkServerError(f"the fork server refused the launch: {reply['error']}")
            connection.settimeout(None)
        except BaseException as exc:
            connection.close()
            os.close(out_read)
            os.close(err_read)
            if isinstance(exc, OSError | ValueError):
                raise ForkServerError(f"the fork server (pid {self.pid}) did not take the launch: {exc}") from exc
            raise
        return ForkedLaunch(int(reply["pid"]), os.fdopen(out_read, "rb"), os.fdopen(err_read, "rb"), connection, received)

    def close(self, timeout: float = 5) -> None:
        """Stop the server: SIGTERM, SIGKILL after `timeout`. Its running launches get
        SIGTERM through PR_SET_PDEATHSIG and end their workers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None
        self._ready = False
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_line(connection: socket.socket) -> tuple[bytes, bytes]:
    received = b""
    while b"\n" not in received:
        data = connection.recv(4096)
        if not data:
            raise ConnectionError("the fork server closed the connection without an answer")
        received += data
    line, rest = received.split(b"\n", 1)
    return line, rest


def _running(pid: int) -> bool:
    """True while the process exists and has not ended (a zombie has: nobody may reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


# --- shared by server, launcher and worker ------------------------------------------------------
def _die_with_parent(sig: int, parent_pid: int) -> None:
    """Receive `sig` when the parent dies (Linux); if it died already, now."""
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def _close_quietly(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _write_all(fd: int, data: bytes) -> bool:
    """False once the reader is gone (EPIPE: SIGPIPE is ignored in Python processes)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            return False
    return True


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when the child exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


# --- the server -------------------------------------------------------------------------------
@dataclass
class _Launch:
    connection: socket.socket
    pidfd: int | None


class _Server:
    """Single-threaded: blocking accept in a select() loop that also watches the launchers'
    pidfds, so it never needs SIGCHLD and never forks beside another thread."""

    def __init__(self, listener: socket.socket, base_sys_path: list[str], own_modules: list[str]) -> None:
        self.listener = listener
        self.base_sys_path = base_sys_path
        self.own_modules = own_modules
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.launches: dict[int, _Launch] = {}

    def serve_forever(self) -> NoReturn:
        while True:
            # Without pidfds an exit is only seen at the next tick.
            has_pidfds = all(launch.pidfd is not None for launch in self.launches.values())
            for key, _ in self.selector.select(1.0 if has_pidfds else 0.05):
                if key.fileobj is self.listener:
                    self.accept()
            self.reap()

    def accept(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        try:
            connection.settimeout(REQUEST_TIMEOUT_SECONDS)
            request, out_fd, err_fd = _receive_request(connection)
        except Exception as exc:  # noqa: BLE001 - one bad client must not end the pool
            _reply(connection, {"error": f"bad request: {exc}"})
            connection.close()
            return
        try:
            if not os.path.isdir(request.cwd):
                raise ValueError(f"cwd {request.cwd!r} is not a directory")
            pid = self.fork_launcher(request, out_fd, err_fd, connection)
        except Exception as exc:  # noqa: BLE001 - e.g. fork's EAGAIN: this launch fails, the pool stays
            _reply(connection, {"error": str(exc)})
            connection.close()
            return
        finally:
            _close_quietly(out_fd, err_fd)
        launch = _Launch(connection, _pidfd(pid))
        self.launches[pid] = launch
        if launch.pidfd is not None:
            self.selector.register(launch.pidfd, selectors.EVENT_READ, pid)
        _reply(connection, {"pid": pid})

    def fork_launcher(self, request: LaunchRequest, out_fd: int, err_fd: int, connection: socket.socket) -> int:
        for stream in (sys.stdout, sys.stderr):  # or the child would print our buffered text again
            with contextlib.suppress(Exception):
                stream.flush()
        server_pid = os.getpid()
        pid = os.fork()
        if pid:
            return pid
        try:
            self.selector.close()  # closes our epoll descriptor only; the server's set is untouched
            self.listener.close()
            connection.close()
            for launch in self.launches.values():
                launch.connection.close()
                if launch.pidfd is not None:
                    _close_quietly(launch.pidfd)
            _run_launcher(request, out_fd, err_fd, server_pid, self.base_sys_path, self.own_modules)
        except BaseException:  # noqa: BLE001 - nothing may return into the server's loop
            with contextlib.suppress(Exception):
                traceback.print_exc()
        os._exit(1)

    def reap(self) -> None:
        for pid, launch in list(self.launches.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 255 << 8
            if not done:
                continue
            _reply(launch.connection, {"exit": os.waitstatus_to_exitcode(status)})
            launch.connection.close()
            if launch.pidfd is not None:
                self.selector.unregister(launch.pidfd)
                _close_quietly(launch.pidfd)
            del self.launches[pid]


def _receive_request(connection: socket.socket) -> tuple[LaunchRequest, int, int]:
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 2)
    try:
        if len(fds) != 2:
            raise ValueError("a launch request carries two pipes (stdout, stderr)")
        header += _receive_exactly(connection, _HEADER.size - len(header))
        (length,) = _HEADER.unpack(header)
        if length > MAX_REQUEST_BYTES:
            raise ValueError(f"request of {length} bytes")
        request = LaunchRequest(**json.loads(_receive_exactly(connection, length)))
    except BaseException:
        _close_quietly(*fds)
        raise
    return request, fds[0], fds[1]


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client closed the connection mid-request")
        data += chunk
    return data


def _reply(connection: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client went away: the launch runs on regardless
        connection.sendall(json.dumps(message).encode() + b"\n")


# --- the launcher -----------------------------------------------------------------------------
def _run_launcher(request: LaunchRequest, out_fd: int, err_fd: int, server_pid: int, base_sys_path: list[str],
                  own_modules: list[str]) -> NoReturn:
    os.setsid()
    _die_with_parent(signal.SIGTERM, server_pid)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    _close_quietly(out_fd, err_fd)
    launcher = _Launcher(request, base_sys_path, own_modules)
    code = launcher.run()
    if launcher.stop_signal is not None:
        # Ended by a signal: end the same way, so the agent sees -SIGTERM like from torchrun's Popen.
        signal.signal(launcher.stop_signal, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {launcher.stop_signal})
        os.kill(os.getpid(), launcher.stop_signal)
        code = 128 + launcher.stop_signal
    os._exit(code)


@dataclass
class _Stream:
    fd: int
    target: int  # 1 or 2 of the launcher
    prefix: bytes
    pending: bytearray = field(default_factory=bytearray)


@dataclass
class _Worker:
    local_rank: int
    rank: int
    pid: int
    pidfd: int | None
    exit_code: int | None = None


@dataclass(frozen=True)
class _Failure:
    worker: _Worker
    exit_code: int
    at: datetime


class _Launcher:
    def __init__(self, request: LaunchRequest, base_sys_path: list[str], own_modules: list[str]) -> None:
        self.request = request
        self.base_sys_path = base_sys_path
        self.own_modules = own_modules
        self.selector = selectors.DefaultSelector()
        self.workers: list[_Worker] = []
        self.streams: dict[int, _Stream] = {}
        self.failures: list[_Failure] = []
        self.stop_signal: int | None = None
        self.terminated_at: float | None = None
        self.killed = False
        self.dead_targets: set[int] = set()
        self.wake_read, self.wake_write = os.pipe()

    def run(self) -> int:
        """1. Handle stop signals (through a wakeup pipe: the loop is a select()). 2. Fork
        the workers. 3. Forward their output and reap them; on the first failure or a stop
        signal, SIGTERM the rest, SIGKILL after the grace. 4. The summary and exit code."""
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self.wake_write, warn_on_full_buffer=False)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        port = self.request.master_port or free_port()
        try:
            for local_rank in range(self.request.nproc):
                self._spawn(local_rank, port)
        except OSError as exc:  # fork's EAGAIN: the node's process limit
            local_rank = len(self.workers)
            self._say(f"forkserver: could not start local rank {local_rank}: {exc}\n")
            rank = self.request.node_rank * self.request.nproc + local_rank
            self.failures.append(_Failure(_Worker(local_rank, rank, 0, None), 1, datetime.now().astimezone()))
            self._terminate()
        drain_until: float | None = None
        while True:
            for key, _ in self.selector.select(self._tick()):
                if isinstance(key.data, _Stream):
                    self._pump(key.data)
                elif key.fileobj == self.wake_read:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_read, 512)
            self._reap()
            if (self.failures or self.stop_signal is not None) and self.terminated_at is None:
                self._terminate()
            if self.terminated_at is not None and not self.killed \
                    and time.monotonic() - self.terminated_at > STOP_GRACE_SECONDS:
                self._signal_workers(signal.SIGKILL)
                self.killed = True
            if any(worker.exit_code is None for worker in self.workers):
                continue
            drain_until = drain_until or time.monotonic() + DRAIN_SECONDS
            if not self.streams or time.monotonic() > drain_until:
                break
        for stream in list(self.streams.values()):
            self._end_stream(stream)
        return self._conclude()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _tick(self) -> float:
        if any(worker.pidfd is None and worker.exit_code is None for worker in self.workers):
            return 0.05
        return 0.2 if self.terminated_at is not None else 1.0

    def _spawn(self, local_rank: int, port: int) -> None:
        rank = self.request.node_rank * self.request.nproc + local_rank
        env = worker_environment(self.request, local_rank, port)
        template = Template(env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or LINE_PREFIX_TEMPLATE)
        prefix = template.safe_substitute(rank=rank, local_rank=local_rank, role_name=ROLE).encode()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        # Blocked across fork: a stop signal before the worker resets its handlers would
        # otherwise run ours in the worker, and be lost.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
        launcher_pid = os.getpid()
        try:
            pid = os.fork()
            if pid == 0:
                try:  # never back into the launcher's loop
                    self.selector.close()  # ours only: closing an epoll descriptor changes nothing for the launcher
                    private = [self.wake_read, self.wake_write, out_read, err_read, *self.streams,
                               *(w.pidfd for w in self.workers if w.pidfd is not None)]
                    _run_worker(self.request, env, out_write, err_write, private, mask, launcher_pid,
                                self.base_sys_path, self.own_modules)
                finally:
                    os._exit(1)
        except OSError:
            _close_quietly(out_read, err_read)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _close_quietly(out_write, err_write)
        worker = _Worker(local_rank, rank, pid, _pidfd(pid))
        self.workers.append(worker)
        if worker.pidfd is not None:
            self.selector.register(worker.pidfd, selectors.EVENT_READ, worker)
        for fd, target in ((out_read, 1), (err_read, 2)):
            os.set_blocking(fd, False)
            self.streams[fd] = _Stream(fd, target, prefix)
            self.selector.register(fd, selectors.EVENT_READ, self.streams[fd])

    def _pump(self, stream: _Stream) -> None:
        try:
            data = os.read(stream.fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._end_stream(stream)
            return
        stream.pending += data
        *lines, rest = bytes(stream.pending).split(b"\n")
        out = [stream.prefix + line + b"\n" for line in lines]
        while len(rest) >= LINE_PIECE_BYTES:
            out.append(stream.prefix + rest[:LINE_PIECE_BYTES] + b"\n")
            rest = rest[LINE_PIECE_BYTES:]
        stream.pending = bytearray(rest)
        self._emit(stream.target, b"".join(out))

    def _end_stream(self, stream: _Stream) -> None:
        if stream.pending:
            self._emit(stream.target, stream.prefix + bytes(stream.pending) + b"\n")
            stream.pending.clear()
        self.selector.unregister(stream.fd)
        _close_quietly(stream.fd)
        del self.streams[stream.fd]

    def _emit(self, target: int, data: bytes) -> None:
        # Output nobody reads any more is dropped; the workers must not block on it.
        if data and target not in self.dead_targets and not _write_all(target, data):
            self.dead_targets.add(target)

    def _say(self, text: str) -> None:
        self._emit(2, text.encode())

    def _reap(self) -> None:
        for worker in self.workers:
            if worker.exit_code is not None:
                continue
            try:
                pid, status = os.waitpid(worker.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = worker.pid, 255 << 8
            if not pid:
                continue
            worker.exit_code = os.waitstatus_to_exitcode(status)
            if worker.pidfd is not None:
                self.selector.unregister(worker.pidfd)
                _close_quietly(worker.pidfd)
                worker.pidfd = None
            # Exits after our SIGTERM are ours, not failures (torchrun reports the same way).
            if worker.exit_code != 0 and self.terminated_at is None and self.stop_signal is None:
                self.failures.append(_Failure(worker, worker.exit_code, datetime.now().astimezone()))

    def _terminate(self) -> None:
        self.terminated_at = time.monotonic()
        self._signal_workers(signal.SIGTERM)

    def _signal_workers(self, sig: int) -> None:
        for worker in self.workers:
            if worker.exit_code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, sig)

    def _conclude(self) -> int:
        if self.failures:
            self._say(failure_summary(self.request, self.failures))
            return 1
        if self.stop_signal is not None:
            return 1
        return 0 if all(worker.exit_code == 0 for worker in self.workers) else 1


def failure_summary(request: LaunchRequest, failures: list[_Failure]) -> str:
    """torchrun's ChildFailedError block, which jobs.runner.process.launch.parse_root_cause reads."""
    host = socket.gethostname()
    rule, thin = "=" * 60, "-" * 60

    def describe(index: int, failure: _Failure) -> list[str]:
        worker, code = failure.worker, failure.exit_code
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            trace = f"Signal {-code} ({name}) received by PID {worker.pid}"
        else:
            trace = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        return [f"[{index}]:",
                f"  time      : {failure.at:%Y-%m-%d_%H:%M:%S}",
                f"  host      : {host}",
                f"  rank      : {worker.rank} (local_rank: {worker.local_rank})",
                f"  exitcode  : {code} (pid: {worker.pid})",
                "  error_file: <N/A>",
                f"  traceback : {trace}"]

    root, others = failures[0], failures[1:]
    lines = ["ChildFailedError:", rule, f"{request.module or request.script} FAILED", thin, "Failures:"]
    if others:
        for index, failure in enumerate(others, start=1):
            lines += describe(index, failure)
    else:
        lines.append("  <NO_OTHER_FAILURES>")
    lines += [thin, "Root Cause (first observed failure):", *describe(0, root), rule]
    return "\n".join(lines) + "\n"


# --- the worker -------------------------------------------------------------------------------
def _run_worker(request: LaunchRequest, env: dict[str, str], out_fd: int, err_fd: int, private_fds: list[int],
                mask: set[Any], launcher_pid: int, base_sys_path: list[str], own_modules: list[str]) -> NoReturn:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _die_with_parent(signal.SIGKILL, launcher_pid)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        _close_quietly(out_fd, err_fd, *private_fds)
        code = _run_job(request, env, base_sys_path, own_modules)
    except BaseException:  # noqa: BLE001 - the worker must end here, whatever happened
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]
        if _libc is not None:
            _libc.fflush(None)  # C-level stdio of extensions: os._exit skips libc's own flush
        os._exit(code)


def _run_job(request: LaunchRequest, env: dict[str, str], base_sys_path: list[str], own_modules: list[str]) -> int:
    """What `python [-m] target args` would be in this environment; returns the exit code."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request.cwd)
    _fresh_stdio(env)
    tempfile.tempdir = None  # TMPDIR is the job's now
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _apply_thread_count(env)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        # A fresh process seeds numpy's global generator from OS entropy; forked ones would all
        # share the server's stream (the `random` module reseeds itself at fork).
        numpy_random.seed()
    if request.module:
        first, target = os.getcwd(), request.module
    else:
        target = os.path.join(os.getcwd(), request.script)
        first = os.path.dirname(os.path.abspath(target))
    job_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = list(dict.fromkeys([first, *job_path, *base_sys_path]))
    sys.argv = [target, *request.args]
    # The server's own package is imported afresh from the job's sys.path, as in a cold start.
    for name in own_modules:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    try:
        if request.module:
            runpy.run_module(request.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - what the interpreter would print before exiting 1
        traceback.print_exc()
        code = 1
    # Interpreter shutdown, as after a script's end: join non-daemon threads, run atexit hooks.
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _fresh_stdio(env: Mapping[str, str]) -> None:
    """sys.stdout/sys.stderr as Python would make them for pipes in this environment
    (the server's were made for its own stdio, and never honoured the job's PYTHONUNBUFFERED)."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    io_encoding, _, io_errors = env.get("PYTHONIOENCODING", "").partition(":")
    encoding = io_encoding or getattr(sys.__stdout__, "encoding", None) or "utf-8"

    def stream(fd: int, errors: str, line_buffering: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        binary: Any = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(binary, encoding=encoding, errors=io_errors or errors,
                                line_buffering=line_buffering, write_through=unbuffered)

    sys.stdout = stream(1, getattr(sys.__stdout__, "errors", None) or "strict", False)
    sys.stderr = stream(2, "backslashreplace", True)


def _apply_thread_count(env: Mapping[str, str]) -> None:
    # OpenMP read OMP_NUM_THREADS when the server loaded it; a changed environment alone
    # does not reach torch's intra-op pool.
    torch: Any = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


# --- the server's entry point -------------------------------------------------------------------
def _inherited_sys_path() -> list[str]:
    """The server's sys.path without its own first entry, its PYTHONPATH and the repository
    root: the interpreter's and site's part, which a cold `python` would have too. A job
    reaches `trainyard` and `algorithms` through its own PYTHONPATH, as in a cold start,
    and the studio's apps not at all."""
    own = {os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
    return [entry for entry in sys.path[1:]
            if os.path.abspath(entry) not in own and os.path.realpath(entry) != str(REPO_ROOT)]


def main(argv: Sequence[str] | None = None) -> None:
    """1. Die with the node worker. 2. Import the preloads (no torch op: see fork safety).
    3. Listen, then say ready on the ready pipe. 4. Serve until killed."""
    global _libc
    parser = argparse.ArgumentParser(prog="python -m jobs.runner.process.forkserver")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--preload", default="torch", help="comma-separated modules to import")
    parser.add_argument("--ready-fd", type=int, default=-1, help="written 'ready' and closed once listening")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit if this process is not the parent")
    args = parser.parse_args(argv)
    if sys.platform.startswith("linux"):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _die_with_parent(signal.SIGTERM, args.parent_pid)
    package = (__package__ or "jobs.runner.process").split(".")[0]
    own_modules = [name for name in sys.modules if name == package or name.startswith(package + ".")]
    preloads = [name.strip() for name in args.preload.split(",") if name.strip()]
    for name in preloads:
        importlib.import_module(name)
    if any(name == package or name.startswith(package + ".") for name in preloads):
        own_modules = []  # the pool shares our package on purpose
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit(f"forkserver: preloading {preloads} initialised CUDA, which a forked child cannot use")
    if threading.active_count() > 1:
        print(f"forkserver: preloading {preloads} started Python threads; forking beside them is unsafe",
              file=sys.stderr, flush=True)
    with contextlib.suppress(FileNotFoundError):
        args.socket.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(args.socket))
    os.chmod(args.socket, 0o600)  # only our user may launch through it
    listener.listen(64)
    if args.ready_fd >= 0:
        _write_all(args.ready_fd, b"ready\n")
        os.close(args.ready_fd)
    _Server(listener, _inherited_sys_path(), own_modules).serve_forever()


if __name__ == "__main__":
    main()
