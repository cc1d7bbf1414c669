"""OpenAPI descriptions of our authentication classes for drf-spectacular."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
