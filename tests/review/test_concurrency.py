"""16 reviewers at once, each on its own database connection, work through 2,000 loops
with task_count 2: every loop gets exactly two answers from two different reviewers,
nothing is lost and nothing is left held."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import pytest
from django.db import connection, connections

from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot
from review.models import Assignment, AssignmentStatus, HumanLoop, LoopStatus

REVIEWERS = 16
LOOPS = 2000


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.mark.django_db(transaction=True)
def test_16_concurrent_reviewers_answer_2000_loops_exactly_twice(make_flow, make_loops, owner, reviewers, team):
    if not on_postgres():
        pytest.skip("needs PostgreSQL: SQLite serialises writers and its shared-cache test database answers "
                    "concurrent writers with 'database table is locked'; the invariants the threads would "
                    "exercise (compare-and-set slot update, unique live hold) are tested single-threaded "
                    "in test_claims.py")
    users = reviewers(REVIEWERS)
    flow = make_flow(task_count=2, task_time_limit_seconds=600, work_team=team(owner, *users))
    loops = make_loops(flow, LOOPS)
    # Both answers of a loop agree (its predicted label), so no tie asks for a third.
    label_of = {loop.pk: loop.prediction["label"] for loop in loops}
    errors: list[BaseException] = []
    done_by: dict[str, int] = defaultdict(int)
    start = threading.Barrier(REVIEWERS)

    def work(user) -> None:
        try:
            start.wait()
            while (held := claim_next_slot(user, flow)) is not None:
                answer_slot(held.pk, user, {"label": label_of[held.loop_id]})
                done_by[user.username] += 1
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a reviewer thread hung"
    assert not errors, errors[:3]

    assert sum(done_by.values()) == 2 * LOOPS
    assert len(done_by) > 1  # the work was actually shared
    statuses = Counter(HumanLoop.objects.filter(flow_definition=flow).values_list("status", flat=True))
    assert statuses == {LoopStatus.COMPLETED: LOOPS}
    assert not HumanLoop.objects.filter(flow_definition=flow).exclude(
        answers_needed=2, answers_count=2, holds_count=0, open_slots=0).exists()
    answers = list(Assignment.objects.filter(loop__flow_definition=flow).values_list("loop_id", "worker_id", "status"))
    assert {status for _, _, status in answers} == {AssignmentStatus.ANSWERED}
    per_loop: dict[int, list[int]] = defaultdict(list)
    for loop_id, worker_id, _ in answers:
        per_loop[loop_id].append(worker_id)
    assert len(per_loop) == LOOPS
    assert all(len(workers) == 2 and len(set(workers)) == 2 for workers in per_loop.values())
