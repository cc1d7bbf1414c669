"""Display helpers every page shares: relative times, status badges, byte sizes.

Statuses are drawn with one CSS class per status (`badge--training`, `badge--ready`, …)
so a colour means the same thing on every page (docs/SPEC.md §7)."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Status value → badge modifier. Values not listed fall back to a neutral grey, so an
# unexpected status is still shown (never hidden), just without a meaning colour.
BADGE_CLASSES: dict[str, str] = {
    # training jobs (docs/SPEC.md §3.2)
    "pending": "grey",
    "starting": "blue",
    "training": "violet",
    "uploading": "teal",
    "completed": "green",
    "stopping": "amber",
    "stopped": "amber",
    "failed": "red",
    # dataset versions
    "validating": "blue",
    "ready": "green",
    "invalid": "red",
    # human loops (docs/SPEC.md §5)
    "inprogress": "blue",
    "expired": "grey",
    # nodes: available is healthy, busy is doing work, warm keeps a process alive
    "idle": "green",
    "busy": "violet",
    "warm": "teal",
    "lost": "red",
    # job attempts (JobAttempt.outcome)
    "running": "violet",
    "aborted": "amber",
    "shutdown": "amber",
    # notification deliveries (studio.notify) and rule states (jobs.rules)
    "delivered": "green",
    "ok": "green",
    "alarm": "red",
    "insufficientdata": "grey",
}
# Statuses that are still moving: their dot pulses so "working" reads at a glance.
MOVING = frozenset({"starting", "training", "uploading", "stopping", "validating", "inprogress", "busy", "running"})
LABELS = {"inprogress": "In progress", "insufficientdata": "INSUFFICIENT_DATA"}


def _key(status: str) -> str:
    return status.replace("_", "").replace(" ", "").replace("-", "").lower()


@register.simple_tag
def status_badge(status: str | None) -> SafeString:
    """`{% status_badge version.status %}` → a coloured pill with the status name."""
    if not status:
        return format_html('<span class="badge badge--grey">{}</span>', "unknown")
    key = _key(str(status))
    colour = BADGE_CLASSES.get(key, "grey")
    moving = " badge--moving" if key in MOVING else ""
    label = LABELS.get(key, str(status))
    return format_html('<span class="badge badge--{}{}" data-status="{}">{}</span>', colour, moving, key, label)


def relative_phrase(moment: datetime, now: datetime | None = None) -> str:
    """'just now', '12 s ago', '3 min ago', '5 h ago', '2 days ago', or a date past a month."""
    now = now or timezone.now()
    seconds = (now - moment).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 5:
        return "just now"
    if seconds < 60:
        amount = f"{int(seconds)} s"
    elif seconds < 3600:
        amount = f"{int(seconds // 60)} min"
    elif seconds < 86400:
        amount = f"{int(seconds // 3600)} h"
    elif seconds < 30 * 86400:
        days = int(seconds // 86400)
        amount = f"{days} day" if days == 1 else f"{days} days"
    else:
        return timezone.localtime(moment).strftime("%-d %b %Y")
    return f"in {amount}" if future else f"{amount} ago"


@register.filter
def reltime(moment: datetime | None) -> SafeString | str:
    """`{{ job.created_at|reltime }}` → "3 min ago", with the exact time on hover.

    studio.js re-renders the phrase every 5 s from the datetime attribute, so a page
    left open does not keep saying "just now"."""
    if moment is None:
        return "—"
    exact = timezone.localtime(moment)
    return format_html(
        '<time class="reltime" datetime="{}" title="{}">{}</time>',
        moment.isoformat(), exact.strftime("%Y-%m-%d %H:%M:%S %Z"), relative_phrase(moment),
    )


@register.filter
def human_bytes(size: int | float | None) -> str:
    """1536 → "1.5 KiB". Binary units, labelled as such, so the 2 GiB default upload limit
    reads as "2.0 GiB" rather than a puzzling "2.1 GB"."""
    if size is None:
        return "—"
    value = float(size)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


@register.filter
def number(value: int | float | None) -> str:
    """Thousands separators for counts; short decimals for statistics; "—" for none."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    return str(value)


@register.filter
def percent(fraction: float | None) -> str:
    if fraction is None:
        return "0%"
    return f"{max(0.0, min(1.0, float(fraction))) * 100:.0f}%"


SIGNIFICANT_DIGITS = 4


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


@register.filter
def sig(value: object, digits: int = SIGNIFICANT_DIGITS) -> SafeString | str:
    """`{{ trial.learning_rate|sig }}` → 0.0003162 with the exact 0.00031622776601683794 on
    hover. A float is shown to `digits` significant digits; when that rounds it, the value
    as stored is in the title (and in data-exact, for a copy). Integers, booleans (as JSON
    writes them), text and JSON values are shown as they are; "—" for none.

    Every page that shows a hyperparameter, an objective or a metric uses it, so a number
    reads the same everywhere (a trial's value used to show 17 digits)."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float) and not isinstance(value, bool):
        if not math.isfinite(value):
            return str(value)
        exact = repr(value)
        shown = f"{value:.{int(digits)}g}"
        if float(shown) == value:
            return exact
        return format_html('<span class="num-exact" title="{}" data-exact="{}">{}</span>', exact, exact, shown)
    return _plain(value)


_BREAK_AFTER = re.compile(r"([_./-]+)")


@register.filter
def breakable(name: object) -> SafeString:
    """`{{ name|breakable }}`: "gradient_accumulation_steps" may wrap after an underscore
    (or . - /) but never mid-word, in a narrow side panel (CSS keeps names whole)."""
    parts = _BREAK_AFTER.split(str(name))
    return mark_safe("".join(escape(part) + ("<wbr>" if index % 2 else "") for index, part in enumerate(parts)))  # noqa: S308 - every part is escaped


@register.filter(name="markdown")
def markdown_filter(text: str | None) -> SafeString:
    """`{{ dataset.description|markdown }}`: Markdown rendered and sanitised (studio/markdown.py)."""
    from studio.markdown import render_markdown

    return mark_safe(render_markdown(text or ""))  # noqa: S308 - nh3 kept only the allow-listed tags
