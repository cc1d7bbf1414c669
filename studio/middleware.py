from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, JsonResponse

from studio.api import error_body

log = logging.getLogger(__name__)


class ApiErrorMiddleware:
    """Under /api/, answer Django-level 404s and unexpected errors in the error envelope,
    never with an HTML page. (DRF's handler covers errors raised inside API views.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith("/api/") and response.status_code == 404 and not response.get("Content-Type", "").startswith("application/json"):
            return JsonResponse(error_body("not_found", f"No API endpoint at {request.path}."), status=404)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith("/api/"):
            return None
        log.exception("unhandled error on %s", request.path)
        return JsonResponse(error_body("server_error", "An internal error occurred; it has been logged."), status=500)
