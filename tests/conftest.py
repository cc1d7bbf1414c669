"""Shared fixtures: personas, API clients, an isolated object store, moto's S3 server
and a real Celery worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import hashers as _hashers
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from studio import actions
from studio.models import Role
from tests.factories import make_member

ROOT = Path(__file__).resolve().parent.parent

# Users' passwords hashed with MD5, here and in every studio, worker and server the tests start
# (they inherit the variable; studio/settings.py reads it): PBKDF2 costs 0.4 s a user, minutes
# over the suite. This process's settings were read before this file, so they are set here too.
os.environ["STUDIO_TEST_FAST_PASSWORD_HASHING"] = "1"
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher",
                             "django.contrib.auth.hashers.PBKDF2PasswordHasher"]
_hashers.get_hashers.cache_clear()
_hashers.get_hashers_by_algorithm.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def collected_static() -> None:
    """Pages link hashed static names from collectstatic's manifest, as in production
    (studio/staticfiles.py); a session whose sources did not change reuses the last collect.
    The live server then sends /static/ through whitenoise like gunicorn does, rather than
    through Django's finder-based handler, which knows no hashed names."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler

    from studio.staticfiles import collect_static

    collect_static()
    StaticFilesHandler._should_handle = lambda self, path: False  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def isolated_storage(tmp_path_factory) -> Iterator[dict]:
    """One object store and one allowed data root for the whole session, shared with any
    worker process the tests start (they get the same values through the environment)."""
    base = tmp_path_factory.mktemp("studio")
    objects = base / "objects"
    data_root = base / "data"
    objects.mkdir()
    data_root.mkdir()
    values = {
        "STUDIO_OBJECT_STORE": objects.resolve().as_uri(),
        "STUDIO_DATA_ROOTS": [data_root.resolve()],
        "STUDIO_CONTROL_QUEUE": f"control-test-{uuid.uuid4().hex[:8]}",
    }
    override = override_settings(**values)
    override.enable()
    from studio.celery import app

    app.conf.task_default_queue = values["STUDIO_CONTROL_QUEUE"]
    app.conf.task_routes = {"datasets.tasks.*": {"queue": values["STUDIO_CONTROL_QUEUE"]}}
    yield {"objects": objects, "data_root": data_root.resolve(), "queue": values["STUDIO_CONTROL_QUEUE"]}
    override.disable()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> Iterator[None]:
    """pytest-django's test database, and before it is dropped at the end, the connections
    still open to it on PostgreSQL (a worker process or thread a test left behind) ended:
    otherwise DROP DATABASE waits for them, then fails ("being accessed by other users",
    ~11 s at the end of every run) and leaves the database behind."""
    yield
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture
def data_root(isolated_storage) -> Path:
    return isolated_storage["data_root"]


# --- personas ---------------------------------------------------------------------------
@pytest.fixture
def project(db):
    return actions.create_project(slug="acme", name="Acme")


@pytest.fixture
def other_project(db):
    return actions.create_project(slug="rival", name="Rival")


def _member(project, username: str, role: str):
    return make_member(project, username, role)


@pytest.fixture
def owner(project):
    return _member(project, "owner", Role.ADMIN)


@pytest.fixture
def teammate(project):
    return _member(project, "teammate", Role.SCIENTIST)


@pytest.fixture
def viewer(project):
    return _member(project, "viewer", Role.VIEWER)


@pytest.fixture
def reviewer(project):
    return _member(project, "reviewer", Role.REVIEWER)


@pytest.fixture
def outsider(other_project):
    return _member(other_project, "outsider", Role.ADMIN)


@pytest.fixture
def client_for():
    """client_for(user) → an APIClient that sends the user's bearer token."""

    def make(user) -> APIClient:
        _, raw = actions.issue_token(user, name="tests")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client

    return make


# --- S3 through moto's HTTP server --------------------------------------------------------
@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    from studio.embedded_redis import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint, settings, monkeypatch):
    """A boto3 client on moto's server, with the studio pointed at the same endpoint."""
    import boto3
    from botocore.config import Config

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    settings.AWS_ENDPOINT_URL = moto_endpoint
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


# --- a real Celery worker -----------------------------------------------------------------
def _database_url_for_tests() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def worker_env(isolated_storage) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": _database_url_for_tests(),
        "STUDIO_OBJECT_STORE": settings.STUDIO_OBJECT_STORE,
        "STUDIO_DATA_ROOTS": os.pathsep.join(str(p) for p in settings.STUDIO_DATA_ROOTS),
        "STUDIO_CONTROL_QUEUE": isolated_storage["queue"],
        "AWS_ENDPOINT_URL": settings.AWS_ENDPOINT_URL or "",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def celery_worker(transactional_db, isolated_storage, tmp_path) -> Iterator[subprocess.Popen]:
    """A real `celery worker` process on the control queue, against the test database.
    Tasks earlier tests queued with no worker to take them (for rows long rolled back or
    flushed) are purged first: the worker would otherwise spend this test working through
    them (seen as 20+ s late in the suite)."""
    from studio.celery import app

    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(isolated_storage["queue"])
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", isolated_storage["queue"], "-c", "1",
             "--pool", "solo", "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO"],
            cwd=ROOT, env=worker_env(isolated_storage), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if b"ready." in log.read_bytes():
            break
        if proc.poll() is not None:
            pytest.fail(f"celery worker exited at start:\n{log.read_text()}")
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"celery worker not ready in 60 s:\n{log.read_text()}")
    proc.log_path = log  # type: ignore[attr-defined]
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")
