"""Metric history, system samples and log history over the API: access, shapes, cursors,
and a field error for each bad parameter."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from django.db import transaction

from datasets.storage import object_uri, store_for
from jobs.metrics import downsample, metrics_redis, rollups
from jobs.metrics.logs import log_uri
from jobs.metrics.store import MetricEntry, write_points
from jobs.models import JobStatus, MetricPoint, SystemMetric, TrainingJob
from trainyard.protocol import LOGS_STREAM, key

AT = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.fixture
def job(project, owner):
    # Its own output folder: ids repeat across tests, the object store lasts the session.
    job = TrainingJob.objects.create(project=project, name="run", status=JobStatus.TRAINING, created_by=owner,
                                     output_uri=object_uri(f"jobs/test-{uuid.uuid4().hex}"))
    metrics_redis().delete(key(LOGS_STREAM, job.pk))
    yield job
    metrics_redis().delete(key(LOGS_STREAM, job.pk))


def add_points(job: TrainingJob, name: str, count: int, rank: int = 0, scale: float = 1.0) -> None:
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name=name, step=step, rank=rank, value=scale * step, time=AT)
                                     for step in range(count)], batch_size=1000)


def test_outsiders_get_404_and_strangers_401(job, outsider, client_for):
    from rest_framework.test import APIClient

    for suffix in ("metrics/", "metrics/?name=loss", "system-metrics/", "logs/", "stream"):
        response = client_for(outsider).get(f"/api/v1/jobs/{job.pk}/{suffix}")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", suffix
        assert APIClient().get(f"/api/v1/jobs/{job.pk}/{suffix}").status_code == 401, suffix


def test_series_list_names_each_series_with_count_and_last_value(job, viewer, client_for, django_assert_max_num_queries):
    add_points(job, "loss", 30, scale=-1.0)
    add_points(job, "loss", 5, rank=1)
    add_points(job, "acc", 3, scale=0.25)
    TrainingJob.objects.filter(pk=job.pk).update(final_metrics={"loss": -29.0, "acc": 0.5})
    client = client_for(viewer)
    # A fixed number, whatever the number of series (PostgreSQL adds a savepoint and
    # planner settings around the last-value probe).
    with django_assert_max_num_queries(14):
        body = client.get(f"/api/v1/jobs/{job.pk}/metrics/").json()
    assert body["series"] == [
        {"name": "acc", "rank": 0, "count": 3, "first_step": 0, "last_step": 2, "last_value": 0.5},
        {"name": "loss", "rank": 0, "count": 30, "first_step": 0, "last_step": 29, "last_value": -29.0},
        {"name": "loss", "rank": 1, "count": 5, "first_step": 0, "last_step": 4, "last_value": 4.0},
    ]
    assert body["final_metrics"] == {"loss": -29.0, "acc": 0.5}


def test_a_series_is_downsampled_on_request_and_keeps_its_spike(job, owner, client_for):
    add_points(job, "loss", 3000)
    MetricPoint.objects.filter(job=job, step=1234).update(value=1e6)
    add_points(job, "loss", 10, rank=1)
    client = client_for(owner)

    body = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss", "points": 100}).json()
    assert body["name"] == "loss" and body["rank"] == 0 and body["total"] == 3000 and body["downsampled"] is True
    assert len(body["points"]) <= 100 and [1234, 1e6] in body["points"]

    small = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss", "rank": 1}).json()
    assert small["downsampled"] is False and small["points"] == [[step, float(step)] for step in range(10)]

    every = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss", "rank": "all", "points": 40}).json()
    assert [(r["rank"], r["total"]) for r in every["ranks"]] == [(0, 3000), (1, 10)]

    missing = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "nope"}).json()
    assert missing["total"] == 0 and missing["points"] == [], "a chart may ask before the first point"


def test_a_long_series_is_served_from_its_rollups(job, owner, client_for, monkeypatch):
    # Small chunks and threshold stand in for a million points in 256-step chunks.
    monkeypatch.setattr(rollups, "CHUNK_BITS", 3)
    monkeypatch.setattr(downsample, "RAW_THRESHOLD", 1000)
    points = [["loss", step, 1.0 / (1 + step), 1_700_000_000.0] for step in range(6000)]
    points[4321][2] = -1e6
    with transaction.atomic():
        write_points([MetricEntry(job_id=job.pk, rank=0, payload=json.dumps(points).encode())])
    client = client_for(owner)
    body = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss", "points": 200}).json()
    assert body["total"] == 6000 and body["downsampled"] is True and len(body["points"]) <= 200
    assert [4321, -1e6] in body["points"] and body["points"][0] == [0, 1.0] and body["points"][-1][0] == 5999

    window = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss", "points": 100, "min_step": 1001,
                                                            "max_step": 4998}).json()
    assert window["total"] == 3998 and window["points"][0][0] == 1001 and window["points"][-1][0] == 4998
    assert [4321, -1e6] in window["points"]


def test_raw_history_is_cursor_paginated_without_gaps_or_repeats(job, owner, client_for):
    add_points(job, "loss", 2500)
    client = client_for(owner)
    steps: list[int] = []
    cursor = None
    pages = 0
    while True:
        params = {"name": "loss", "raw": 1, "limit": 1000, **({"cursor": cursor} if cursor is not None else {})}
        body = client.get(f"/api/v1/jobs/{job.pk}/metrics/", params).json()
        steps += [point[0] for point in body["points"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and steps == list(range(2500))
    assert body["points"][-1] == [2499, 2499.0, AT.isoformat().replace("+00:00", "+00:00")]


@pytest.mark.parametrize(("params", "field"), [
    ({"name": "loss", "points": "many"}, "points"),
    ({"name": "loss", "points": 2}, "points"),
    ({"name": "loss", "points": 10**6}, "points"),
    ({"name": "loss", "rank": "first"}, "rank"),
    ({"name": "loss", "raw": 1, "rank": "all"}, "rank"),
    ({"name": "loss", "raw": 1, "cursor": "x"}, "cursor"),
    ({"name": "loss", "raw": 1, "limit": 0}, "limit"),
])
def test_bad_metric_parameters_are_field_errors(job, owner, client_for, params, field):
    response = client_for(owner).get(f"/api/v1/jobs/{job.pk}/metrics/", params)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_system_samples_in_time_order(job, owner, client_for):
    SystemMetric.objects.bulk_create([
        SystemMetric(job=job, node_name="node-1", time=datetime(2024, 1, 1, 0, 0, s, tzinfo=UTC), cpu_percent=10.0 * s,
                     memory_bytes=2**30, gpu_percent=None, gpu_memory_bytes=None) for s in range(3)])
    client = client_for(owner)
    body = client.get(f"/api/v1/jobs/{job.pk}/system-metrics/").json()
    assert [s["cpu"] for s in body["samples"]] == [0.0, 10.0, 20.0]
    assert body["samples"][0] == {"node": "node-1", "time": datetime(2024, 1, 1, tzinfo=UTC).timestamp(), "cpu": 0.0,
                                  "mem": 2**30, "gpu": None, "gpu_mem": None}
    later = client.get(f"/api/v1/jobs/{job.pk}/system-metrics/", {"since": "2024-01-01T00:00:00+00:00"}).json()
    assert len(later["samples"]) == 2
    assert client.get(f"/api/v1/jobs/{job.pk}/system-metrics/", {"since": "yesterday"}).status_code == 400


def write_log(job: TrainingJob, rank: int, text: str) -> None:
    uri = log_uri(job, rank)
    with store_for(uri).open_write(uri) as out:
        out.write(text.encode())


def test_logs_are_paged_from_the_uploaded_file_by_byte_offset(job, owner, client_for):
    write_log(job, 0, "one\ntwo\nthree\nfour")  # "four" is still being written
    client = client_for(owner)
    url = f"/api/v1/jobs/{job.pk}/logs/"

    first = client.get(url, {"rank": 0, "limit": 2}).json()
    assert [line["text"] for line in first["lines"]] == ["one", "two"]
    assert first["cursor_kind"] == "bytes" and first["source"] == "file" and first["complete"] is False
    second = client.get(url, {"rank": 0, "cursor": first["next_cursor"]}).json()
    assert [line["text"] for line in second["lines"]] == ["three"], "a partial last line waits"

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    last = client.get(url, {"rank": 0, "cursor": second["next_cursor"]}).json()
    assert [line["text"] for line in last["lines"]] == ["four"] and last["complete"] is True
    assert last["lines"][0] == {"rank": 0, "text": "four"}

    tail = client.get(url, {"rank": 0, "tail": 2}).json()
    assert [line["text"] for line in tail["lines"]] == ["three", "four"]


def test_logs_come_from_the_live_stream_before_the_first_upload(job, owner, client_for):
    stream = key(LOGS_STREAM, job.pk)
    for rank, text in [(0, "hello"), (1, "other rank"), (0, "world")]:
        metrics_redis().xadd(stream, {"r": rank, "t": "1700000000.000", "s": "out", "l": text})
    client = client_for(owner)
    url = f"/api/v1/jobs/{job.pk}/logs/"

    body = client.get(url, {"rank": 0}).json()
    assert body["source"] == "stream" and body["cursor_kind"] == "stream"
    assert body["lines"] == [{"rank": 0, "time": 1_700_000_000.0, "stream": "out", "text": "hello"},
                             {"rank": 0, "time": 1_700_000_000.0, "stream": "out", "text": "world"}]
    metrics_redis().xadd(stream, {"r": 0, "t": "1700000001.000", "s": "err", "l": "late"})
    more = client.get(url, {"rank": 0, "cursor": body["next_cursor"]}).json()
    assert [line["text"] for line in more["lines"]] == ["late"], "only what came after the cursor"

    everyone = client.get(url, {"rank": "all", "tail": 2}).json()
    assert [line["text"] for line in everyone["lines"]] == ["world", "late"]


def test_a_live_views_history_ends_where_its_stream_starts_even_when_the_file_lags(job, owner, client_for):
    # The job page starts its live stream at the log stream's newest id and reads the
    # history up to it: the stored file (synced every few seconds) holds only "a", the
    # stream "a".."c" then "d" after the page's start — no gap ("b", "c") and no repeat ("d").
    write_log(job, 0, "a\n")
    stream = key(LOGS_STREAM, job.pk)
    ids = [metrics_redis().xadd(stream, {"r": 0, "t": f"17000000{i:02d}.000", "s": "out", "l": text}).decode()
           for i, text in enumerate("abc")]
    metrics_redis().xadd(stream, {"r": 1, "t": "1700000003.000", "s": "out", "l": "other rank"})
    metrics_redis().xadd(stream, {"r": 0, "t": "1700000004.000", "s": "out", "l": "d"})
    url = f"/api/v1/jobs/{job.pk}/logs/"
    client = client_for(owner)

    body = client.get(url, {"rank": 0, "tail": 100, "until": ids[-1]}).json()
    assert [line["text"] for line in body["lines"]] == ["a", "b", "c"] and body["source"] == "stream"
    assert all("time" in line for line in body["lines"])
    assert [line["text"] for line in client.get(url, {"rank": 0, "tail": 2, "until": ids[-1]}).json()["lines"]] == ["b", "c"]
    # Nothing of that rank in the stream (expired): the file's tail.
    assert [line["text"] for line in client.get(url, {"rank": 5, "tail": 10, "until": ids[-1]}).json()["lines"]] == []
    assert client.get(url, {"rank": 0, "tail": 10, "until": "0-1"}).json()["lines"] == [{"rank": 0, "text": "a"}]
    for bad in ({"rank": 0, "until": ids[-1]}, {"rank": 0, "tail": 5, "until": "../x"}):
        response = client.get(url, bad)
        assert response.status_code == 400 and "until" in response.json()["error"]["fields"], response.json()


def test_bad_log_cursor_is_a_field_error(job, owner, client_for):
    response = client_for(owner).get(f"/api/v1/jobs/{job.pk}/logs/", {"cursor": "../etc"})
    assert response.status_code == 400 and "cursor" in response.json()["error"]["fields"]


def test_logs_are_read_with_range_requests_from_s3(job, owner, client_for, s3):
    s3.create_bucket(Bucket="logs")
    TrainingJob.objects.filter(pk=job.pk).update(output_uri="s3://logs/jobs/run", status=JobStatus.COMPLETED)
    s3.put_object(Bucket="logs", Key="jobs/run/logs/rank-1.log", Body=b"a\nb\nc\n")
    client = client_for(owner)
    first = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": 1, "limit": 2}).json()
    assert [line["text"] for line in first["lines"]] == ["a", "b"] and first["next_cursor"] == "4"
    rest = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": 1, "cursor": "4"}).json()
    assert [line["text"] for line in rest["lines"]] == ["c"] and rest["complete"] is True
    end = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": 1, "cursor": rest["next_cursor"]}).json()
    assert end["lines"] == [] and end["complete"] is True
