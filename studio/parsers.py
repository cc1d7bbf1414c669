"""DRF's parsers, refusing a NUL character (U+0000) anywhere in what they parse: no text or
JSON column on PostgreSQL can hold one, so it is a 400 naming the field instead of a 500
when the row is written. (The URL is checked by studio.middleware.RejectNulMiddleware.)"""

from __future__ import annotations

import math
from typing import Any

from django.http import QueryDict
from rest_framework import parsers
from rest_framework.parsers import DataAndFiles

NUL = "\x00"


def nul_field(data: Any, where: str = "") -> str | None:
    """The dotted name of the first key or string in `data` that holds a NUL, else None
    ("" for the body itself)."""
    if isinstance(data, str):
        return where if NUL in data else None
    if isinstance(data, QueryDict):  # a form field's values under its own name
        data = {name: "".join(data.getlist(name)) for name in data}
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{where}.{key}" if where else str(key)
            if NUL in str(key):
                return name.replace(NUL, "\\x00")
            found = nul_field(value, name)
            if found is not None:
                return found
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            found = nul_field(value, f"{where}.{index}" if where else str(index))
            if found is not None:
                return found
    return None


def reject_nul(data: Any) -> Any:
    name = nul_field(data)
    if name is not None:
        from studio.api import ApiError  # not at import: DRF imports this module while rest_framework.views loads

        label = name or "body"
        raise ApiError(f"{label}: Contains a NUL character (\\u0000), which is not allowed.",
                       fields={label: ["Contains a NUL character (\\u0000), which is not allowed."]})
    return data


def non_finite_field(data: Any, where: str = "") -> tuple[str, float] | None:
    """(dotted name, value) of the first number in `data` that is not finite (json reads
    1e400 as inf, and the parser below lets NaN and Infinity through to be named here: no
    JSON column can store them), else None (name "" for the body itself)."""
    if isinstance(data, float):
        return (where, data) if not math.isfinite(data) else None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = non_finite_field(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def reject_non_finite(data: Any) -> Any:
    found = non_finite_field(data)
    if found is not None:
        from studio.api import ApiError

        label = found[0] or "body"
        message = ("NaN is not a JSON number; send a number or null." if found[1] != found[1] else
                   "Infinity is not a JSON number, nor is a number too large for a float (such as 1e400).")
        raise ApiError(f"{label}: {message}", fields={label: [message]})
    return data


class JSONParser(parsers.JSONParser):
    # NaN, Infinity and -Infinity are read (Python's json knows them) so that
    # reject_non_finite can name the field they are in; none of them gets further.
    strict = False

    def parse(self, stream, media_type=None, parser_context=None):
        return reject_non_finite(reject_nul(super().parse(stream, media_type, parser_context)))


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        return reject_nul(super().parse(stream, media_type, parser_context))


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parsed = super().parse(stream, media_type, parser_context)
        reject_nul(parsed.data)
        reject_nul({name: [f.name or "" for f in parsed.files.getlist(name)] for name in parsed.files})
        return DataAndFiles(parsed.data, parsed.files)
