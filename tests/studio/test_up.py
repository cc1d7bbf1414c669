"""`studio up` end to end: a real supervisor with real children, an embedded Redis and a
fresh SQLite studio in a temporary data directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from studio.embedded_redis import free_port
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow
START_TIMEOUT = 150
STOP_TIMEOUT = 30


@dataclass
class Studio:
    process: subprocess.Popen
    port: int
    log: Path
    env: dict[str, str]
    # Processes seen once serving; cleanup kills them even after the supervisor is gone
    # (its orphans are then no longer its descendants).
    seen: list[psutil.Process] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def _studio_env(data_dir: Path) -> dict[str, str]:
    # No REDIS_URL: the studio must start its own Redis. No DATABASE_URL: SQLite in its
    # data directory. No STUDIO_* from the test session: nothing shared with it.
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("STUDIO_")}
    # The session's collected static files: a fresh collect (a minute of brotli) per studio is
    # not what these tests are about.
    env.update(STUDIO_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", STUDIO_STATIC_ROOT=str(settings.STATIC_ROOT))
    return env


def _get(url: str, token: str | None = None) -> tuple[int, dict | str] | None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read().decode(errors="replace"), exc.code
    except OSError:
        return None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def _alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.fixture
def start_studio(tmp_path) -> Iterator:
    started: list[Studio] = []

    def start(name: str = "studio") -> Studio:
        data_dir = tmp_path / name
        log = tmp_path / f"{name}.log"
        env = _studio_env(data_dir)
        port = free_port()
        with open(log, "wb") as out:
            process = subprocess.Popen([sys.executable, "manage.py", "studio", "up", "--port", str(port), "--nodes", "1"],
                                       cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        studio = Studio(process=process, port=port, log=log, env=env)
        started.append(studio)
        return studio

    yield start
    # A failed test must not leave a studio running: kill whatever is left of each tree.
    for studio in started:
        leftovers = [*studio.seen, *studio.descendants()]
        if studio.process.poll() is None:
            studio.process.kill()
            studio.process.wait()
        for process in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def _wait_until_serving(studio: Studio) -> dict:
    def ready() -> dict | None:
        if studio.process.poll() is not None:
            raise AssertionError(f"studio up exited with {studio.process.returncode}:\n{studio.output()}")
        login = _get(f"{studio.url}/login/")
        health = _get(f"{studio.url}/api/v1/health")
        if login and login[0] == 200 and health and health[0] == 200 and health[1]["nodes"]["live"] >= 1 \
                and "Ctrl-C to stop" in studio.output():  # the banner comes after the supervisor's own health check
            return health[1]
        return None

    try:
        health = wait_for(ready, timeout=START_TIMEOUT, interval=0.5, message="the login page, a live node and the banner")
    except AssertionError:
        print(studio.output())
        raise
    studio.seen = studio.descendants()
    return health


def _token(studio: Studio, username: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", "studio", "token", username], cwd=ROOT, env=studio.env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1, result.stdout
    return result.stdout.strip()


def _stop(studio: Studio, signum: int) -> int:
    studio.process.send_signal(signum)
    try:
        return studio.process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"studio up did not exit within {STOP_TIMEOUT} s of signal {signum}:\n{studio.output()}")


def test_up_serves_the_demo_and_stops_cleanly_on_ctrl_c(start_studio):
    studio = start_studio()
    health = _wait_until_serving(studio)
    assert health["status"] == "ok" and health["redis"]["ok"]

    output = studio.output()
    password = re.search(r"password: (\S+)", output).group(1)  # type: ignore[union-attr]
    assert output.count(password) == 1, "the admin password is printed exactly once"
    assert "Ctrl-C to stop" in output and studio.url in output
    assert re.search(r"^web\s+\| .*Listening at", output, re.M), "children's lines carry their name"
    assert re.search(r"^node-1\s+\| ", output, re.M) and re.search(r"^control\s+\| ", output, re.M)

    token = _token(studio, "admin")
    status, body = _get(f"{studio.url}/api/v1/datasets/?project=demo", token)  # type: ignore[misc]
    assert status == 200, body
    versions = {d["name"]: d["latest_version"]["status"] for d in body["results"]}  # type: ignore[index]
    assert versions == {"demo-tabular": "ready", "demo-shapes": "ready", "demo-text": "ready"}
    nodes = _get(f"{studio.url}/api/v1/health", token)[1]["nodes"]["items"]  # type: ignore[index]
    assert [(n["name"], n["state"]) for n in nodes] == [("node-1", "idle")]

    tree = studio.descendants()
    names = " ".join(" ".join(p.cmdline()) for p in tree)
    assert "redis-server" in names and "gunicorn" in names and "studio control" in names

    assert _stop(studio, signal.SIGINT) == 0, studio.output()
    assert _alive(tree) == [], studio.output()
    assert "Stopped." in studio.output()
    assert "node node-1: stopped" in studio.output(), "the node worker shut down cleanly"


def test_two_studios_run_side_by_side_and_a_dead_child_is_restarted_in_its_own(start_studio):
    first, second = start_studio("first"), start_studio("second")
    _wait_until_serving(first)
    _wait_until_serving(second)
    first_tree = first.descendants()
    node = next(p for p in first_tree if "--name" in p.cmdline() and "node-1" in p.cmdline())

    node.kill()  # a simulated machine dies: the studio goes on and the machine "reboots"

    wait_for(lambda: "node-1 exited unexpectedly with code -9; restarting it" in first.output(), timeout=30,
             message="the supervisor to notice the dead node")
    token = _token(first, "admin")

    def restarted():
        nodes = _get(f"{first.url}/api/v1/health", token)[1]["nodes"]["items"]  # type: ignore[index]
        return [(n["name"], n["state"]) for n in nodes] == [("node-1", "idle")] and any(
            "--name" in p.cmdline() and "node-1" in p.cmdline() and p.pid != node.pid for p in first.descendants())

    wait_for(restarted, timeout=90, message="node-1 to run again")
    assert first.process.poll() is None, first.output()
    assert _get(f"{second.url}/api/v1/health")[0] == 200  # type: ignore[index]

    for studio in (first, second):
        tree = studio.descendants()
        assert _stop(studio, signal.SIGTERM) == 0, studio.output()
        assert _alive(tree) == [], studio.output()


def test_children_die_with_a_killed_supervisor(start_studio):
    studio = start_studio()
    _wait_until_serving(studio)
    # Every child, the embedded Redis included, is started with PR_SET_PDEATHSIG.
    tree = studio.descendants()
    assert len(tree) >= 4

    studio.process.kill()
    studio.process.wait()

    try:
        wait_for(lambda: _alive(tree) == [], timeout=STOP_TIMEOUT, message="children to follow the killed supervisor")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still running:\n" + "\n".join(_alive(tree)) + f"\n{studio.output()}") from None
