"""When an attempt dies with its infrastructure — a node lost, an agent silent, a worker
shut down — the job goes back to Pending for a fresh attempt (within its `retries`) and
resumes from its last checkpoint; with no retries left it fails with a reason a person
can act on (docs/SPEC.md §3.6).

    end_attempt(job_id, attempt, cause=..., lost_nodes=[...])

Called by the lost-node sweep (jobs.nodes.mark_lost_nodes), the lease sweep
(jobs.scheduling.expire_stale_leases) and by an agent whose gang peer vanished or whose
worker is shutting down. Compare-and-set on (status, attempt): two callers noticing the
same loss retry the job once.

The surviving nodes of the gang see the job's attempt change (jobs.runner.agent) and end
their processes; they release their own nodes, so the retry never lands on a node that is
still tearing the old attempt down. A lost node is released here: no agent is left to do it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import cost
from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.transitions import transition

log = logging.getLogger(__name__)

RUNNING = (JobStatus.STARTING, JobStatus.TRAINING, JobStatus.UPLOADING)


def end_attempt(job_id: int, attempt: int, *, cause: str, lost_nodes: Iterable[str] = ()) -> str:
    """Requeue the job (Pending, the next attempt) or fail it when no retry is left; a
    job asked to stop ends Stopped. Returns "requeued", "failed", "stopped" or "" when the
    job had moved on already (another attempt, finished)."""
    lost = sorted(set(lost_nodes))
    now = timezone.now()
    with transaction.atomic():
        job = (TrainingJob.objects.select_for_update().filter(pk=job_id, attempt=attempt)
               .only("pk", "status", "attempt", "retries").first())
        if job is None or job.status not in (*RUNNING, JobStatus.STOPPING):
            return ""
        if lost:
            JobAttempt.objects.filter(job_id=job_id, attempt=attempt, node__name__in=lost,
                                      finished_at__isnull=True).update(finished_at=now, outcome="lost")
            cost.settle_launches(job_id, attempt)  # the lost launches' billable time ends with them
            # No agent is left on a lost node to release it; a revived node comes back idle.
            Node.objects.filter(name__in=lost, current_job_id=job_id).update(current_job=None)
        if job.status == JobStatus.STOPPING:
            transition(job_id, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING],
                       message=f"stopped; {cause}", lease_expires_at=None)
            outcome = "stopped"
        elif attempt <= job.retries:
            used = attempt  # attempts so far; the first is not a retry
            message = (f"{cause}; retrying (retry {used} of {job.retries}): attempt {attempt + 1} resumes from "
                       "the last checkpoint")
            transition(job_id, JobStatus.PENDING, from_statuses=list(RUNNING), message=message,
                       lease_expires_at=None, warm_pool="", waiting_reason=f"retrying after: {cause}"[:300])
            outcome = "requeued"
        else:
            retries = ("no retries were asked for (set retries to resume from the last checkpoint on another node)"
                       if job.retries == 0 else f"all {job.retries} retries are used")
            reason = f"infrastructure error: {cause}; {retries}"
            transition(job_id, JobStatus.FAILED, from_statuses=list(RUNNING), failure_reason=reason, message=reason)
            outcome = "failed"
        if outcome != "requeued":
            # The attempt is over: nodes whose agents are gone must not look busy with it.
            Node.objects.filter(current_job_id=job_id, state=NodeState.LOST).update(current_job=None)
    log.warning("job %s attempt %s: %s (%s)", job_id, attempt, outcome, cause)
    if outcome == "requeued":
        transaction.on_commit(_schedule_soon)
    return outcome


def busy_jobs_of(node_names: Iterable[str]) -> dict[int, list[str]]:
    """{job id: [node names]} for the running attempts those nodes held."""
    held: dict[int, list[str]] = {}
    rows = (JobAttempt.objects.filter(node__name__in=list(node_names), finished_at__isnull=True,
                                      job__attempt=F("attempt"))
            .values_list("job_id", "node__name"))
    for job_id, name in rows:
        held.setdefault(job_id, []).append(name)
    return held


def _schedule_soon() -> None:
    from jobs.tasks import schedule_jobs_task

    try:
        schedule_jobs_task.delay()
    except Exception:  # noqa: BLE001 - the periodic tick picks the job up anyway
        log.debug("could not send a scheduling tick", exc_info=True)
