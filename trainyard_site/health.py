"""GET /api/v1/health: whether the database and Redis answer, and how many nodes are live."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import Node
from studio.redis_conn import redis_client


class HealthView(APIView):
    """Database, Redis and nodes. Open to anyone (load balancers, `make run`'s wait);
    node names are listed only to signed-in users."""

    permission_classes = [AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 503: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        database = _check_database()
        redis = _check_redis()
        nodes = list(Node.objects.exclude(state="stopped").order_by("name")) if database["ok"] else []
        body: dict = {
            "status": "ok" if database["ok"] and redis["ok"] else "degraded",
            "database": database,
            "redis": redis,
            "nodes": {"live": sum(1 for n in nodes if n.state != "lost" and n.seconds_since_heartbeat() < _lost_after()),
                      "total": len(nodes)},
        }
        if request.user.is_authenticated:
            body["nodes"]["items"] = [
                {"name": n.name, "hostname": n.hostname, "instance_type": n.instance_type,
                 "state": "lost" if n.seconds_since_heartbeat() >= _lost_after() else n.state,
                 "last_heartbeat": n.last_heartbeat, "cpus": n.cpus, "gpus": n.gpus}
                for n in nodes
            ]
        return Response(body, status=200 if body["status"] == "ok" else 503)


def _lost_after() -> int:
    return settings.STUDIO_NODE_LOST_SECONDS


def _check_database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "vendor": connection.vendor}
    except Exception as exc:  # noqa: BLE001 - any failure is "down", reported with its reason
        return {"ok": False, "error": str(exc)}


def _check_redis() -> dict:
    try:
        redis_client().ping()
        return {"ok": True}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": str(exc)}
