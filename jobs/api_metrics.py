"""Metric history, log history and the live event stream of a training job.

    GET /api/v1/jobs/<id>/metrics/                         series: name, rank, count, last value
    GET /api/v1/jobs/<id>/metrics/?name=loss&points=1000   downsampled (M4), rank=N|all
    GET /api/v1/jobs/<id>/metrics/?name=loss&raw=1&cursor=<step>&limit=1000
    GET /api/v1/jobs/<id>/system-metrics/?since=<iso>       node CPU/memory/GPU samples
    GET /api/v1/jobs/<id>/logs/?rank=0&cursor=…&limit=…     or ?tail=N
    GET /api/v1/jobs/<id>/stream                           server-sent events

Reads are lean (values_list, no serializers): a chart asks for these on every page load.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, overload

from django.db import connection
from django.db.models import Count, Max, Min
from django.http import HttpResponse, StreamingHttpResponse
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import get_job_for_user
from jobs.metrics import finite_or_none, series_index_plans
from jobs.metrics import logs as log_pages
from jobs.metrics.downsample import DEFAULT_POINTS, MAX_POINTS, read_series
from jobs.metrics.live import current_positions, decode_positions, event_stream, has_news
from jobs.models import MetricPoint, SystemMetric, TrainingJob
from jobs.serializers_responses import METRICS_RESPONSE, JobLogPageSerializer, SystemMetricsSerializer
from studio.api import ApiError
from studio.redis_conn import redis_client
from studio.schema import sse_event_schema

RAW_DEFAULT_LIMIT = 1000
RAW_MAX_LIMIT = 10_000
SYSTEM_MAX_SAMPLES = 5000


def int_param(request: Request, name: str, default: int | None, *, minimum: int | None = None,
              maximum: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(f"{name} must be an integer, got {raw!r}.", fields={name: ["Not an integer."]}) from None
    if minimum is not None and value < minimum:
        raise ApiError(f"{name} must be at least {minimum}.", fields={name: [f"At least {minimum}."]})
    if maximum is not None and value > maximum:
        raise ApiError(f"{name} must be at most {maximum}.", fields={name: [f"At most {maximum}."]})
    return value


@overload
def rank_param(request: Request, *, allow_all: Literal[False]) -> int: ...
@overload
def rank_param(request: Request, *, allow_all: bool) -> int | None: ...
def rank_param(request: Request, *, allow_all: bool) -> int | None:
    """A rank number, or None for "all" where allowed."""
    raw = request.query_params.get("rank", "0")
    if raw == "all" and allow_all:
        return None
    try:
        return int(raw)
    except ValueError:
        hint = "a rank number or 'all'" if allow_all else "a rank number"
        raise ApiError(f"rank must be {hint}, got {raw!r}.", fields={"rank": [f"Use {hint}."]}) from None


def series_summary(job: TrainingJob) -> list[dict[str, Any]]:
    """Every (name, rank) series with its size, step range and newest value."""
    rows = list(MetricPoint.objects.filter(job=job).values("name", "rank")
                .annotate(count=Count("id"), first_step=Min("step"), last_step=Max("step")).order_by("name", "rank"))
    if not rows:
        return rows
    table = MetricPoint._meta.db_table
    probe = (f"SELECT * FROM (SELECT name, rank, value FROM {table} WHERE job_id = %s AND name = %s "  # noqa: S608
             "AND rank = %s AND step = %s) AS last_point")
    latest: dict[tuple[str, int], float] = {}
    for start in range(0, len(rows), 200):
        chunk = rows[start:start + 200]
        with series_index_plans(), connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join([probe] * len(chunk)),
                           [p for row in chunk for p in (job.pk, row["name"], row["rank"], row["last_step"])])
            latest.update({(name, rank): value for name, rank, value in cursor.fetchall()})
    for row in rows:
        row["last_value"] = finite_or_none(latest.get((row["name"], row["rank"]), float("nan")))
    return rows


def ranks_of(job: TrainingJob, name: str) -> list[int]:
    return list(MetricPoint.objects.filter(job=job, name=name).values_list("rank", flat=True).distinct().order_by("rank"))


class JobMetricsView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("name", str, description="A metric name: without it, the list of series."),
            OpenApiParameter("rank", str, description="Rank number (default 0), or 'all' (downsampled reads only)."),
            OpenApiParameter("points", int, description=f"At most this many points (default {DEFAULT_POINTS}, max {MAX_POINTS}); "
                             "min/max of every bucket kept (M4)."),
            OpenApiParameter("min_step", int), OpenApiParameter("max_step", int),
            OpenApiParameter("raw", bool, description="Every point, cursor-paginated by step."),
            OpenApiParameter("cursor", int, description="raw=1: the next_cursor of the previous page."),
            OpenApiParameter("limit", int, description=f"raw=1: points per page (default {RAW_DEFAULT_LIMIT}, max {RAW_MAX_LIMIT})."),
        ],
        responses=METRICS_RESPONSE,
        description="Without name: the list of series. With name: one rank's series downsampled, every rank's "
                    "(rank=all), or one rank's raw points a page at a time (raw=1).",
    )
    def get(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk)
        name = request.query_params.get("name")
        if not name:
            return Response({"job": job.pk, "series": series_summary(job), "final_metrics": job.final_metrics})
        if request.query_params.get("raw") in ("1", "true", "yes"):
            return Response(self.raw_page(request, job, name))
        points = int_param(request, "points", DEFAULT_POINTS, minimum=4, maximum=MAX_POINTS)
        min_step = int_param(request, "min_step", None)
        max_step = int_param(request, "max_step", None)
        rank = rank_param(request, allow_all=True)
        assert points is not None

        def one(rank_number: int) -> dict[str, Any]:
            series = read_series(job.pk, name, rank_number, points, min_step=min_step, max_step=max_step)
            return {"rank": rank_number, "points": series.points(), "total": series.total, "downsampled": series.downsampled}

        if rank is None:
            return Response({"name": name, "ranks": [one(r) for r in ranks_of(job, name)]})
        return Response({"name": name, **one(rank)})

    def raw_page(self, request: Request, job: TrainingJob, name: str) -> dict[str, Any]:
        rank = rank_param(request, allow_all=False)
        cursor = int_param(request, "cursor", None)
        limit = int_param(request, "limit", RAW_DEFAULT_LIMIT, minimum=1, maximum=RAW_MAX_LIMIT)
        assert limit is not None
        rows = MetricPoint.objects.filter(job=job, name=name, rank=rank)
        if cursor is not None:
            rows = rows.filter(step__gt=cursor)
        with series_index_plans():
            page = list(rows.order_by("step").values_list("step", "value", "time")[:limit + 1])
        more = len(page) > limit
        page = page[:limit]
        return {"name": name, "rank": rank,
                "points": [[step, finite_or_none(value), when.isoformat()] for step, value, when in page],
                "next_cursor": page[-1][0] if more else None}


class JobSystemMetricsView(APIView):
    @extend_schema(parameters=[OpenApiParameter("since", str, description="Only samples after this ISO time.")],
                   responses=SystemMetricsSerializer)
    def get(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk)
        samples = SystemMetric.objects.filter(job=job)
        if since := request.query_params.get("since"):
            when = parse_datetime(since)
            if when is None:
                raise ApiError(f"since must be an ISO date-time, got {since!r}.", fields={"since": ["Not a date-time."]})
            samples = samples.filter(time__gt=when)
        # The newest samples when there are too many: a chart shows the recent past.
        rows = list(samples.order_by("-time").values_list("node_name", "time", "cpu_percent", "memory_bytes", "gpu_percent",
                                                           "gpu_memory_bytes")[:SYSTEM_MAX_SAMPLES])
        rows.reverse()
        return Response({"samples": [_sample(*row) for row in rows], "truncated": len(rows) == SYSTEM_MAX_SAMPLES})


def _sample(node: str, when: datetime, cpu: float, mem: int, gpu: float | None, gpu_mem: int | None) -> dict[str, Any]:
    return {"node": node, "time": when.timestamp(), "cpu": cpu, "mem": mem, "gpu": gpu, "gpu_mem": gpu_mem}


class JobLogsView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("rank", str, description="Rank number (default 0); -1 is the launcher. "
                             "Before the first upload (stream source) also 'all'."),
            OpenApiParameter("cursor", str, description="next_cursor of the previous page: a byte offset (file) or a stream id."),
            OpenApiParameter("limit", int, description=f"Lines per page (default {log_pages.DEFAULT_LINES}, max {log_pages.MAX_LINES})."),
            OpenApiParameter("tail", int, description="The last N lines instead of a page from the cursor."),
            OpenApiParameter("until", str, description="With tail: the last N lines of the live stream at or before this "
                             "stream id (a live view's starting point: its history and its live lines then meet exactly); "
                             "the file's when the stream has none of them."),
        ],
        responses={200: JobLogPageSerializer,
                   502: OpenApiResponse(description="The log file is in the object store but could not be read.")},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk)
        rank = rank_param(request, allow_all=True)
        limit = int_param(request, "limit", log_pages.DEFAULT_LINES, minimum=1, maximum=log_pages.MAX_LINES)
        tail = int_param(request, "tail", None, minimum=1, maximum=log_pages.MAX_LINES)
        assert limit is not None
        try:
            cursor = log_pages.parse_cursor(request.query_params.get("cursor"))
        except ValueError:
            raise ApiError("cursor must be the next_cursor of a previous page.", fields={"cursor": ["Not a log cursor."]}) from None
        until = request.query_params.get("until")
        if until is not None:
            if tail is None or not log_pages.STREAM_ID.fullmatch(until):
                raise ApiError("until takes a stream id (1700000000000-0) and needs tail.",
                               fields={"until": ["A stream id, with tail."]})
            bounded = log_pages.read_stream_page(redis_client(), job, rank, "0-0", limit, tail=tail, until=until)
            if bounded.lines or rank is None:
                return Response({"job": job.pk, "rank": "all" if rank is None else rank, **bounded.as_dict()})
        page = None
        if rank is not None and (cursor is None or cursor[0] == "bytes"):
            try:
                if tail is not None:
                    page = log_pages.tail_file(job, rank, tail)
                else:
                    page = log_pages.read_file_page(job, rank, int(cursor[1]) if cursor else 0, limit)
            except log_pages.StorageError as exc:
                raise ApiError(f"The log could not be read: {exc}", code="storage_error", status_code=502) from exc
        if page is None:
            # Not uploaded yet (or all ranks asked): the live stream's recent lines.
            after = str(cursor[1]) if cursor and cursor[0] == "stream" else "0-0"
            page = log_pages.read_stream_page(redis_client(), job, rank, after, limit, tail=tail)
        return Response({"job": job.pk, "rank": "all" if rank is None else rank, **page.as_dict()})


class EventStreamRenderer(BaseRenderer):
    """Lets `Accept: text/event-stream` (what EventSource sends) through content
    negotiation; errors before the stream starts are still JSON."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return JSONRenderer().render(data)


class JobStreamView(APIView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        parameters=[OpenApiParameter("last_event_id", str, description="Resume after this event id (or send the "
                                     "Last-Event-ID header, as EventSource does).")],
        responses={(200, "text/event-stream"): sse_event_schema(["status", "metric", "log", "system"]),
                   204: OpenApiResponse(description="Resumed on a finished job with nothing new: EventSource stops.")},
        description="Server-sent events: status, metric, log, system. Each event id resumes the stream exactly after it.",
    )
    def get(self, request: Request, pk: int) -> HttpResponse | StreamingHttpResponse:
        job = get_job_for_user(request.user, pk)
        redis = redis_client()
        raw_id = request.META.get("HTTP_LAST_EVENT_ID") or request.query_params.get("last_event_id")
        positions = decode_positions(raw_id)
        resumed = positions is not None
        if positions is None:
            positions = current_positions(redis, job.pk)
        elif job.is_finished() and not has_news(redis, job.pk, positions):
            # 204 tells EventSource to stop reconnecting: a finished job has nothing more.
            return HttpResponse(status=204)
        response = StreamingHttpResponse(event_stream(redis, job.pk, positions, resumed=resumed),
                                         content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
        return response
