from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from studio.api import error_body

log = logging.getLogger(__name__)


NUL = "\x00"


def nul_in_request(request: HttpRequest) -> str | None:
    """What of the URL carries a NUL character (U+0000), which no text column on
    PostgreSQL can hold: "path", or the query parameter's name; None when clean."""
    if NUL in request.path_info or NUL in request.path:
        return "path"
    for name, values in request.GET.lists():
        if NUL in name:
            return name.replace(NUL, "\\x00")
        if any(NUL in value for value in values):
            return name
    return None


class RejectNulMiddleware:
    """Refuse, once for every view, a request whose path or query string holds a NUL byte
    (`%00`): a 400 naming the parameter (the error envelope under /api/, a plain page
    elsewhere), before anything can hand it to the database. Bodies are checked by the
    parsers (studio.parsers)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = nul_in_request(request)
        if where is None:
            return self.get_response(request)
        what = "The path" if where == "path" else f"The query parameter '{where}'"
        message = f"{what} contains a NUL character (%00), which is not allowed."
        if request.path_info.startswith("/api/"):
            return JsonResponse(error_body("invalid", message, {where: ["Contains a NUL character (%00)."]}), status=400)
        return HttpResponseBadRequest(f"Bad request. {message}\n", content_type="text/plain; charset=utf-8")


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
