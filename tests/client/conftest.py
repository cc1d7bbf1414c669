"""A real studio for the client: the live server (HTTP on a loopback port), a control
worker (Celery: it schedules what the API submits), the session's node worker, and the
`trainyard` command run as a subprocess with TRAINYARD_URL / TRAINYARD_TOKEN."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from studio import actions
from tests.conftest import ROOT
from tests.jobs.conftest import node, node_worker  # noqa: F401 - fixtures

SCRIPTS = Path(__file__).resolve().parent / "scripts"
CLI_TIMEOUT_SECONDS = 180


@dataclass
class Studio:
    url: str
    token: str
    env: dict[str, str]


@pytest.fixture
def studio(live_server, project, owner, tmp_path) -> Studio:
    """The live server and the owner's token; the CLI's config folder is the test's own."""
    _, token = actions.issue_token(owner, name="cli-tests")
    env = {**os.environ, "TRAINYARD_URL": live_server.url, "TRAINYARD_TOKEN": token, "TRAINYARD_PROJECT": project.slug,
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return Studio(url=live_server.url, token=token, env=env)


@pytest.fixture
def running_studio(studio, celery_worker, request) -> Studio:
    """The studio with a control worker and an idle node: submitted jobs run."""
    request.getfixturevalue("node")
    return studio


@pytest.fixture
def cli(studio) -> Callable[..., subprocess.CompletedProcess]:
    """cli("run", "train.py", ..., env={...}, input="...") → the finished `trainyard` process."""

    def run(*args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout: float = CLI_TIMEOUT_SECONDS) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainyard.client.cli", *args], cwd=ROOT, env=env or studio.env,
                              input=input, capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def source_dir(tmp_path) -> Path:
    """A copy of the DDP classifier's folder, with what must not be sent beside it: a
    .gitignore'd file and folder, a virtualenv, .git, __pycache__, and a file over the
    size limit the tests pass (--max-file-size 0.05, in MiB)."""
    folder = tmp_path / "ddp_classifier"
    shutil.copytree(SCRIPTS / "ddp_classifier", folder)
    (folder / ".gitignore").write_text("*.log\nscratch/\n!keep.log\n")
    (folder / "run.log").write_text("ignored\n")
    (folder / "keep.log").write_text("negated, so sent\n")
    (folder / "scratch").mkdir()
    (folder / "scratch" / "notes.txt").write_text("ignored folder\n")
    for never in (".venv/lib", ".git", "__pycache__", "env/bin"):
        (folder / never).mkdir(parents=True)
    (folder / ".venv" / "lib" / "site.py").write_text("x = 1\n")
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "__pycache__" / "helpers.cpython-311.pyc").write_bytes(b"\0" * 10)
    (folder / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (folder / "data.bin").write_bytes(b"\1" * 100_000)
    return folder
