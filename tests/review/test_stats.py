"""review.stats on a small hand-built flow whose every figure is known: backlog, completions
per hour, the median time to complete, per-reviewer throughput, agreement, and model vs.
human accuracy with its confusion matrix; and the stats API's access rules.

The loops and answers are written directly (not through the claim/answer actions) because
the figures must be exact: times spent, completion times and agreements are chosen here."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from review.consolidation import NO_CONSENSUS
from review.models import (
    Assignment,
    AssignmentStatus,
    FlowDefinition,
    HumanLoop,
    LoopStatus,
    WorkTeam,
)
from review.stats import flow_stats
from studio.models import Role
from tests.factories import make_member

LABELS = ["cat", "dog", "bird"]


# --- small factories, shared with the page tests ---------------------------------------------
def make_reviewer(project, username: str):
    return make_member(project, username, Role.REVIEWER)


def make_team(project, name: str, members) -> WorkTeam:
    team = WorkTeam.objects.create(project=project, name=name)
    team.members.set(members)
    return team


def make_flow(team: WorkTeam, name: str, **overrides) -> FlowDefinition:
    values = {"project": team.project, "work_team": team, "name": name, "title": f"Review {name}",
              "labels": LABELS, "task_count": 2, "instructions": "Pick the **animal**.",
              "instructions_html": "<p>Pick the <strong>animal</strong>.</p>"}
    values.update(overrides)
    return FlowDefinition.objects.create(**values)


_loop_numbers = iter(range(1, 10**9))


def make_loop(flow: FlowDefinition, *, status: str = LoopStatus.IN_PROGRESS, created_ago: timedelta = timedelta(minutes=1),
              took: timedelta | None = None, prediction: dict | None = None, consolidated: str = "",
              agreement: float | None = None, open_slots: int | None = None, holds: int = 0, answers: int = 0,
              input_content: dict | None = None, now=None) -> HumanLoop:
    now = now or timezone.now()
    created = now - created_ago
    needed = flow.task_count
    return HumanLoop.objects.create(
        name=f"{flow.name}-{next(_loop_numbers)}", project=flow.project, flow_definition=flow, status=status,
        input_content=input_content if input_content is not None else {"text": "a small furry thing"},
        prediction=prediction, confidence=(prediction or {}).get("confidence"),
        answers_needed=needed, answers_count=answers, holds_count=holds,
        open_slots=open_slots if open_slots is not None else max(0, needed - answers - holds),
        consolidated_label=consolidated, agreement=agreement, created_at=created,
        expires_at=created + timedelta(seconds=flow.task_availability_seconds),
        completed_at=created + took if took is not None else None,
    )


def answered(loop: HumanLoop, worker, label: str, seconds: float) -> Assignment:
    claimed = loop.created_at + timedelta(seconds=1)
    return Assignment.objects.create(
        loop=loop, worker=worker, status=AssignmentStatus.ANSWERED, claimed_at=claimed,
        lease_expires_at=claimed + timedelta(minutes=5), answered_at=claimed + timedelta(seconds=seconds),
        answer={"label": label}, time_spent_seconds=seconds)


def prediction(label: str, confidence: float = 0.6) -> dict:
    return {"label": label, "confidence": confidence, "probabilities": {label: confidence}}


# --- the hand-built flow -------------------------------------------------------------------------
@pytest.fixture
def known_flow(project, owner):
    """Five completed loops (one with no consensus, one started by the API without a
    prediction), two in progress, one expired, plus a completed loop of another flow."""
    alice, bob, carol, dave = (make_reviewer(project, name) for name in ("alice", "bob", "carol", "dave"))
    team = make_team(project, "animals", [alice, bob, carol, dave])
    flow = make_flow(team, "triage")
    now = timezone.now()
    done = LoopStatus.COMPLETED
    l1 = make_loop(flow, status=done, created_ago=timedelta(hours=2), took=timedelta(seconds=60),
                   prediction=prediction("cat"), consolidated="cat", agreement=1.0, answers=2, now=now)
    l2 = make_loop(flow, status=done, created_ago=timedelta(hours=3), took=timedelta(seconds=120),
                   prediction=prediction("dog"), consolidated="cat", agreement=1.0, answers=2, now=now)
    l3 = make_loop(flow, status=done, created_ago=timedelta(minutes=30), took=timedelta(seconds=300),
                   prediction=prediction("dog"), consolidated="dog", agreement=2 / 3, answers=3, now=now)
    l4 = make_loop(flow, status=done, created_ago=timedelta(hours=5), took=timedelta(seconds=600),
                   prediction=prediction("cat"), consolidated=NO_CONSENSUS, agreement=0.5, answers=4, now=now)
    l8 = make_loop(flow, status=done, created_ago=timedelta(hours=1), took=timedelta(seconds=30),
                   consolidated="bird", agreement=1.0, answers=2, now=now)
    l5 = make_loop(flow, created_ago=timedelta(minutes=10), holds=1, answers=0, open_slots=1, now=now)
    l6 = make_loop(flow, created_ago=timedelta(minutes=5), now=now)
    make_loop(flow, status=LoopStatus.EXPIRED, created_ago=timedelta(days=8), now=now)
    for loop, label, seconds in ((l1, "cat", 10), (l2, "cat", 20), (l3, "dog", 30), (l4, "cat", 40)):
        answered(loop, alice, label, seconds)
    for loop, label, seconds in ((l1, "cat", 5), (l3, "dog", 15), (l4, "dog", 25)):
        answered(loop, bob, label, seconds)
    for loop, label, seconds in ((l2, "cat", 50), (l3, "cat", 60), (l4, "cat", 70), (l8, "bird", 20)):
        answered(loop, carol, label, seconds)
    for loop, label, seconds in ((l4, "dog", 8), (l8, "bird", 12)):
        answered(loop, dave, label, seconds)
    # Not answers: bob's live hold on l5 and dave's skip of l6.
    Assignment.objects.create(loop=l5, worker=bob, status=AssignmentStatus.HELD,
                              lease_expires_at=now + timedelta(minutes=5))
    Assignment.objects.create(loop=l6, worker=dave, status=AssignmentStatus.RELEASED, ended_at=now,
                              lease_expires_at=now + timedelta(minutes=5))
    other = make_flow(team, "elsewhere")
    stranger = make_loop(other, status=done, created_ago=timedelta(minutes=20), took=timedelta(seconds=5),
                         prediction=prediction("bird"), consolidated="cat", agreement=0.5, answers=2, now=now)
    answered(stranger, alice, "cat", 1000)
    flow.now = now
    flow.loops = {"l1": l1, "l2": l2, "l3": l3, "l4": l4, "l5": l5, "l6": l6, "l8": l8}
    return flow


def test_backlog_and_status_counts_cover_only_this_flow(known_flow):
    stats = flow_stats(known_flow, now=known_flow.now)
    assert stats["counts"] == {"InProgress": 2, "Completed": 5, "Expired": 1, "Stopped": 0, "Failed": 0}
    backlog = stats["backlog"]
    assert (backlog["loops"], backlog["open_slots"], backlog["held_slots"]) == (2, 3, 1)
    assert backlog["oldest_created_at"] == known_flow.loops["l5"].created_at.isoformat()


def test_completed_per_hour_is_24_even_hours_ending_with_the_current_one(known_flow):
    series = flow_stats(known_flow, now=known_flow.now)["completed_per_hour"]
    assert len(series) == 24
    hours = [point["hour"] for point in series]
    current = known_flow.now.replace(minute=0, second=0, microsecond=0)
    assert hours[-1] == current.isoformat() and hours[0] == (current - timedelta(hours=23)).isoformat()
    expected: dict[str, int] = {}
    for key in ("l1", "l2", "l3", "l4", "l8"):
        hour = known_flow.loops[key].completed_at.replace(minute=0, second=0, microsecond=0).isoformat()
        expected[hour] = expected.get(hour, 0) + 1
    assert {p["hour"]: p["completed"] for p in series if p["completed"]} == expected
    assert sum(point["completed"] for point in series) == 5  # the other flow's completion is not counted


def test_median_time_to_complete_is_the_middle_of_created_to_completed(known_flow):
    # 30, 60, 120, 300, 600 seconds
    assert flow_stats(known_flow)["median_seconds_to_complete"] == pytest.approx(120.0)


def test_median_time_to_complete_of_an_even_count_averages_the_middle_two(known_flow):
    known_flow.loops["l8"].delete()  # 60, 120, 300, 600
    assert flow_stats(known_flow)["median_seconds_to_complete"] == pytest.approx(210.0)


def test_reviewer_throughput_counts_answers_rate_and_median_time_spent(known_flow):
    rows = flow_stats(known_flow)["reviewers"]
    shown = [(r["worker"], r["answers"], r["answers_per_hour"], r["median_seconds_spent"]) for r in rows]
    assert shown == [
        ("alice", 4, 144.0, 25.0),  # 10 20 30 40 s: 4 answers in 100 s; the other flow's answer is not hers here
        ("carol", 4, 72.0, 55.0),  # 50 60 70 20 s
        ("bob", 3, 240.0, 15.0),  # 5 15 25 s; his live hold is not an answer
        ("dave", 2, 360.0, 10.0),  # 8 12 s; his skip is not an answer
    ]


def test_agreement_mean_distribution_and_no_consensus(known_flow):
    agreement = flow_stats(known_flow)["agreement"]
    assert agreement["mean"] == pytest.approx((1 + 1 + 2 / 3 + 0.5 + 1) / 5, abs=1e-4)
    assert agreement["distribution"] == [{"agreement": 0.5, "loops": 1}, {"agreement": 0.6667, "loops": 1},
                                         {"agreement": 1.0, "loops": 3}]
    assert agreement["loops"] == 5 and agreement["no_consensus"] == 1


def test_model_vs_human_accuracy_and_confusion_matrix(known_flow):
    result = flow_stats(known_flow)["model_vs_human"]
    # l1 cat→cat, l2 dog→cat, l3 dog→dog; l4 (no consensus) and l8 (no prediction) are left out
    assert (result["compared"], result["matches"], result["accuracy"]) == (3, 2, 0.6667)
    confusion = result["confusion"]
    assert confusion["model_labels"] == ["cat", "dog"] and confusion["human_labels"] == ["cat", "dog"]
    assert confusion["matrix"] == [[1, 0], [1, 1]]  # rows: the model's label; columns: the people's


def test_free_text_flow_has_no_accuracy(known_flow):
    text_flow = make_flow(known_flow.work_team, "notes", task_type="free_text", labels=[])
    make_loop(text_flow, status=LoopStatus.COMPLETED, took=timedelta(seconds=3), prediction=prediction("cat"))
    stats = flow_stats(text_flow)
    assert stats["model_vs_human"]["accuracy"] is None and stats["model_vs_human"]["confusion"]["matrix"] == []
    assert stats["counts"]["Completed"] == 1


def test_an_empty_flow_has_zeros_and_nones(project, owner):
    flow = make_flow(make_team(project, "solo", [owner]), "empty")
    stats = flow_stats(flow)
    assert stats["backlog"] == {"loops": 0, "open_slots": 0, "held_slots": 0, "oldest_created_at": None}
    assert stats["median_seconds_to_complete"] is None and stats["reviewers"] == []
    assert stats["agreement"] == {"mean": None, "loops": 0, "distribution": [], "no_consensus": 0}
    assert sum(point["completed"] for point in stats["completed_per_hour"]) == 0


def test_stats_take_a_bounded_number_of_queries(known_flow, django_assert_max_num_queries):
    with django_assert_max_num_queries(12):
        flow_stats(known_flow)


# --- the API ---------------------------------------------------------------------------------------
def test_stats_api_serves_project_readers(known_flow, teammate, viewer, client_for):
    for user in (teammate, viewer):
        response = client_for(user).get(f"/api/v1/flow-definitions/{known_flow.pk}/stats/")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["flow_definition"]["id"] == known_flow.pk
        assert body["model_vs_human"]["confusion"]["matrix"] == [[1, 0], [1, 1]]


def test_stats_api_is_404_for_reviewers_and_other_projects(known_flow, reviewer, outsider, client_for):
    alice = known_flow.work_team.members.get(username="alice")  # a reviewer of this very flow's team
    for user in (reviewer, alice, outsider):
        response = client_for(user).get(f"/api/v1/flow-definitions/{known_flow.pk}/stats/")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert client_for(outsider).get("/api/v1/flow-definitions/999999/stats/").status_code == 404
