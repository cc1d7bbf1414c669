"""The OpenAPI schema (drf-spectacular): our authentication classes, and StudioAutoSchema,
which makes every operation say what it really answers: its paginated
shape, its error responses and one tag per resource."""

from __future__ import annotations

import re

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import build_array_type
from rest_framework import serializers
from rest_framework.settings import api_settings

from studio.api import KnownFieldsOnly, PaginatedAPIView


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "studio.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A token from POST /api/v1/tokens/ or `studio token USER`."}


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "studio.authentication.CsrfSessionAuthentication"
    name = "cookieAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}


class NonNegativeDecimalScheme(OpenApiSerializerFieldExtension):
    """drf-spectacular writes a decimal's pattern with an optional "-" whatever its min_value;
    a field that takes no negative number (a price) says so in its pattern too."""

    target_class = serializers.DecimalField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        minimum = self.target.min_value
        pattern = schema.get("pattern")
        if minimum is not None and minimum >= 0 and isinstance(pattern, str) and pattern.startswith("^-?"):
            schema["pattern"] = "^" + pattern[3:]
        return schema


# --- the schema of every operation: tags, paginated lists, error responses -------------------
class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable: invalid, not_authenticated, permission_denied, not_found, "
                                           "conflict, in_use, too_large, unsupported_media_type, …")
    message = serializers.CharField(help_text="One sentence for a person, naming the field when there is one.")
    fields = serializers.DictField(child=serializers.JSONField(), help_text=(
        "Per field (dotted for nested ones, e.g. inputs.train) or query parameter: a list of messages."))


class ErrorSerializer(serializers.Serializer):
    """The error envelope of every API error (docs/SPEC.md §6)."""

    error = ErrorDetailSerializer()


ERROR_DESCRIPTIONS = {
    "400": "Invalid input: a field, a query parameter or the body (`error.fields` names each one).",
    "401": "No credentials, or an invalid, expired or revoked token.",
    "403": "Signed in, but your role in the project does not allow this (or a session request without its CSRF token).",
    "404": "No such object, or one in a project you cannot read (also: a page number past the last page).",
    "409": "The object's state forbids it: in use, still running, already finished, or a name already taken.",
    "413": "The request body is over the limit.",
    "415": "The body's Content-Type is not one this operation reads.",
}
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
LIST_PATH_END = re.compile(r"\{[^}]+\}/?$")  # a path that ends with a path parameter names one object


class StudioAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, told what our views do without each view repeating it:

    - one tag per resource (the first path part after /api/v1/), so the docs group them;
    - a GET of a PaginatedAPIView on a collection path answers one page of the real
      paginator (count, next, previous, results), whatever row type it declares;
    - every operation lists the errors it can answer, in the error envelope: 400 always (a
      query parameter can be invalid, a NUL is refused everywhere), 401 (a bad token is
      refused even where no sign-in is needed), 403 where a role is checked, 404 where a
      path or query parameter or the body names something, 409 for writes and downloads (not
      ready yet), 413/415 with a body;
    - a download (a binary 200) may instead redirect (302) to a presigned link; a stored
      file documented as application/octet-stream is served with its own type (*/*)."""

    def _map_basic_serializer(self, serializer, direction):
        # A body the API refuses unknown keys in says so: a client generator then has no
        # catch-all property that would be sent and refused (studio.api.KnownFieldsOnly).
        result = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, KnownFieldsOnly):
            result["additionalProperties"] = False
        return result

    def map_parsers(self) -> list:
        # A view that keeps the default parsers takes JSON: form and multipart bodies are
        # still read (a browser form, curl -F), but nested fields (inputs, hyperparameters)
        # cannot be sent that way, and a generated client sends the first type it is told.
        # Views that accept uploads name their parsers and are documented as they are.
        if self.view.parser_classes == api_settings.DEFAULT_PARSER_CLASSES:
            return ["application/json"]
        media_types = super().map_parsers()
        if "multipart/form-data" in media_types:  # says all a urlencoded form can, and files
            media_types = [media for media in media_types if media != "application/x-www-form-urlencoded"]
        return media_types

    def get_tags(self) -> list[str]:
        parts = [part for part in self.path.split("/") if part]
        if len(parts) >= 3 and parts[:2] == ["api", "v1"] and not parts[2].startswith("{"):
            return [parts[2]]
        return super().get_tags()

    def _is_paginated_list(self) -> bool:
        return self.method == "GET" and isinstance(self.view, PaginatedAPIView) and not LIST_PATH_END.search(self.path)

    def _get_paginator(self):
        if self._is_paginated_list():
            return self.view.paginator
        return super()._get_paginator()

    def _get_pagination_parameters(self):
        if self._is_paginated_list():
            return self.view.paginator.get_schema_operation_parameters(self.view)
        return super()._get_pagination_parameters()

    def _get_response_for_code(self, serializer, status_code, media_types=None, direction="response"):
        response = super()._get_response_for_code(serializer, status_code, media_types, direction)
        if self._is_paginated_list() and "200" <= str(status_code) < "300":
            # A row type given as a plain object (OpenApiTypes.OBJECT) or a raw schema: still
            # one page of them. ($ref: a serializer; a list one is paginated by spectacular.)
            for media in response.get("content", {}).values():
                schema = media["schema"]
                if "$ref" in schema or "results" in schema.get("properties", {}):
                    continue
                rows = schema if schema.get("type") == "array" else build_array_type(schema)
                media["schema"] = self.view.paginator.get_paginated_response_schema(rows)
        return response

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        for code in self._error_codes(operation):
            if code not in responses:
                responses[code] = {"description": ERROR_DESCRIPTIONS[code]}
        for code, response in responses.items():
            if code[0] in "45" and not response.get("content"):  # declared with a description only
                envelope = self._get_response_for_code(ErrorSerializer, code, media_types=["application/json"])
                response["content"] = envelope["content"]
        if self._is_download(responses):
            for code, response in responses.items():
                content = response.get("content") or {}
                if code.startswith("2") and "application/octet-stream" in content:
                    content["*/*"] = content.pop("application/octet-stream")  # a stored file: whatever its type
        if self._is_download(responses) and "302" not in responses:
            responses["302"] = {"description": "Where the object store is S3: a redirect to a short-lived presigned link.",
                                "headers": {"Location": {"schema": {"type": "string", "format": "uri"}}}}
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _error_codes(self, operation: dict) -> list[str]:
        security = operation.get("security") or []
        open_to_anyone = {} in security
        parameters = operation.get("parameters") or []
        codes = ["400"]
        if getattr(self.view, "authentication_classes", None):
            codes.append("401")
        if not open_to_anyone or self.method in UNSAFE:
            codes.append("403")
        download = self._is_download(operation.get("responses") or {})
        if parameters or "requestBody" in operation:  # a body names objects too (a flow to claim from, …)
            codes.append("404")
        if self.method in UNSAFE or download:  # a download of what is not ready yet: 409
            codes.append("409")
        if "requestBody" in operation:
            codes += ["413", "415"]
        return codes

    @staticmethod
    def _is_download(responses: dict) -> bool:
        return any(media.get("schema", {}).get("format") == "binary"
                   for code, response in responses.items() if code.startswith("2")
                   for media in (response.get("content") or {}).values())


def sse_event_schema(events: list[str], description: str = "") -> dict:
    """The schema of one server-sent event (text/event-stream): its `event` name, the `id`
    to resume after it, and its `data` (a JSON document, as text)."""
    return {
        "type": "object", "description": description,
        "properties": {
            "event": {"type": "string", "enum": events},
            "id": {"type": "string", "description": "Send it back as Last-Event-ID to resume right after this event."},
            "data": {"type": "string", "description": "A JSON document."},
            "retry": {"type": "integer", "description": "Milliseconds before a reconnect."},
        },
    }


def openapi_30_nullable(result: dict, generator, request, public) -> dict:
    """POSTPROCESSING_HOOKS: a raw schema written the OpenAPI 3.1 way, `"type": [T, "null"]`,
    becomes what 3.0 (the schema's version) says: `"type": T, "nullable": true`."""

    def fix(node):
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, list):
                others = [t for t in kind if t != "null"]
                if len(others) == 1:
                    node["type"] = others[0]
                    if "null" in kind:
                        node["nullable"] = True
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)

    fix(result)
    return result
