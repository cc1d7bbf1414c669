"""HTTP to a studio's API (httpx): bearer authentication, the error envelope turned into
ApiError (docs/SPEC.md §6), and a server-sent event reader that resumes where it stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from trainyard import __version__

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT_SECONDS = 30.0
# Script and dataset uploads can be large: their writes get longer than a JSON request.
UPLOAD_TIMEOUT_SECONDS = 600.0
# The studio sends a comment line at least every 15 s on an idle event stream.
STREAM_READ_TIMEOUT_SECONDS = 60.0


class StudioUnreachable(Exception):
    """No answer from the studio at all: a wrong URL, a studio that is down, a network error."""

    def __init__(self, url: str, cause: Exception):
        super().__init__(f"Could not reach the studio at {url}: {cause.__class__.__name__}: {cause}")
        self.url = url


@dataclass(eq=False)
class ApiError(Exception):
    """A request the studio refused, with the envelope's code, message and per-field
    messages keyed by the field's dotted path (`resources.instance_count`)."""

    status: int
    code: str
    message: str
    fields: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """One line per refused field (`resources.instance_count: Ensure this value is …`),
        or the message alone when no field is named."""
        named = [f"{name}: {message}" for name, messages in self.fields.items() for message in messages]
        return named or [self.message]

    @property
    def is_client_error(self) -> bool:
        return 400 <= self.status < 500


def flatten_fields(fields: Any, prefix: str = "") -> dict[str, list[str]]:
    """The envelope's nested `fields` as dotted path → messages."""
    if isinstance(fields, dict):
        flat: dict[str, list[str]] = {}
        for name, value in fields.items():
            path = f"{prefix}.{name}" if prefix and name != "non_field_errors" else (prefix or str(name))
            for inner, messages in flatten_fields(value, path).items():
                flat.setdefault(inner, []).extend(messages)
        return flat
    if isinstance(fields, list):
        if all(isinstance(item, str) for item in fields):
            return {prefix: list(fields)} if fields else {}
        flat = {}
        for index, item in enumerate(fields):
            for inner, messages in flatten_fields(item, f"{prefix}.{index}" if prefix else str(index)).items():
                flat.setdefault(inner, []).extend(messages)
        return flat
    return {prefix: [str(fields)]}


def error_from_response(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    envelope = body.get("error") if isinstance(body, dict) else None
    if isinstance(envelope, dict):
        return ApiError(response.status_code, str(envelope.get("code") or "error"),
                        str(envelope.get("message") or response.reason_phrase), flatten_fields(envelope.get("fields") or {}))
    text = response.text.strip().splitlines()[0][:300] if response.text.strip() else response.reason_phrase
    return ApiError(response.status_code, "error", f"HTTP {response.status_code} from {response.request.url}: {text}")


@dataclass(frozen=True)
class Event:
    """One server-sent event of a job's stream: `status`, `metric`, `log` or `system`."""

    kind: str
    id: str | None
    data: Any


def normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("The studio URL is empty.")
    if "://" not in url:
        url = f"http://{url}"
    return url.removesuffix(API_PREFIX)


class StudioHttp:
    """The studio's API at `url` with `token`; every path is under /api/v1/."""

    def __init__(self, url: str, token: str | None, *, timeout: float = DEFAULT_TIMEOUT_SECONDS):
        self.url = normalise_url(url)
        headers = {"User-Agent": f"trainyard-client/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.client = httpx.Client(base_url=self.url + API_PREFIX, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise StudioUnreachable(self.url, exc) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        response = self.request("POST", path, json=body, **kwargs) if body is not None else self.request("POST", path, **kwargs)
        return response.json() if response.content else None

    def upload(self, path: str, data: dict[str, Any], files: list[tuple[str, tuple[str, Any, str]]], **kwargs: Any) -> Any:
        return self.request("POST", path, data=data, files=files, timeout=UPLOAD_TIMEOUT_SECONDS, **kwargs).json()

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every row of a page-number paginated list."""
        page = 1
        while True:
            body = self.get(path, page=page, **params)
            yield from body.get("results", [])
            if not body.get("next"):
                return
            page += 1

    def events(self, path: str, last_event_id: str | None = None) -> Iterator[Event]:
        """The event stream at `path`, reconnecting after the studio ends a long stream
        (it does every few minutes) from the last event id, until a 204 or a `status`
        event marked final."""
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            timeout = httpx.Timeout(DEFAULT_TIMEOUT_SECONDS, read=STREAM_READ_TIMEOUT_SECONDS)
            try:
                with self.client.stream("GET", path, headers=headers, timeout=timeout) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        raise error_from_response(response)
                    for event in parse_events(response.iter_lines()):
                        last_event_id = event.id or last_event_id
                        yield event
                        if event.kind == "status" and isinstance(event.data, dict) and event.data.get("final"):
                            return
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.ConnectError):
                    raise StudioUnreachable(self.url, exc) from exc
                # A read timeout or a dropped connection mid-stream: resume from the last id.
                continue


def parse_events(lines: Iterator[str]) -> Iterator[Event]:
    """Server-sent events from the stream's lines (comments and `retry:` skipped)."""
    kind, event_id = "message", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                raw = "\n".join(data)
                try:
                    parsed: Any = json.loads(raw)
                except ValueError:
                    parsed = raw
                yield Event(kind, event_id, parsed)
            kind, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value
