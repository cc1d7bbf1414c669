"""The client installs from the repository into a fresh virtualenv (no system site
packages, so no Django) and its command runs there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
INSTALL_TIMEOUT_SECONDS = 420


def test_the_client_installs_into_a_fresh_virtualenv_without_django(tmp_path):
    # A copy of what the package is built from, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copytree(ROOT / "trainyard", source / "trainyard", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")}
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv:
        commands = [[uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
                    [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{source}[client]"]]
    else:
        commands = [[sys.executable, "-m", "venv", str(venv)],
                    [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                     f"{source}[client]"]]
    for command in commands:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
        assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"

    help_text = subprocess.run([str(venv / "bin" / "trainyard"), "--help"], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=60)
    assert help_text.returncode == 0, help_text.stderr
    for command in ("login", "run", "jobs", "datasets", "tune"):
        assert command in help_text.stdout
    probe = ("import importlib.util, sys, trainyard.client.cli; "
             "print(importlib.util.find_spec('django') is None, 'django' in sys.modules, importlib.util.find_spec('torch') is None)")
    found = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
    assert found.stdout.split() == ["True", "False", "True"], found.stdout + found.stderr
    unreachable = subprocess.run([str(venv / "bin" / "trainyard"), "jobs", "list"], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=60, env={**env, "TRAINYARD_URL": "http://127.0.0.1:9", "TRAINYARD_TOKEN": "x"})
    assert unreachable.returncode == 3 and "Could not reach the studio" in unreachable.stderr, unreachable.stderr
