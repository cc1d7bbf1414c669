"""DRF's parsers, refusing a NUL character (U+0000) anywhere in what they parse: no text or
JSON column on PostgreSQL can hold one, so it is a 400 naming the field instead of a 500
when the row is written. (The URL is checked by studio.middleware.RejectNulMiddleware.)"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from django.http import QueryDict
from rest_framework import parsers
from rest_framework.parsers import DataAndFiles

NUL = "\x00"


def field_path(where: str, key: Any, *, index: bool = False) -> str:
    """A field's path as every error names it: keys dotted, list items by index in brackets
    (`rules[0].parameters.threshold`, as the rule checker writes them; `tags[1]`)."""
    if index:
        return f"{where}[{key}]" if where else f"[{key}]"
    return f"{where}.{key}" if where else str(key)


def _first(data: Any, bad: Callable[[Any], bool], where: str = "") -> tuple[str, Any] | None:
    """(path, value) of the first key or leaf in `data` that `bad` picks, depth first; None
    when there is none (path "" for the body itself). A form's QueryDict: each field's values
    joined under its own name."""
    if isinstance(data, QueryDict):
        data = {name: "".join(data.getlist(name)) for name in data}
    if isinstance(data, dict):
        for key, value in data.items():
            name = field_path(where, key)
            if bad(key):
                return name, key
            found = _first(value, bad, name)
            if found is not None:
                return found
        return None
    if isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            found = _first(value, bad, field_path(where, index, index=True))
            if found is not None:
                return found
        return None
    return (where, data) if bad(data) else None


def _has_nul(value: Any) -> bool:
    return isinstance(value, str) and NUL in value


def _not_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    # An integer literal past a float's range (10**400): every numeric field reads it as a
    # float somewhere, where it would raise OverflowError; refused here like 1e400.
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max


def nul_field(data: Any) -> str | None:
    """The path of the first key or string in `data` that holds a NUL, else None ("" for the
    body itself)."""
    found = _first(data, _has_nul)
    return None if found is None else found[0].replace(NUL, "\\x00")


def reject_nul(data: Any) -> Any:
    name = nul_field(data)
    if name is not None:
        from studio.api import ApiError  # not at import: DRF imports this module while rest_framework.views loads

        label = name or "body"
        raise ApiError(f"{label}: Contains a NUL character (\\u0000), which is not allowed.",
                       fields={label: ["Contains a NUL character (\\u0000), which is not allowed."]})
    return data


def reject_non_finite(data: Any) -> Any:
    """A number that is not finite (json reads 1e400 as inf, and the parser below lets NaN and
    Infinity through to be named here): no JSON column can store one; a 400 naming it."""
    found = _first(data, _not_finite)
    if found is not None:
        from studio.api import ApiError

        label = found[0] or "body"
        message = ("NaN is not a JSON number; send a number or null." if found[1] != found[1] else
                   "Infinity is not a JSON number, nor is a number too large for a float (such as 1e400 or 10**400).")
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
