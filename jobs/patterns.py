"""Regular expressions users write (a job's `metric_definitions`, a rule's metric filter),
matched where other jobs share the process: the node agent reads every job's output, the
rule watcher evaluates every job's rules. Python's `re` holds the GIL for a whole match and
backtracks exponentially on patterns such as `(a|aa)+$` (a 40-character line: hours), so
one such pattern would freeze the process — heartbeats, other jobs' logs and alarms.

These are compiled with the `regex` module instead (re's syntax, VERSION0): it releases the
GIL while it matches (`concurrent=True`) and gives up after MATCH_TIMEOUT_SECONDS. The limit
costs ~1.7 µs a call, so a text without the pattern's required literal (the longest run of
plain characters outside any group, repeat or alternation: "train_loss=" of
`train_loss=([0-9.]+)`) is no match without calling it (bench/capture.py). Django-free (the
node agent's capture imports it)."""

from __future__ import annotations

import re
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import regex

MATCH_TIMEOUT_SECONDS = 0.05  # a sane pattern on a 4 KiB line takes microseconds

error = regex.error


class PatternTimeout(Exception):
    """A match took longer than MATCH_TIMEOUT_SECONDS (the pattern backtracks without end)."""


class UserPattern:
    """A user's pattern: `regex`'s compiled form and the literal every match contains."""

    __slots__ = ("compiled", "groupindex", "groups", "pattern", "required")

    def __init__(self, pattern: str) -> None:
        self.compiled = regex.compile(pattern, regex.VERSION0)
        self.pattern = pattern
        self.groupindex: dict[str, int] = dict(self.compiled.groupindex)
        self.groups: int = self.compiled.groups
        self.required = required_literal(pattern)

    def __repr__(self) -> str:
        return f"UserPattern({self.pattern!r})"

    def search(self, text: str) -> Any:
        """The first match in `text` (as re.Pattern.search) within the time limit; raises
        PatternTimeout past it."""
        if self.required and self.required not in text:
            return None
        try:
            return self.compiled.search(text, concurrent=True, timeout=MATCH_TIMEOUT_SECONDS)
        except TimeoutError:
            raise PatternTimeout(self.pattern) from None


def required_literal(pattern: str) -> str:
    """The longest run of literal characters at the pattern's top level ("" when none, or when
    the pattern ignores case, or when `re` cannot parse it): any match contains it."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return ""
    if parsed.state.flags & re.IGNORECASE:
        return ""
    best, run = "", []
    for op, argument in list(parsed) + [(None, None)]:
        if op is sre_parse.LITERAL:
            run.append(chr(argument))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    return best


def compile_pattern(pattern: str) -> UserPattern:
    """A user's pattern, compiled; raises `error` (with re's kind of message) when invalid."""
    return UserPattern(pattern)
