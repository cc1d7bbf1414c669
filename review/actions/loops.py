"""Human loops: starting them (one through the API, or those a flow's activation selects
from a model's predictions) and ending them, with the slot bookkeeping both share.

Lock order: the loop row, then its assignment rows; the loop's slot counters change only
under its row lock."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from review.activation import activation_reason
from review.errors import LoopNameTaken, ReviewError
from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, LoopStatus

LOOP_NAME_MAX = 128


def confidence_of(prediction: dict | None) -> float | None:
    """The prediction's confidence as a float (numpy scalars included), or None."""
    value = prediction.get("confidence") if isinstance(prediction, dict) else None
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN sorts nowhere: treat as unknown


def _new_loop(*, name: str, flow: FlowDefinition, input_content: dict, prediction: dict | None, reason: str,
              source: dict, model_version, user, now: datetime) -> HumanLoop:
    return HumanLoop(
        name=name, project_id=flow.project_id, flow_definition=flow, input_content=input_content,
        prediction=prediction, confidence=confidence_of(prediction), activation_reason=reason, source=source or {},
        model_version=model_version, answers_needed=flow.task_count, open_slots=flow.task_count,
        created_by=user if user is not None and getattr(user, "is_authenticated", False) else None,
        created_at=now, expires_at=now + timedelta(seconds=flow.task_availability_seconds),
    )


def start_human_loop(*, name: str, flow: FlowDefinition, input_content: dict, user: User | None = None,
                     prediction: dict | None = None, activation_reason: str = "api",
                     source: dict | None = None, model_version=None) -> HumanLoop:
    """StartHumanLoop: one loop, whatever the activation conditions say."""
    name = (name or "").strip()
    if not name:
        raise ReviewError("name", "This field may not be blank.")
    if len(name) > LOOP_NAME_MAX:
        raise ReviewError("name", f"At most {LOOP_NAME_MAX} characters.")
    if any(ord(ch) < 32 or ch in "/\x7f" for ch in name):
        raise ReviewError("name", "Names cannot contain '/' or control characters.")
    if not isinstance(input_content, dict):
        raise ReviewError("input_content", "Must be a JSON object.")
    loop = _new_loop(name=name, flow=flow, input_content=input_content, prediction=prediction,
                     reason=activation_reason, source=source or {}, model_version=model_version, user=user,
                     now=timezone.now())
    try:
        with transaction.atomic():
            loop.save(force_insert=True)
    except IntegrityError as exc:
        if HumanLoop.objects.filter(name=name).exists():
            raise LoopNameTaken(name) from exc
        raise
    return loop


def start_loops_for_predictions(flow: FlowDefinition | None, items: Sequence[tuple[dict, dict]], *,
                                source: dict, model_version=None, rng: random.Random | None = None,
                                first_record: int = 0) -> list[str]:
    """Start a loop for each (input_content, prediction) the flow's activation selects.
    One INSERT for the lot; returns the names started ([] without a flow). A batch's loops
    (source has "batch") record which record they are: first_record + their index."""
    if flow is None or not items:
        return []
    activation = flow.activation or {}
    now = timezone.now()
    prefix = flow.name[:40]
    loops: list[HumanLoop] = []
    for index, (content, prediction) in enumerate(items):
        reason = activation_reason(activation, confidence_of(prediction), rng)
        if reason is None:
            continue
        item_source = dict(source)
        if "batch" in source and "record" not in source:
            item_source["record"] = first_record + index
        loops.append(_new_loop(name=f"{prefix}-{uuid.uuid4().hex[:16]}", flow=flow,
                               input_content=content if isinstance(content, dict) else {"value": content},
                               prediction=prediction, reason=reason, source=item_source,
                               model_version=model_version, user=None, now=now))
    if loops:
        HumanLoop.objects.bulk_create(loops, batch_size=1000)
    return [loop.name for loop in loops]


def start_loops_for_hosted_predictions(sender: Any, *, flow: FlowDefinition, items: Sequence[tuple[dict, dict]],
                                       source: dict, model_version: Any, first_record: int = 0,
                                       **_signal: Any) -> list[str]:
    """The receiver of hosting's predictions_for_review (connected in ReviewConfig.ready):
    an endpoint's or a batch's predictions, in the caller's transaction."""
    return start_loops_for_predictions(flow, items, source=source, model_version=model_version,
                                       first_record=first_record)


def return_slot(loop: HumanLoop, assignment: Assignment, status: str, now: datetime) -> None:
    """A held slot goes back to open (release, lease ran out). Loop row locked."""
    assignment.status = status
    assignment.ended_at = now
    assignment.save(update_fields=["status", "ended_at"])
    loop.holds_count -= 1
    if loop.status == LoopStatus.IN_PROGRESS:
        loop.open_slots += 1
    loop.save(update_fields=["holds_count", "open_slots"])


def end_loop(loop: HumanLoop, status: str, now: datetime) -> None:
    """Finish an InProgress loop (row locked): held assignments expire, no slot stays open."""
    Assignment.objects.filter(loop=loop).held().update(status=AssignmentStatus.EXPIRED, ended_at=now)
    loop.status = status
    loop.completed_at = now
    loop.open_slots = 0
    loop.holds_count = 0
    loop.save(update_fields=["status", "completed_at", "open_slots", "holds_count"])


def stop_loop(loop: HumanLoop, user: User | None = None) -> HumanLoop:
    """StopHumanLoop: an InProgress loop ends Stopped; answers already given are kept."""
    with transaction.atomic():
        locked = HumanLoop.objects.select_for_update().get(pk=loop.pk)
        if locked.status != LoopStatus.IN_PROGRESS:
            raise ReviewError("status", f"The human loop is {locked.status}; only InProgress loops can be stopped.",
                              status=409)
        end_loop(locked, LoopStatus.STOPPED, timezone.now())
    return locked
