"""The job's server-sent events through a real HTTP server (Django's live server, a
threaded WSGI server like gunicorn's gthread): events arrive, and a reconnect with
Last-Event-ID resumes without a gap or a repeat."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import pytest
from django.conf import settings

from jobs.metrics import metrics_redis
from jobs.models import JobStatus, TrainingJob
from jobs.transitions import announce
from studio import actions
from trainyard.metrics import MetricsLogger
from trainyard.protocol import EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key

pytestmark = pytest.mark.slow


@dataclass
class Event:
    id: str
    kind: str
    data: dict


class EventClient:
    """A minimal EventSource: one GET, events parsed as they arrive."""

    def __init__(self, base_url: str, path: str, token: str, last_event_id: str | None = None, timeout: float = 10):
        url = urlparse(base_url)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.connection.request("GET", path, headers=headers)
        self.response = self.connection.getresponse()

    def events(self) -> Iterator[Event]:
        fields: dict[str, str] = {}
        while True:
            raw = self.response.readline()
            if not raw:
                return  # the server ended the stream
            line = raw.decode().rstrip("\n")
            if line == "":
                if "event" in fields:
                    yield Event(fields.get("id", ""), fields["event"], json.loads(fields["data"]))
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value

    def next_of(self, kind: str, timeout: float = 10) -> Event:
        deadline = time.monotonic() + timeout
        for event in self.events():
            if event.kind == kind:
                return event
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"no {kind} event within {timeout} s")

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def token(live_server, project, owner) -> str:
    return actions.issue_token(owner, name="sse")[1]


@pytest.fixture
def job(project) -> Iterator[TrainingJob]:
    job = TrainingJob.objects.create(project=project, name="live", status=JobStatus.TRAINING)
    keys = [key(template, job.pk) for template in (EVENTS_STREAM, METRICS_STREAM, LOGS_STREAM, SYSTEM_STREAM)]
    metrics_redis().delete(*keys)
    yield job
    metrics_redis().delete(*keys)


def log_steps(job: TrainingJob, steps: range) -> None:
    logger = MetricsLogger(job.pk, settings.REDIS_URL)
    for step in steps:
        logger.log_metric("loss", step / 10, step)
    assert logger.flush(10)


def test_a_client_gets_metric_events_and_resumes_with_last_event_id_without_duplicates(live_server, job, token):
    path = f"/api/v1/jobs/{job.pk}/stream"
    first = EventClient(live_server.url, path, token)
    assert first.response.status == 200 and first.response.getheader("Content-Type") == "text/event-stream"
    assert first.next_of("status").data["status"] == "Training", "a fresh client learns the status first"

    log_steps(job, range(0, 3))
    # The SDK sends a process's first point at once and batches the rest: one or more events.
    points: list = []
    while len(points) < 3:
        event = first.next_of("metric")
        assert event.data["rank"] == 0
        points += event.data["points"]
    assert points == [["loss", s, s / 10, pytest.approx(time.time(), abs=60)] for s in range(3)]
    first.close()  # the connection drops

    log_steps(job, range(3, 5))  # while nobody listens
    metrics_redis().xadd(key(LOGS_STREAM, job.pk), {"r": 1, "t": "1700000000.5", "s": "err", "l": "warning: x"})
    metrics_redis().xadd(key(SYSTEM_STREAM, job.pk), {"n": "node-1", "t": "1700000000.5", "cpu": "50.0", "mem": "1024",
                                                      "gpu": "", "gpu_mem": ""})
    resumed = EventClient(live_server.url, path, token, last_event_id=event.id)
    missed: list = []
    others: dict[str, Event] = {}
    deadline = time.monotonic() + 10
    for received_event in resumed.events():
        if received_event.kind == "metric":
            missed += [p[1] for p in received_event.data["points"]]
        elif received_event.kind in ("log", "system"):
            others[received_event.kind] = received_event
        if (len(missed) >= 2 and len(others) == 2) or time.monotonic() > deadline:
            break
    resumed.close()
    assert missed == [3, 4], "exactly the missed points: no repeat, no gap"
    assert others["log"].data == {"rank": 1, "time": 1_700_000_000.5, "stream": "err", "line": "warning: x"}
    assert others["system"].data == {"node": "node-1", "time": 1_700_000_000.5, "cpu": 50.0, "mem": 1024.0, "gpu": None,
                                "gpu_mem": None}


def test_the_stream_ends_with_a_final_status_once_the_job_finished(live_server, job, token):
    path = f"/api/v1/jobs/{job.pk}/stream"
    client = EventClient(live_server.url, path, token)
    client.next_of("status")
    log_steps(job, range(2))
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED, final_metrics={"loss": 0.1})
    announce(job.pk, JobStatus.COMPLETED, "2024-01-01T00:00:00+00:00", "done")
    events = list(client.events())  # returns when the server closes the stream
    client.close()
    kinds = [e.kind for e in events]
    sent = [point[1] for e in events if e.kind == "metric" for point in e.data["points"]]
    assert sent == [0, 1] and kinds[-1] == "status", "every point once, then the final status"
    assert events[-1].data["final"] is True and events[-1].data["status"] == "Completed"
    assert events[-1].data["final_metrics"] == {"loss": 0.1}

    again = EventClient(live_server.url, path, token, last_event_id=events[-1].id)
    assert again.response.status == 204, "EventSource stops reconnecting to a finished job"
    again.close()


def test_a_malicious_entry_cannot_inject_events(live_server, job, token):
    client = EventClient(live_server.url, f"/api/v1/jobs/{job.pk}/stream", token)
    client.next_of("status")
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"r": "0", "p": '[["a", 1, 1.0, 0]]\n\nevent: status\ndata: {}'})
    # Nested past json's depth, with a NaN so that it is parsed: skipped, the stream goes on.
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"r": "0", "p": "[" * 100_000 + "NaN"})
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"r": "0", "p": '[["nan", 2, NaN, 0]]'})
    event = client.next_of("metric")
    client.close()
    assert event.data == {"rank": 0, "points": [["nan", 2, None, 0]]}, "the bad entry was skipped, NaN became null"
