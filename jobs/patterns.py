"""Regular expressions users write (a job's `metric_definitions`, a rule's metric filter),
matched where other jobs share the process: the node agent reads every job's output, the
rule watcher evaluates every job's rules. Python's `re` holds the GIL for a whole match and
backtracks exponentially on patterns such as `(a|aa)+$` (a 40-character line: hours), so
one such pattern would freeze the process — heartbeats, other jobs' logs and alarms.

These are compiled with the `regex` module instead (re's syntax, VERSION0): it releases the
GIL while it matches (`concurrent=True`) and gives up after MATCH_TIMEOUT_SECONDS. Django-free
(the node agent's capture imports it)."""

from __future__ import annotations

from typing import Any

import regex

MATCH_TIMEOUT_SECONDS = 0.05  # a sane pattern on a 4 KiB line takes microseconds

error = regex.error


class PatternTimeout(Exception):
    """A match took longer than MATCH_TIMEOUT_SECONDS (the pattern backtracks without end)."""


def compile_pattern(pattern: str) -> Any:
    """A user's pattern, compiled; raises `error` (with re's kind of message) when invalid."""
    return regex.compile(pattern, regex.VERSION0)


def search(compiled: Any, text: str) -> Any:
    """compiled.search(text) within the time limit; raises PatternTimeout past it."""
    try:
        return compiled.search(text, concurrent=True, timeout=MATCH_TIMEOUT_SECONDS)
    except TimeoutError:
        raise PatternTimeout(compiled.pattern) from None
