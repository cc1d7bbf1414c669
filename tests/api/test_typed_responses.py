"""The lean job endpoints (algorithms, script uploads, metrics, system samples, logs) build
their answers as plain dicts; the schema names every field of them, typed (a generated
client gets classes, not `dict`), and real answers over real data validate against it:
each shape of the metrics endpoint against its own branch, NaN as null, rank as an
integer or "all"."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client

from datasets.storage import object_uri, store_for
from jobs.metrics import metrics_redis
from jobs.metrics.logs import log_uri
from jobs.metrics.store import MetricEntry, write_points
from jobs.models import JobStatus, SystemMetric, TrainingJob
from trainyard.protocol import LOGS_STREAM, key

pytestmark = pytest.mark.django_db
AT = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict:
    with django_db_blocker.unblock():
        response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return response.json()


@pytest.fixture
def job(project, owner):
    # Its own output folder: ids repeat across tests, the object store lasts the session.
    job = TrainingJob.objects.create(project=project, name="run", status=JobStatus.TRAINING, created_by=owner,
                                     output_uri=object_uri(f"jobs/test-{uuid.uuid4().hex}"))
    metrics_redis().delete(key(LOGS_STREAM, job.pk))
    yield job
    metrics_redis().delete(key(LOGS_STREAM, job.pk))


def as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` as JSON Schema says it: null is one more type."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {name: as_json_schema(value) for name, value in node.items() if name != "nullable"}
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def component(schema: dict, name: str) -> dict:
    return schema["components"]["schemas"][name]


def response_schema(schema: dict, path: str, method: str = "get", status: str = "200") -> dict:
    return schema["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


def validate(schema: dict, node: dict, body: Any) -> None:
    """`body` against `node`, with $refs resolved in the served schema's components."""
    document = as_json_schema({**node, "components": schema["components"]})
    jsonschema.Draft202012Validator(document, format_checker=jsonschema.FormatChecker()).validate(body)


def named(schema: dict, node: dict) -> dict:
    """The component a $ref names, asserting the operation names one (not a bare object)."""
    assert "$ref" in node, node
    return component(schema, node["$ref"].rsplit("/", 1)[-1])


def assert_names_every_field(properties_of: dict, body: dict) -> None:
    assert set(properties_of.get("properties", {})) == set(body), (sorted(properties_of.get("properties", {})),
                                                                   sorted(body))


def test_algorithms_are_typed_field_by_field(schema, owner, client_for):
    body = client_for(owner).get("/api/v1/algorithms/").json()
    page = named(schema, response_schema(schema, "/api/v1/algorithms/"))
    assert_names_every_field(page, body)
    algorithm = named(schema, page["properties"]["results"]["items"])
    assert_names_every_field(algorithm, body["results"][0])
    hyperparameter = named(schema, algorithm["properties"]["hyperparameters"]["items"])
    assert_names_every_field(hyperparameter, body["results"][0]["hyperparameters"][0])
    assert hyperparameter["properties"]["min"]["nullable"] is True
    assert any(hp["min"] is None for algo in body["results"] for hp in algo["hyperparameters"])
    validate(schema, response_schema(schema, "/api/v1/algorithms/"), body)


def test_a_script_upload_answers_its_stored_script(schema, owner, client_for):
    response = client_for(owner).post("/api/v1/scripts/", {"project": "acme", "file": SimpleUploadedFile(
        "train.py", b"print('loss=0.5')\n")}, format="multipart")
    assert response.status_code == 201, response.content
    node = response_schema(schema, "/api/v1/scripts/", "post", "201")
    assert_names_every_field(named(schema, node), response.json())
    validate(schema, node, response.json())


