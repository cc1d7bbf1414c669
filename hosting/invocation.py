"""The hot path: POST /api/v1/endpoints/<name>/invocations.

A request costs two plain SQL statements (its token; the endpoint row joined with its
version and its review flow, filtered by the caller's read role), and one INSERT when
human loops start. The endpoint row is read once and the request is
served entirely with the version it names,
so switching an endpoint's version (one UPDATE) never fails a request in flight.
Invocation counts are summed in memory and written at most once a second per process."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import F

from hosting.flows import flow_model, send_predictions
from hosting.models import Endpoint, ModelKind, ModelVersion
from hosting.serving import InvalidInstances, parse_instances, predictor_for
from studio.models import READ_ROLES, aware_datetime, json_column

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


FLUSH_SECONDS = 1.0

_count_lock = threading.Lock()
_pending_counts: Counter[int] = Counter()
_last_flush = time.monotonic()


# One statement, no ORM compilation (the ORM's SQL building cost more than the query):
# the endpoint, the version it serves, the review flow's fields that starting loops reads,
# and whether the user may read its project.
_ENDPOINT_SQL = """
SELECT e.id, e.name, e.project_id, e.flow_definition_id,
       v.id, v.model_id, v.version, v.artifact_uri, v.algorithm, v.kind, v.labels, v.input_schema, v.created_at,
       f.name, f.project_id, f.activation, f.task_count, f.task_availability_seconds, v.calibration
FROM hosting_endpoint e JOIN hosting_modelversion v ON v.id = e.model_version_id
LEFT JOIN {flows} f ON f.id = e.flow_definition_id
WHERE e.name = %s AND (%s OR EXISTS (
    SELECT 1 FROM studio_membership m WHERE m.project_id = e.project_id AND m.user_id = %s AND m.role IN ({roles})))
"""
_ROLES = sorted(str(role) for role in READ_ROLES)


@cache
def _endpoint_sql() -> str:
    return _ENDPOINT_SQL.format(flows=flow_model()._meta.db_table, roles=", ".join(["%s"] * len(_ROLES)))


def endpoint_for_invocation(user: User | AnonymousUser, name: str) -> Endpoint | None:
    """The endpoint (with its model_version and flow_definition set) if the user may invoke
    it — a reader of its project — else None (a 404: outsiders learn nothing)."""
    sql = _endpoint_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [name, bool(user.is_superuser), user.pk, *_ROLES])
        row = cursor.fetchone()
    if row is None:
        return None
    created_at = aware_datetime(row[12])  # SQLite may hand timestamps back as text
    version = ModelVersion(id=row[4], model_id=row[5], version=row[6], artifact_uri=row[7], algorithm=row[8],
                           kind=row[9], labels=json_column(row[10]), input_schema=json_column(row[11]), created_at=created_at,
                           calibration=json_column(row[18]) or {})
    endpoint = Endpoint(id=row[0], name=row[1], project_id=row[2], model_version_id=version.pk,
                        flow_definition_id=row[3])
    endpoint.model_version = version
    endpoint.flow_definition = None  # (assigning the relation sets flow_definition_id too)
    if row[3] is not None:
        # Only what the receivers of predictions_made read (hosting.flows). A FlowDefinition,
        # built through the relation's model because hosting does not import review.
        flow = flow_model()(id=row[3], name=row[13], project_id=row[14], activation=json_column(row[15]),
                            task_count=row[16], task_availability_seconds=row[17])
        endpoint.flow_definition = flow  # type: ignore[assignment]
    return endpoint


def invoke(endpoint: Endpoint, instances: Any) -> dict[str, Any]:
    """{"predictions": [...], "human_loops": [names]}; InvalidInstances for a 400."""
    version = endpoint.model_version  # read once with the endpoint row: this request's version
    records, contents = parse_instances(version, instances)
    predictor = predictor_for(version)
    calibration = version.calibration if version.kind != ModelKind.GENERATIVE else {}
    try:
        predictions = predictor.predict(records, calibration) if calibration else predictor.predict(records)
    except ValueError as exc:
        raise InvalidInstances(f"instances: {exc}") from None
    loops: list[str] = []
    if endpoint.flow_definition is not None and version.kind != ModelKind.GENERATIVE:
        loops = send_predictions(Endpoint, endpoint.flow_definition, list(zip(contents, predictions, strict=True)),
                                 source={"endpoint": endpoint.name, "model_version": version.pk},
                                 model_version=version)
    count_invocation(endpoint.pk)
    return {"predictions": predictions, "human_loops": loops, "model_version": version.version,
            "warnings": unknown_categories(version, records), **calibration_fields(version)}


def calibration_fields(version: ModelVersion) -> dict[str, Any]:
    """What a response says of its confidences: calibrated or the model's own softmax, and
    how (the temperature, the evaluation it came from)."""
    calibration = version.calibration or {}
    if version.kind == ModelKind.GENERATIVE:
        return {}
    if not calibration.get("method"):
        return {"calibrated": False, "calibration": None}
    return {"calibrated": True, "temperature": calibration.get("temperature"),
            "calibration": {key: calibration.get(key) for key in ("method", "temperature", "evaluation", "set_at")}}


MAX_WARNINGS = 20


def _category(value: Any) -> str:
    """A value as the tabular encoder compares it with its vocabulary (algorithms/tabular.py)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "" if value is None else str(value).strip()


def unknown_categories(version: ModelVersion, records: list[Any]) -> list[str]:
    """One line per categorical value the model never saw in training: it is encoded as none
    of the known values, so the answer may be worth less; the caller should know (at most
    MAX_WARNINGS lines, then how many more)."""
    vocabularies = (version.input_schema or {}).get("categorical") or {} if version.kind == ModelKind.TABULAR else {}
    if not isinstance(vocabularies, dict) or not vocabularies:
        return []
    known = {column: {str(value) for value in values} for column, values in vocabularies.items()}
    lines: list[str] = []
    for index, record in enumerate(records):
        for column, values in known.items():
            shown = _category(record.get(column) if isinstance(record, dict) else None)
            if shown and shown not in values:
                lines.append(f"instances[{index}]: '{column}' = {shown!r} is not a value the model saw in training "
                             f"(known: {', '.join(sorted(values)[:10])}{', …' if len(values) > 10 else ''}); "
                             "it was encoded as none of them")
    if len(lines) > MAX_WARNINGS:
        lines = lines[:MAX_WARNINGS] + [f"… and {len(lines) - MAX_WARNINGS} more unknown values"]
    return lines


def count_invocation(endpoint_id: int) -> None:
    global _last_flush
    with _count_lock:
        _pending_counts[endpoint_id] += 1
        due = time.monotonic() - _last_flush >= FLUSH_SECONDS
    if due:
        flush_invocation_counts()


def flush_invocation_counts() -> None:
    global _last_flush
    with _count_lock:
        if not _pending_counts:
            return  # nothing to write: the next invocation's own flush stays due on time
        counts = dict(_pending_counts)
        _pending_counts.clear()
        _last_flush = time.monotonic()
    for endpoint_id, count in counts.items():
        Endpoint.objects.filter(pk=endpoint_id).update(invocations=F("invocations") + count)
