"""Review fixtures, shared by the review core's tests and the pages/stats tests:

- reviewers(n)                → n reviewer users of project "acme" (reviewer-1 … reviewer-n)
- team(owner, *members, name=) → a WorkTeam of "acme" with these members
- make_flow(**overrides)       → a classification FlowDefinition ("cat"/"dog"/"bird"), team of
                                 the `reviewer` persona + 2 more reviewers unless work_team= given
- make_loops(flow, n, **kw)    → n InProgress loops of the flow (one INSERT), oldest first
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from django.utils import timezone

from review.actions.loops import start_loops_for_predictions
from review.actions.teams import create_flow_definition, create_work_team
from review.models import FlowDefinition, HumanLoop, WorkTeam
from studio.models import Role
from tests.factories import make_member

LABELS = ["cat", "dog", "bird"]


@pytest.fixture
def reviewers(project) -> Callable[..., list]:
    """reviewers(n, prefix="reviewer") → n users with role reviewer in project acme."""
    made: dict[str, object] = {}

    def make(n: int, prefix: str = "reviewer") -> list:
        users = []
        for index in range(1, n + 1):
            username = f"{prefix}-{index}"
            if username not in made:
                made[username] = make_member(project, username, Role.REVIEWER)
            users.append(made[username])
        return users

    return make


@pytest.fixture
def team(project) -> Callable[..., WorkTeam]:
    """team(owner, *members, name="labellers") → a work team of project acme."""
    counter = {"n": 0}

    def make(owner, *members, name: str | None = None, target_project=None) -> WorkTeam:
        counter["n"] += 1
        return create_work_team(project=target_project or project,
                                        name=name or f"team-{counter['n']}", members=list(members), user=owner)

    return make


@pytest.fixture
def make_flow(project, owner, reviewer, reviewers, team) -> Callable[..., FlowDefinition]:
    """make_flow(**overrides) → a flow of project acme. Defaults: classification over
    LABELS, task_count 1, a team of `reviewer` + reviewer-1 + reviewer-2, order oldest."""
    counter = {"n": 0}

    def make(**overrides) -> FlowDefinition:
        counter["n"] += 1
        data = {
            "name": f"flow-{counter['n']}",
            "task_type": "classification",
            "labels": list(LABELS),
            "title": "Which animal is it?",
            "instructions": "Pick the **animal**.",
            "task_count": 1,
            "task_availability_seconds": 3600,
            "task_time_limit_seconds": 60,
            "activation": {"confidence_below": 0.8, "sample_percent": 0.0, "combine": "any"},
            "order": "oldest",
            "show_prediction": True,
        }
        data.update(overrides)
        if "work_team" not in data:
            data["work_team"] = team(owner, reviewer, *reviewers(2))
        if data["task_type"] == "free_text" and "labels" not in overrides:
            data["labels"] = []
        return create_flow_definition(project=data["work_team"].project, user=owner, data=data)

    return make


@pytest.fixture
def make_loops() -> Callable[..., list[HumanLoop]]:
    """make_loops(flow, n, content=lambda i: {...}, confidence=lambda i: float|None)
    → n loops started as predictions would start them (all activated), oldest first."""

    def make(flow: FlowDefinition, n: int, *, content=None, confidence=None, labels=None) -> list[HumanLoop]:
        content = content or (lambda i: {"text": f"item {i}"})
        confidence = confidence or (lambda i: 0.5)
        choices = flow.labels or ["x"]
        items = []
        for i in range(n):
            c = confidence(i)
            label = labels(i) if labels else choices[i % len(choices)]
            items.append((content(i), {"label": label, "confidence": c,
                                       "probabilities": {label: c} if c is not None else {}}))
        activation = flow.activation
        flow.activation = {"confidence_below": None, "sample_percent": 100.0, "combine": "any"}
        try:
            names = start_loops_for_predictions(flow, items, source={"test": True}, rng=random.Random(0))
        finally:
            flow.activation = activation
        by_name = {loop.name: loop for loop in HumanLoop.objects.filter(name__in=names)}
        return [by_name[name] for name in names]

    return make


def backdate_leases(*assignments) -> None:
    """Time travel: the leases of these assignments ran out a minute ago."""
    from review.models import Assignment

    Assignment.objects.filter(pk__in=[a.pk for a in assignments]).update(
        lease_expires_at=timezone.now() - timezone.timedelta(minutes=1))
