"""Claims, answers and releases through review.actions: slot accounting and its invariants
(a reviewer never gets a loop twice, no slot held twice, leases and loops expire)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from review.actions.answers import answer_slot
from review.actions.claims import _take_slot, claim_next_slot, release_slot
from review.actions.expiry import expire_review_work
from review.actions.loops import stop_loop
from review.errors import AssignmentConflict, ReviewError
from review.models import Assignment, AssignmentStatus, HumanLoop, LoopStatus
from tests.review.conftest import backdate_leases

pytestmark = pytest.mark.django_db


def refresh(loop: HumanLoop) -> HumanLoop:
    return HumanLoop.objects.get(pk=loop.pk)


def counters(loop: HumanLoop) -> tuple[int, int, int, int]:
    fresh = refresh(loop)
    return fresh.answers_needed, fresh.answers_count, fresh.holds_count, fresh.open_slots


def test_claim_answer_completes_a_single_slot_loop(make_flow, make_loops, reviewer):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    assert held is not None and held.loop_id == loop.pk and held.status == AssignmentStatus.HELD
    assert counters(loop) == (1, 0, 1, 0)
    assert claim_next_slot(reviewer) is None
    answered = answer_slot(held.pk, reviewer, {"label": "dog"})
    assert answered.status == AssignmentStatus.ANSWERED and answered.time_spent_seconds >= 0
    done = refresh(loop)
    assert (done.status, done.consolidated_label, done.agreement) == (LoopStatus.COMPLETED, "dog", 1.0)
    assert counters(loop) == (1, 1, 0, 0)


def test_a_reviewer_never_gets_a_loop_they_hold_answered_or_released(make_flow, make_loops, reviewer):
    flow = make_flow(task_count=2)
    first, second, third = make_loops(flow, 3)
    held = claim_next_slot(reviewer)
    assert held.loop_id == first.pk
    # The first loop still has an open slot, but it is not for this reviewer.
    nxt = claim_next_slot(reviewer)
    assert nxt.loop_id == second.pk
    answer_slot(held.pk, reviewer, {"label": "cat"})
    release_slot(nxt.pk, reviewer)
    last = claim_next_slot(reviewer)
    assert last.loop_id == third.pk
    answer_slot(last.pk, reviewer, {"label": "cat"})
    assert claim_next_slot(reviewer) is None
    assert Assignment.objects.filter(worker=reviewer).count() == 3


def test_two_reviewers_hold_the_two_slots_and_a_third_gets_nothing(make_flow, make_loops, reviewer, reviewers):
    flow = make_flow(task_count=2)
    [loop] = make_loops(flow, 1)
    one, two = reviewers(2)
    held = [claim_next_slot(user) for user in (reviewer, one)]
    assert {a.loop_id for a in held} == {loop.pk}
    assert counters(loop) == (2, 0, 2, 0)
    assert claim_next_slot(two) is None
    answer_slot(held[0].pk, reviewer, {"label": "bird"})
    answer_slot(held[1].pk, one, {"label": "bird"})
    assert refresh(loop).status == LoopStatus.COMPLETED and counters(loop) == (2, 2, 0, 0)


def test_an_expired_lease_returns_its_slot_to_the_next_claim(make_flow, make_loops, reviewer, reviewers):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    other = reviewers(1)[0]
    held = claim_next_slot(reviewer)
    assert claim_next_slot(other) is None
    backdate_leases(held)
    # No beat tick in between: the claim itself returns the expired lease.
    taken = claim_next_slot(other)
    assert taken is not None and taken.loop_id == loop.pk
    assert Assignment.objects.get(pk=held.pk).status == AssignmentStatus.EXPIRED
    assert counters(loop) == (1, 0, 1, 0)
    with pytest.raises(AssignmentConflict, match="expired"):
        answer_slot(held.pk, reviewer, {"label": "cat"})


def test_answering_after_the_lease_ran_out_is_a_conflict_and_the_slot_goes_back(make_flow, make_loops, reviewer):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    backdate_leases(held)
    with pytest.raises(AssignmentConflict, match="lease expired") as info:
        answer_slot(held.pk, reviewer, {"label": "cat"})
    assert info.value.status == 409
    assert Assignment.objects.get(pk=held.pk).status == AssignmentStatus.EXPIRED
    assert counters(loop) == (1, 0, 0, 1)
    # An expired lease does not bar the reviewer: they may take the slot again.
    again = claim_next_slot(reviewer)
    assert again.loop_id == loop.pk


def test_beat_housekeeping_returns_expired_leases(make_flow, make_loops, reviewer):
    flow = make_flow(task_count=2)
    [loop] = make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    backdate_leases(held)
    result = expire_review_work()
    assert result["leases"] == 1
    assert counters(loop) == (2, 0, 0, 2)
    assert expire_review_work()["leases"] == 0


def test_a_loop_past_its_availability_ends_expired(make_flow, make_loops, reviewer):
    flow = make_flow(task_count=2)
    old, fresh = make_loops(flow, 2)
    held = claim_next_slot(reviewer)
    assert held.loop_id == old.pk
    HumanLoop.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_review_work()["loops"] == 1
    ended = refresh(old)
    assert ended.status == LoopStatus.EXPIRED and ended.open_slots == 0 and ended.holds_count == 0
    assert Assignment.objects.get(pk=held.pk).status == AssignmentStatus.EXPIRED
    with pytest.raises(AssignmentConflict, match="no longer in progress"):
        answer_slot(held.pk, reviewer, {"label": "cat"})
    assert refresh(fresh).status == LoopStatus.IN_PROGRESS


def test_an_expired_loop_is_not_claimed_even_before_beat_ends_it(make_flow, make_loops, reviewer):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    HumanLoop.objects.filter(pk=loop.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert claim_next_slot(reviewer) is None


def test_release_gives_the_slot_back_and_a_second_release_or_answer_conflicts(make_flow, make_loops, reviewer,
                                                                              reviewers):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    release_slot(held.pk, reviewer)
    assert counters(loop) == (1, 0, 0, 1)
    with pytest.raises(AssignmentConflict, match="released"):
        release_slot(held.pk, reviewer)
    with pytest.raises(AssignmentConflict, match="released"):
        answer_slot(held.pk, reviewer, {"label": "cat"})
    other = reviewers(1)[0]
    taken = claim_next_slot(other)
    answer_slot(taken.pk, other, {"label": "cat"})
    with pytest.raises(AssignmentConflict, match="already answered"):
        answer_slot(taken.pk, other, {"label": "dog"})


def test_someone_elses_or_an_unknown_assignment_is_missing(make_flow, make_loops, reviewer, reviewers):
    flow = make_flow()
    make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    other = reviewers(1)[0]
    for call in (lambda: answer_slot(held.pk, other, {"label": "cat"}),
                 lambda: release_slot(held.pk, other),
                 lambda: answer_slot(held.pk + 1000, reviewer, {"label": "cat"})):
        with pytest.raises(ReviewError) as info:
            call()
        assert info.value.status == 404
    assert Assignment.objects.get(pk=held.pk).status == AssignmentStatus.HELD


def test_an_unknown_label_is_refused_and_the_hold_kept(make_flow, make_loops, reviewer):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    for bad in ({"label": "horse"}, {"text": "cat"}, ["cat"], {"label": 3}):
        with pytest.raises(ReviewError) as info:
            answer_slot(held.pk, reviewer, bad)
        assert (info.value.status, info.value.field) == (400, "answer")
    assert counters(loop) == (1, 0, 1, 0)
    answer_slot(held.pk, reviewer, {"label": "cat"})


def test_least_confident_order_serves_low_confidence_first_and_unknown_last(make_flow, make_loops, reviewer):
    flow = make_flow(order="least_confident")
    confidences = [0.7, None, 0.2, 0.5]
    loops = make_loops(flow, 4, confidence=lambda i: confidences[i])
    seen = []
    while (held := claim_next_slot(reviewer, flow)) is not None:
        seen.append(held.loop_id)
    assert seen == [loops[2].pk, loops[3].pk, loops[0].pk, loops[1].pk]


def test_claims_stay_within_the_reviewers_teams(make_flow, make_loops, owner, reviewer, reviewers, team):
    mine = make_flow()
    others_team = team(owner, *reviewers(2, prefix="elsewhere"))
    theirs = make_flow(work_team=others_team)
    make_loops(theirs, 3)
    assert claim_next_slot(reviewer) is None
    assert claim_next_slot(reviewer, theirs) is None
    [loop] = make_loops(mine, 1)
    assert claim_next_slot(reviewer).loop_id == loop.pk


def test_a_lost_race_or_a_second_live_hold_takes_no_slot(make_flow, make_loops, reviewer):
    """The safety nets behind SKIP LOCKED (and all there is on SQLite): the compare-and-set
    update refuses a loop without an open slot, the unique constraint a second hold."""
    flow = make_flow(task_count=2)
    [loop] = make_loops(flow, 1)
    now = timezone.now()
    first = _take_slot(loop.pk, reviewer, 60, now)
    assert first is not None
    assert _take_slot(loop.pk, reviewer, 60, now) is None  # unique constraint, rolled back
    assert counters(loop) == (2, 0, 1, 1)
    HumanLoop.objects.filter(pk=loop.pk).update(open_slots=0)
    assert _take_slot(loop.pk, reviewer, 60, now) is None  # compare-and-set
    assert Assignment.objects.filter(loop=loop).count() == 1


def test_stop_ends_an_in_progress_loop_once(make_flow, make_loops, reviewer):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    held = claim_next_slot(reviewer)
    stopped = stop_loop(loop)
    assert stopped.status == LoopStatus.STOPPED and stopped.open_slots == 0
    assert Assignment.objects.get(pk=held.pk).status == AssignmentStatus.EXPIRED
    with pytest.raises(ReviewError) as info:
        stop_loop(loop)
    assert info.value.status == 409


def test_the_beat_task_runs_the_housekeeping(make_flow, make_loops, reviewer):
    from studio.celery import app

    app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    task = app.tasks["review.tasks.expire_review_work_task"]
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    backdate_leases(claim_next_slot(reviewer))
    assert task.apply().get() == {"leases": 1, "loops": 0, "outputs": 0}
    assert counters(loop) == (1, 0, 0, 1)


def test_without_a_flow_a_reviewer_gets_the_items_of_all_their_teams_flows(make_flow, make_loops, reviewer):
    first, second = make_flow(), make_flow(order="least_confident")
    expected = {loop.pk for loop in make_loops(first, 2) + make_loops(second, 2)}
    got = set()
    while (held := claim_next_slot(reviewer)) is not None:
        got.add(held.loop_id)
    assert got == expected


@pytest.mark.skipif(not connection.features.has_select_for_update_skip_locked,
                    reason="the lean answer path is PostgreSQL's; SQLite answers through the ORM path")
def test_an_answer_on_postgresql_is_two_statements_and_the_last_one_consolidates_in_a_third(
        make_flow, make_loops, reviewer, reviewers):
    """The hot path stays lean: lock the loop, then answer+count+read the earlier votes in
    one statement; the answer that fills the loop adds one UPDATE for the consolidation."""
    flow = make_flow(task_count=2)
    [loop] = make_loops(flow, 1)
    one = reviewers(1)[0]
    first, second = claim_next_slot(reviewer), claim_next_slot(one)

    def statements(call) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            call()
        return [q["sql"] for q in captured.captured_queries
                if not q["sql"].startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT"))]

    assert len(statements(lambda: answer_slot(first.pk, reviewer, {"label": "dog"}))) == 2
    assert counters(loop) == (2, 1, 1, 0) and refresh(loop).status == LoopStatus.IN_PROGRESS
    last = statements(lambda: answer_slot(second.pk, one, {"label": "dog"}))
    assert len(last) == 3 and last[-1].startswith("UPDATE review_humanloop SET status")
    done = refresh(loop)
    assert (done.status, done.consolidated_label, done.agreement) == (LoopStatus.COMPLETED, "dog", 1.0)
    assert counters(loop) == (2, 2, 0, 0)
    answered = Assignment.objects.get(pk=second.pk)
    assert answered.status == AssignmentStatus.ANSWERED and answered.answer == {"label": "dog"}
    assert answered.time_spent_seconds is not None and answered.time_spent_seconds >= 0
