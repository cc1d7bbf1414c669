"""The plain SQL of review's hot paths, in one place (hot endpoints take the lean path:
the ORM's query building cost more than these queries).

Status values are rendered into the text from the enums, as literals rather than
parameters: the partial indexes (loop_claim_oldest, loop_claim_least_confident,
assignment_lease) are on `status = <literal>`, and the planner uses one only when the
query says the same literal. Statements that name the work-team membership table are
rendered on first use, once the models are ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache

from review.models import LIVE_ASSIGNMENT_STATUSES, AssignmentStatus, LoopOrder, LoopStatus, WorkTeam


def _literal(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _literals(values: Iterable[str]) -> str:
    return ", ".join(_literal(value) for value in values)


IN_PROGRESS = _literal(LoopStatus.IN_PROGRESS)
HELD = _literal(AssignmentStatus.HELD)
ANSWERED = _literal(AssignmentStatus.ANSWERED)
LIVE = _literals(LIVE_ASSIGNMENT_STATUSES)


@cache
def _members() -> str:
    return WorkTeam.members.through._meta.db_table


# Both engines. The flows a reviewer may claim from (their work teams'), with every field a
# claim and its response need, read once per claim. {only} narrows it to one flow.
_REVIEWABLE_FLOWS = """
SELECT f.id, f.name, f.title, f.task_type, f.labels, f.instructions_html, f.show_prediction,
       f.task_time_limit_seconds, f."order"
