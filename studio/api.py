"""The API's shared conventions: the error envelope, into which every ActionError an
action raises is turned, and pagination (authentication is in studio.authentication,
which DRF imports while it loads)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView, exception_handler

from studio.errors import ActionError
from studio.parsers import field_path


class KnownFieldsOnly(serializers.Serializer):
    """A request body whose keys the serializer does not know is a 400 naming each (and the
    nearest known name), not a body DRF quietly drops them from: `"stopping":
    {"max_runtime": 60}` ran with no limit, `"resources": {"memory_mb": 512}` with none, and a
    generated client's typo went unseen. Nested serializers that inherit it are checked too
    (the path names the key: `resources.memory_mb`); a key that belongs one level down is
    pointed there (`instance_count` → `resources.instance_count`). The schema says so
    (additionalProperties false: studio.schema.StudioAutoSchema)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in self.fields]
            if unknown:
                raise serializers.ValidationError({str(key): [self.unknown_field_message(str(key))] for key in unknown})
        return super().to_internal_value(data)

    def unknown_field_message(self, key: str) -> str:
        known = [name for name, field in self.fields.items() if not field.read_only]
        nested = [f"{name}.{inner}" for name, field in self.fields.items() if not field.read_only
                  for inner in getattr(getattr(field, "child", field), "fields", {})]
        near = (difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                or [name for name in nested if name.split(".", 1)[1] == key]
                or [name for name in known if key.lower() in name.lower() or name.lower() in key.lower()])
        hint = f"did you mean {near[0]}? The" if near else "the"
        return f"is not a field here; {hint} fields are {', '.join(known)}."


class PagePagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


class PaginatedAPIView(APIView):
    @property
    def paginator(self) -> PagePagination:
        if not hasattr(self, "_paginator"):
            self._paginator = PagePagination()
        return self._paginator


def paginate(view: PaginatedAPIView, request, queryset, rows) -> Response:
    """One page of `queryset`, each page turned into JSON-ready rows by `rows(page)`."""
    page = view.paginator.paginate_queryset(queryset, request, view=view)
    return view.paginator.get_paginated_response(rows(page))


ERROR_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "permission_denied",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_409_CONFLICT: "conflict",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "too_large",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


class ApiError(exceptions.APIException):
    """An error with our own code, status and optional per-field messages."""

    def __init__(self, message: str, *, code: str = "invalid", status_code: int = 400, fields: dict[str, Any] | None = None):
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.error_code = code
        self.fields = fields or {}


MAX_ID = 2**63 - 1  # the largest primary key a bigint (PostgreSQL) or an INTEGER (SQLite) holds


def id_param(params: Any, name: str, message: str = "Must be an integer id.") -> int | None:
    """A query parameter that names a row by id: None when absent, else the id; a 400 naming
    it when it is not a whole number or is past what a primary key can be (the database
    would raise instead of finding nothing: a 500)."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    if not raw.isdigit() or int(raw) > MAX_ID:
        raise ApiError(f"{name}: {message}", fields={name: [message]})
    return int(raw)


def action_error(exc: ActionError) -> ApiError:
    """An action's refusal in the envelope: its status, its code (or the status's), its
    envelope message and each field's message as a one-item list."""
    return ApiError(exc.envelope_message(), code=exc.code or ERROR_CODES.get(exc.status, "invalid"),
                    status_code=exc.status, fields={name: [message] for name, message in exc.fields.items()})


def project_for_write(user: User, slug: str):
    """The project named in a create request, if the user may write in it. A project the
    user cannot even read is reported as missing (400 on `project`), like any bad field."""
    from studio.access import check_role
    from studio.models import Project

    project = Project.objects.filter(slug=slug).first()
    if project is None or project.role_of(user) not in ("admin", "scientist", "viewer"):
        raise ApiError(f"No project '{slug}'.", code="not_found", fields={"project": ["No such project."]})
    check_role(user, project, write=True)
    return project


def _nested(detail: Any) -> Any:
    """A ValidationError's detail as the envelope's `fields`: keyed by the body's own field
    names, a nested serializer's or list's errors nested under them as DRF gives them
    ({"metric_definitions": [{}, {"regex": [...]}]}, {"tags": {1: [...]}}), messages as text.
    Clients test `"tags" in fields`; the message names the item by its path."""
    if isinstance(detail, (list, tuple)):
        flat = [_nested(item) for item in detail]
        return flat if any(isinstance(x, (dict, list)) for x in flat) else [str(x) for x in flat]
    if isinstance(detail, dict):
        return {key: _nested(value) for key, value in detail.items()}
    return str(detail)


def field_messages(detail: Any) -> dict[str, list[str]]:
    """A ValidationError's messages flat, by each field's path (`metric_definitions[1].regex`,
    `tags[1]`, `environment.A`), for the envelope's message: DRF's dicts keyed by index gave
    'tags: …' without the item, or '{}' for a many=True list's first, valid, item. A nested
    serializer's own non-field errors go to its path; the body's own to `non_field_errors`."""
    fields: dict[str, list[str]] = {}

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "non_field_errors" and where:
                    walk(item, where)
                else:  # a ListField's item errors are keyed by int index, a DictField's by key
                    walk(item, field_path(where, key, index=isinstance(key, int)))
        elif isinstance(value, (list, tuple)) and any(isinstance(item, (dict, list, tuple)) for item in value):
            for index, item in enumerate(value):  # a many=True serializer: one entry per item, {} if fine
                walk(item, field_path(where, index, index=True))
        else:
            messages = value if isinstance(value, (list, tuple)) else [value]
            fields.setdefault(where or "non_field_errors", []).extend(str(m) for m in messages)

    walk(detail, "")
    return fields


def _first_message(fields: dict[str, list[str]]) -> str:
    for name, messages in fields.items():
        message = messages[0] if messages else "Invalid."
        return message if name == "non_field_errors" else f"{name}: {message}"
    return "Invalid input."


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


# get_object_or_404 says "No TrainingJob matches the given query.": a class name, not words.
_MODEL_NOT_FOUND = re.compile(r"^No (?P<model>[A-Za-z]+) matches the given query\.$")


def not_found_message(message: str) -> str:
    if match := _MODEL_NOT_FOUND.match(message):
        noun = re.sub(r"(?<!^)(?=[A-Z])", " ", match["model"]).lower()
        return f"No such {noun} in the projects you can see."
    return message or "Not found."


def error_envelope_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every API error as {"error": {"code", "message", "fields"}} (docs/SPEC.md §6)."""
    if isinstance(exc, ActionError):
        exc = action_error(exc)
    elif isinstance(exc, RequestDataTooBig):
        exc = ApiError(f"The request body is too large: {exc}", code="too_large", status_code=413)
    elif isinstance(exc, SuspiciousOperation):  # e.g. TooManyFieldsSent: more than 1,000 form fields
        exc = ApiError(f"The request was refused: {exc}")
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound(not_found_message(str(exc)))
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        body = error_body(exc.error_code, str(exc.detail), exc.fields)
    elif isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        body = error_body("invalid", _first_message(field_messages(detail)), _nested(detail))
    else:
        message = str(exc.detail) if isinstance(exc, exceptions.APIException) else str(exc)
        code = ERROR_CODES.get(response.status_code, getattr(exc, "default_code", "error"))
        body = error_body(code, message)
    response.data = body
    return response