def test_every_shape_of_the_metrics_endpoint_validates_against_its_branch(schema, job, owner, client_for):
    points = [["loss", step, 1.0 / (1 + step), 1_700_000_000.0 + step] for step in range(10)]
    points[3][2] = math.nan
    points[-1][2] = math.nan  # the newest value: last_value and final_metrics say null
    with transaction.atomic():
        write_points([MetricEntry(job_id=job.pk, rank=0, payload=json.dumps(points).encode()),
                      MetricEntry(job_id=job.pk, rank=1, payload=json.dumps(points[:4]).encode())])
    client = client_for(owner)
    url = f"/api/v1/jobs/{job.pk}/metrics/"
    node = response_schema(schema, "/api/v1/jobs/{id}/metrics/")
    branches = {ref["$ref"].rsplit("/", 1)[-1] for ref in named(schema, node)["oneOf"]}
    assert branches == {"MetricSeriesList", "MetricSeries", "MetricSeriesRanks", "MetricRawPage"}

    shapes = {
        "MetricSeriesList": client.get(url).json(),
        "MetricSeries": client.get(url, {"name": "loss", "points": 4}).json(),
        "MetricSeriesRanks": client.get(url, {"name": "loss", "rank": "all"}).json(),
        "MetricRawPage": client.get(url, {"name": "loss", "raw": 1, "limit": 5}).json(),
    }
    assert shapes["MetricSeriesList"]["series"][0]["last_value"] is None
    assert shapes["MetricSeriesList"]["final_metrics"] == {"loss": None}
    assert [3, None] in shapes["MetricSeriesRanks"]["ranks"][0]["points"]
    assert shapes["MetricRawPage"]["points"][3][1] is None and shapes["MetricRawPage"]["next_cursor"] == 4
    for name, body in shapes.items():
        assert_names_every_field(component(schema, name), body)
        validate(schema, {"$ref": f"#/components/schemas/{name}"}, body)
        validate(schema, node, body)  # exactly one branch of the oneOf
    summary = named(schema, component(schema, "MetricSeriesList")["properties"]["series"]["items"])
    assert summary["properties"]["last_value"]["nullable"] is True
    last_page = client.get(url, {"name": "loss", "raw": 1, "cursor": 4}).json()
    assert last_page["next_cursor"] is None
    validate(schema, node, last_page)


def test_system_samples_are_typed_with_nullable_gpu(schema, job, owner, client_for):
    SystemMetric.objects.bulk_create([
        SystemMetric(job=job, node_name="node-1", time=AT, cpu_percent=12.5, memory_bytes=2**33,
                     gpu_percent=None, gpu_memory_bytes=None),
        SystemMetric(job=job, node_name="node-2", time=AT, cpu_percent=50.0, memory_bytes=2**30,
                     gpu_percent=99.0, gpu_memory_bytes=2**34)])
    body = client_for(owner).get(f"/api/v1/jobs/{job.pk}/system-metrics/").json()
    node = response_schema(schema, "/api/v1/jobs/{id}/system-metrics/")
    assert_names_every_field(named(schema, node), body)
    sample = named(schema, named(schema, node)["properties"]["samples"]["items"])
    assert_names_every_field(sample, body["samples"][0])
    assert sample["properties"]["gpu"]["nullable"] is True and sample["properties"]["gpu_mem"]["nullable"] is True
    validate(schema, node, body)


def test_log_pages_from_the_file_and_the_stream_are_typed(schema, job, owner, client_for):
    uri = log_uri(job, 0)
    with store_for(uri).open_write(uri) as out:
        out.write(b"one\ntwo\n")
    stream = key(LOGS_STREAM, job.pk)
    for rank, text in ((0, "zero"), (1, "one")):
        metrics_redis().xadd(stream, {"r": rank, "t": "1700000000.000", "s": "out", "l": text})
    client = client_for(owner)
    url = f"/api/v1/jobs/{job.pk}/logs/"
    node = response_schema(schema, "/api/v1/jobs/{id}/logs/")
    page = named(schema, node)
    assert page["properties"]["rank"]["oneOf"] == [{"type": "integer"}, {"type": "string", "enum": ["all"]}]
    from_file = client.get(url, {"rank": 0}).json()
    from_stream = client.get(url, {"rank": "all"}).json()
    assert from_file["source"] == "file" and from_file["rank"] == 0
    assert from_stream["source"] == "stream" and from_stream["rank"] == "all" and len(from_stream["lines"]) == 2
    for body in (from_file, from_stream):
        assert_names_every_field(page, body)
        validate(schema, node, body)
    line = named(schema, page["properties"]["lines"]["items"])
    assert set(line["required"]) == {"rank", "text"}
    assert set(line["properties"]) == set(from_stream["lines"][0]) >= set(from_file["lines"][0])
    # A wrong body is refused: the schema is not a catch-all object.
    with pytest.raises(jsonschema.ValidationError):
        validate(schema, node, {**from_stream, "rank": "every"})


def test_no_property_is_an_inline_allof_that_generators_turn_into_a_class(schema):
    """Seen through openapi-python-client: a log page's `source`, described as an allOf of an
    inline string enum, became an object class built from the string "file", and every logs
    page failed to parse. An allOf wraps a $ref (a named component) or nothing."""
    inline = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for part in node.get("allOf", []):
                if isinstance(part, dict) and "$ref" not in part:
                    inline.append(path)
            for name, value in node.items():
                walk(value, f"{path}/{name}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(schema, "")
    assert not inline, inline
    log_source = schema["components"]["schemas"]["LogSourceEnum"]
    assert log_source["enum"] == ["file", "stream"], log_source