FROM review_flowdefinition f
WHERE {only} EXISTS (SELECT 1 FROM {members} m WHERE m.workteam_id = f.work_team_id AND m.user_id = %s)
ORDER BY f.id
"""


@cache
def reviewable_flows(one_flow: bool) -> str:
    """Parameters: [flow id, user id] with one_flow, else [user id]."""
    return _REVIEWABLE_FLOWS.format(only="f.id = %s AND" if one_flow else "", members=_members())


# PostgreSQL: the whole claim is one statement: pick the first open loop of the flow that
# the reviewer holds, answered or skipped nothing of, locked with SKIP LOCKED so concurrent
# claimers never wait on one another or get the same row; move one of its slots from open
# to held; insert the hold; return the hold with what the reviewer is shown of the loop.
# The membership check rides along, so a non-member gets nothing. The ORDER BY matches
# the partial indexes loop_claim_oldest / loop_claim_least_confident; the candidate rule
# is HumanLoop.objects.claimable_by(user, now).in_claim_order(order), which SQLite uses.
_CLAIM = """
WITH candidate AS (
    SELECT l.id FROM review_humanloop l
    WHERE l.flow_definition_id = %(flow)s AND l.status = {in_progress} AND l.open_slots > 0
      AND l.expires_at > %(now)s
      AND EXISTS (SELECT 1 FROM review_flowdefinition f JOIN {members} m ON m.workteam_id = f.work_team_id
                  WHERE f.id = %(flow)s AND m.user_id = %(user)s)
      AND NOT EXISTS (SELECT 1 FROM review_assignment a WHERE a.loop_id = l.id AND a.worker_id = %(user)s
                      AND a.status IN ({live}))
    ORDER BY {order}
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), moved AS (
    UPDATE review_humanloop h SET open_slots = h.open_slots - 1, holds_count = h.holds_count + 1
    FROM candidate WHERE h.id = candidate.id AND h.open_slots > 0
    RETURNING h.id, h.name, h.input_content, h.prediction
), held AS (
    INSERT INTO review_assignment (loop_id, worker_id, status, claimed_at, lease_expires_at)
    SELECT moved.id, %(user)s, {held}, %(now)s, %(lease)s FROM moved
    RETURNING id, loop_id
)
SELECT held.id, moved.id, moved.name, moved.input_content, moved.prediction
FROM held JOIN moved ON moved.id = held.loop_id
"""
_CLAIM_ORDER: dict[str, str] = {LoopOrder.OLDEST: "l.created_at, l.id", LoopOrder.LEAST_CONFIDENT: "l.confidence ASC NULLS LAST, l.id"}


@cache
def claim(order: str) -> str:
    """The claim in the flow's order (an unknown order: oldest). Parameters: flow, user,
    now, lease (when the hold's lease runs out)."""
    return _CLAIM.format(members=_members(), in_progress=IN_PROGRESS, live=LIVE, held=HELD,
                         order=_CLAIM_ORDER.get(order, _CLAIM_ORDER[LoopOrder.OLDEST]))


# PostgreSQL, the answer in the common case, inside answer_slot's transaction. First lock
# the loop (the lock every change to its assignments is made under) and read what the
# answer needs of it and its flow. Parameters: assignment, user.
ANSWER_LOCK = """
SELECT l.id, l.name, l.status, l.answers_needed, l.escalations, f.task_type, f.labels, f.work_team_id
FROM review_humanloop l JOIN review_flowdefinition f ON f.id = l.flow_definition_id
WHERE l.id = (SELECT a.loop_id FROM review_assignment a WHERE a.id = %(assignment)s AND a.worker_id = %(user)s)
FOR UPDATE OF l
"""

# Then in one statement — a fresh snapshot, so the assignment it reads is current — answer
# the assignment if it is still held and live, count the answer on the loop, and read the
# answers given before it (for the vote). No row when the slot is no longer held.
# Parameters: answer (jsonb), now, assignment, loop.
ANSWER = f"""
WITH answered AS (
    UPDATE review_assignment
    SET status = {ANSWERED}, answer = %(answer)s, answered_at = %(now)s,
        time_spent_seconds = GREATEST(0, EXTRACT(EPOCH FROM %(now)s - claimed_at))::double precision
    WHERE id = %(assignment)s AND loop_id = %(loop)s AND status = {HELD} AND lease_expires_at > %(now)s
    RETURNING claimed_at, lease_expires_at, time_spent_seconds
), counted AS (
    UPDATE review_humanloop SET answers_count = answers_count + 1, holds_count = holds_count - 1
    WHERE id = %(loop)s AND EXISTS (SELECT 1 FROM answered)
    RETURNING answers_count, holds_count, open_slots
)
SELECT answered.claimed_at, answered.lease_expires_at, answered.time_spent_seconds,
       counted.answers_count, counted.holds_count, counted.open_slots,
       ARRAY(SELECT a.answer ->> 'label' FROM review_assignment a
             WHERE a.loop_id = %(loop)s AND a.status = {ANSWERED} AND a.id <> %(assignment)s)
FROM answered, counted
"""

_SOMEONE_LEFT = """
SELECT EXISTS (SELECT 1 FROM {members} m WHERE m.workteam_id = %(team)s AND NOT EXISTS (
    SELECT 1 FROM review_assignment a WHERE a.loop_id = %(loop)s AND a.worker_id = m.user_id
    AND a.status IN ({live})))
"""


@cache
def someone_left() -> str:
    """Whether a member of the team has not yet held, answered or skipped the loop.
    Parameters: team, loop."""
    return _SOMEONE_LEFT.format(members=_members(), live=LIVE)


def update_loop(fields: Sequence[str]) -> str:
    """UPDATE of the loop's named fields. Parameters: each field's value in order, then the id."""
    return f"UPDATE review_humanloop SET {', '.join(f'{field} = %s' for field in fields)} WHERE id = %s"


# Both engines. Held assignments whose lease ran out, oldest first; every claim asks this
# first, nearly always to find none: the partial index assignment_lease answers it.
# Parameters: [now, limit].
LEASES_RUN_OUT = (f"SELECT id, loop_id FROM review_assignment WHERE status = {HELD} AND lease_expires_at <= %s "
                  "ORDER BY lease_expires_at LIMIT %s")
