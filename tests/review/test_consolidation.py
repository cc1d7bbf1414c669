"""Consolidation: majority vote, tie escalation, no consensus, free text, and the A2I
output JSON in the object store."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from datasets.storage import object_uri
from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot
from review.actions.expiry import expire_review_work
from review.consolidation import MAX_ESCALATIONS, NO_CONSENSUS
from review.models import Assignment, HumanLoop, LoopStatus
from review.output import read_loop_output
from review.tasks import write_output_task

pytestmark = pytest.mark.django_db


def answer_in_turn(loop: HumanLoop, users, answers) -> HumanLoop:
    """Each user claims the loop's next slot and gives their answer."""
    for user, answer in zip(users, answers, strict=True):
        held = claim_next_slot(user, loop.flow_definition)
        assert held is not None and held.loop_id == loop.pk, f"{user} got no slot of {loop.name}"
        answer_slot(held.pk, user, answer)
    return HumanLoop.objects.get(pk=loop.pk)


def labels(*names):
    return [{"label": name} for name in names]


def test_majority_vote_with_agreement(make_flow, make_loops, owner, reviewers, team):
    flow = make_flow(task_count=3, work_team=team(owner, *reviewers(3)))
    [loop] = make_loops(flow, 1)
    done = answer_in_turn(loop, reviewers(3), labels("cat", "dog", "cat"))
    assert (done.status, done.consolidated_label, done.escalations) == (LoopStatus.COMPLETED, "cat", 0)
    assert done.agreement == pytest.approx(2 / 3)


def test_a_tie_asks_one_more_reviewer_who_breaks_it(make_flow, make_loops, owner, reviewers, team):
    flow = make_flow(task_count=2, work_team=team(owner, *reviewers(3)))
    [loop] = make_loops(flow, 1)
    one, two, three = reviewers(3)
    tied = answer_in_turn(loop, [one, two], labels("cat", "dog"))
    assert tied.status == LoopStatus.IN_PROGRESS
    assert (tied.answers_needed, tied.answers_count, tied.open_slots, tied.escalations) == (3, 2, 1, 1)
    assert claim_next_slot(one) is None  # the tie-breaker is someone new
    done = answer_in_turn(tied, [three], labels("dog"))
    assert (done.status, done.consolidated_label, done.escalations) == (LoopStatus.COMPLETED, "dog", 1)
    assert done.agreement == pytest.approx(2 / 3)


def test_ties_escalate_at_most_twice_then_no_consensus(make_flow, make_loops, owner, reviewers, team):
    four = reviewers(4)
    flow = make_flow(task_count=2, labels=["cat", "dog", "bird", "fish"], work_team=team(owner, *four))
    [loop] = make_loops(flow, 1)
    after_two_ties = answer_in_turn(loop, four[:3], labels("cat", "dog", "bird"))
    assert after_two_ties.escalations == MAX_ESCALATIONS == 2
    assert after_two_ties.answers_needed == 4 and after_two_ties.status == LoopStatus.IN_PROGRESS
    done = answer_in_turn(after_two_ties, four[3:], labels("fish"))
    assert (done.status, done.consolidated_label, done.escalations) == (LoopStatus.COMPLETED, NO_CONSENSUS, 2)
    assert done.agreement == pytest.approx(1 / 4)
    assert done.open_slots == 0 and done.holds_count == 0


def test_free_text_keeps_every_answer(make_flow, make_loops, owner, reviewers, team):
    flow = make_flow(task_type="free_text", task_count=2, work_team=team(owner, *reviewers(2)))
    [loop] = make_loops(flow, 1)
    done = answer_in_turn(loop, reviewers(2), [{"text": "a tabby"}, {"text": "a kitten"}])
    assert (done.status, done.consolidated_label, done.agreement) == (LoopStatus.COMPLETED, "", None)
    assert sorted(a.answer["text"] for a in Assignment.objects.filter(loop=loop)) == ["a kitten", "a tabby"]


def test_the_output_json_has_a2is_shape(make_flow, make_loops, owner, reviewers, team,
                                        django_capture_on_commit_callbacks):
    flow = make_flow(task_count=2, work_team=team(owner, *reviewers(2)))
    [loop] = make_loops(flow, 1, content=lambda i: {"text": "<script>alert(1)</script> a cat"})
    with django_capture_on_commit_callbacks() as callbacks:
        done = answer_in_turn(loop, reviewers(2), labels("cat", "cat"))
    assert len(callbacks) == 1  # the completing answer hands the write to the control worker
    done.refresh_from_db()
    assert done.output_uri == ""
    write_output_task(loop.pk)  # what the control worker runs
    done.refresh_from_db()
    assert done.output_uri == object_uri(f"review/acme/flows/{flow.pk}/loops/{loop.name}/output.json")
    output = read_loop_output(done)
    assert set(output) == {"humanLoopName", "flowDefinition", "inputContent", "humanAnswers", "consolidatedAnswer",
                           "modelPrediction", "status", "createdAt", "completedAt"}
    assert output["humanLoopName"] == loop.name and output["flowDefinition"] == flow.name
    assert output["inputContent"] == {"text": "<script>alert(1)</script> a cat"}
    assert [a["workerId"] for a in output["humanAnswers"]] == ["reviewer-1", "reviewer-2"]
    for answer in output["humanAnswers"]:
        assert set(answer) == {"workerId", "answerContent", "submissionTime", "timeSpentInSeconds"}
        assert answer["answerContent"] == {"label": "cat"} and answer["timeSpentInSeconds"] >= 0
        assert answer["submissionTime"].endswith("Z")
    assert output["consolidatedAnswer"] == {"label": "cat", "agreement": 1.0, "votes": {"cat": 2}}
    assert output["modelPrediction"]["label"] == loop.prediction["label"]
    assert output["status"] == "Completed" and output["completedAt"] >= output["createdAt"]


def test_an_output_that_could_not_be_written_is_written_later(make_flow, make_loops, reviewer, settings,
                                                              tmp_path, django_capture_on_commit_callbacks):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    good_store = settings.STUDIO_OBJECT_STORE
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store should be")
    settings.STUDIO_OBJECT_STORE = blocker.as_uri()
    held = claim_next_slot(reviewer)
    with django_capture_on_commit_callbacks():
        answer_slot(held.pk, reviewer, {"label": "dog"})
    assert write_output_task(loop.pk) is None  # the worker's write fails: the store is a file
    done = HumanLoop.objects.get(pk=loop.pk)
    assert done.status == LoopStatus.COMPLETED and done.output_uri == ""
    settings.STUDIO_OBJECT_STORE = good_store
    assert expire_review_work()["outputs"] == 0  # too fresh: its own write may still be under way
    result = expire_review_work(timezone.now() + timedelta(minutes=1))
    assert result["outputs"] == 1
    done.refresh_from_db()
    assert read_loop_output(done)["consolidatedAnswer"]["label"] == "dog"


def test_a_tie_with_nobody_left_to_ask_completes_without_consensus(make_flow, make_loops, owner, reviewers, team):
    pair = reviewers(2)
    flow = make_flow(task_count=2, work_team=team(owner, *pair))
    [loop] = make_loops(flow, 1)
    done = answer_in_turn(loop, pair, labels("cat", "dog"))
    assert (done.status, done.consolidated_label, done.escalations) == (LoopStatus.COMPLETED, NO_CONSENSUS, 0)
    assert done.agreement == pytest.approx(0.5)
