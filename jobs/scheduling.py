"""The scheduler tick: start pending jobs on idle nodes, gang by gang.

    schedule_jobs()  Pending jobs by priority, FIFO within a priority; each gets all
                     `instance_count` nodes of its instance type at once or none (a job
                     never holds part of a gang, so two multi-node jobs contending for
                     nodes cannot deadlock)

Warm pools (`keep_alive_seconds`, docs/SPEC.md §3.6): a job that ends with keep_alive_seconds leaves
its nodes `warm` — reserved for the next job of the same project, instance type and
instance count, each holding a fork server with torch imported and the staged data cache
(jobs.runner.warm). A matching job takes the whole pool and starts there, ahead of the
queue (the pool is held for it); other jobs never see warm nodes; an expired pool frees
its nodes.

Within an instance type the queue is strict FIFO: a job that could run on the nodes that
are registered but finds too few idle holds back the jobs behind it (a stream of small
jobs must not starve a big one). A job asking for more nodes than are registered does not
hold anyone back; it waits, saying why, until nodes join.

The celery beat runs it every 2 s (`schedule_jobs_task`), submit_job sends it on commit
and an agent sends it when it frees its node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from jobs import cost
from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.transitions import transition

log = logging.getLogger(__name__)
PENDING_SCAN_LIMIT = 500
# The agent renews the lease as soon as it starts; until then the lease covers the time a
# node's queue needs to hand it the task.
START_LEASE_SECONDS = 120


@dataclass(frozen=True)
class Placement:
    nodes: list[Node]  # in node-rank order
    waiting_reason: str = ""  # why not, when nodes is empty
    blocks_queue: bool = False  # the job could start on registered nodes: later jobs of its type wait
    impossible: str = ""  # the job can never run here: fail it with this reason
    warm_pool: str = ""  # the nodes are this warm pool's


def schedule_jobs() -> list[int]:
    """1. Expire the leases of jobs whose agents went silent. 2. Walk Pending jobs oldest
    first; start each whose gang fits, one transaction per job. Returns the started ids."""
    expire_stale_leases()
    expire_warm_pools()
    started: list[int] = []
    blocked_by: dict[str, int] = {}  # instance type → the waiting job that holds its queue
    pending = list(TrainingJob.objects.filter(status=JobStatus.PENDING).order_by("-priority", "created_at", "pk")
                   .values_list("pk", flat=True)[:PENDING_SCAN_LIMIT])
    for job_id in pending:
        try:
            if _try_start(job_id, blocked_by):
                started.append(job_id)
        except Exception:  # noqa: BLE001 - one job's trouble must not stall the queue
            log.exception("scheduling job %s failed; trying again at the next tick", job_id)
    return started


def _try_start(job_id: int, blocked_by: dict[str, int]) -> bool:
    with transaction.atomic():
        # skip_locked: another scheduler tick holding this job is starting it already.
        job = TrainingJob.objects.select_for_update(skip_locked=True).filter(pk=job_id, status=JobStatus.PENDING).first()
        if job is None:
            return False
        placement = place(job, ahead=blocked_by.get(job.instance_type))
        if placement.impossible:
            transition(job.pk, JobStatus.FAILED, from_statuses=[JobStatus.PENDING], failure_reason=placement.impossible,
                       message=placement.impossible, waiting_reason="")
            return False
        if not placement.nodes:
            if placement.blocks_queue:
                blocked_by.setdefault(job.instance_type, job.pk)
            (TrainingJob.objects.filter(pk=job.pk, status=JobStatus.PENDING).exclude(waiting_reason=placement.waiting_reason)
             .update(waiting_reason=placement.waiting_reason))
            return False
        from_state = NodeState.WARM if placement.warm_pool else NodeState.IDLE
        reserved = (Node.objects.filter(pk__in=[n.pk for n in placement.nodes], state=from_state,
                                        warm_pool=placement.warm_pool, current_job__isnull=True)
                    .update(state=NodeState.BUSY, current_job=job))
        if reserved != len(placement.nodes):
            transaction.set_rollback(True)  # a node went away in between: all or nothing
            return False
        attempt = job.attempt + 1
        now = timezone.now()
        names = ", ".join(n.name for n in placement.nodes)
        where = f"warm pool {placement.warm_pool} ({names})" if placement.warm_pool else names
        if not transition(job.pk, JobStatus.STARTING, from_statuses=[JobStatus.PENDING], message=f"on {where}",
                          attempt=F("attempt") + 1, started_at=now, waiting_reason="", warm_pool=placement.warm_pool,
                          lease_expires_at=now + timedelta(seconds=START_LEASE_SECONDS)):
            transaction.set_rollback(True)
            return False
        if placement.warm_pool:
            # The pool's warm time ends here: billed to the job that left it (jobs.cost).
            cost.end_warm(placement.nodes, now)
        # Each launch keeps the price in force now: a later price change never rewrites it.
        prices = cost.snapshot_prices(job, placement.nodes)
        JobAttempt.objects.bulk_create([JobAttempt(job=job, attempt=attempt, node_rank=rank, node=node, started_at=now,
                                                   warm_start=bool(placement.warm_pool), price_per_hour=price,
                                                   currency=currency)
                                        for rank, (node, (price, currency)) in enumerate(zip(placement.nodes, prices, strict=True))])
        dispatch = [(node.queue, rank) for rank, node in enumerate(placement.nodes)]
        transaction.on_commit(lambda: _dispatch(job.pk, attempt, dispatch))
    return True


def place(job: TrainingJob, *, ahead: int | None = None) -> Placement:
    """Which nodes would run the job now, or why none. Read-only; the caller reserves."""
    wanted = job.instance_count
    kind = job.instance_type
    per_node = job.processes_per_node
    live = Node.objects.live().filter(instance_type=kind)
    pool = warm_pool_for(job)
    if pool:
        return pool
    registered = list(live.values_list("cpus", "gpus"))
    if registered and all(max(cpus, gpus) < per_node for cpus, gpus in registered):
        largest = max(registered, key=lambda r: max(r))
        return Placement([], impossible=(f"{per_node} processes per node do not fit any {kind} node (the largest has "
                                         f"{largest[0]} CPUs and {largest[1]} GPUs); use processes_per_node ≤ "
                                         f"{max(largest)}"))
    fits = Q(cpus__gte=per_node) | Q(gpus__gte=per_node)
    fitting = live.filter(fits).count()
    idle = list(live.filter(fits, state=NodeState.IDLE, current_job__isnull=True).order_by("name")[:wanted])
    nodes_word = "node" if wanted == 1 else "nodes"
    reason = f"waiting for {wanted} {kind} {nodes_word}; {_idle_count(live.filter(fits))} idle, {fitting} registered"
    warm = live.filter(fits, state=NodeState.WARM).count()
    if warm:
        reason += f" ({warm} held warm for other jobs)"
    if wanted > fitting:
        return Placement([], waiting_reason=reason)
    if ahead is not None:
        return Placement([], waiting_reason=f"{reason}; job #{ahead} is ahead in the queue", blocks_queue=True)
    if len(idle) < wanted:
        return Placement([], waiting_reason=reason, blocks_queue=True)
    return Placement(idle)


def warm_pool_for(job: TrainingJob) -> Placement | None:
    """The oldest unexpired warm pool that matches the job (project, instance type,
    instance count) and whose every node is alive, as a placement; None if there is none."""
    now = timezone.now()
    candidates = (Node.objects.live().filter(state=NodeState.WARM, instance_type=job.instance_type,
                                             warm_project_id=job.project_id, warm_instance_count=job.instance_count,
                                             warm_until__gt=now, current_job__isnull=True)
                  .exclude(warm_pool="").order_by("warm_until", "name"))
    pools: dict[str, list[Node]] = {}
    for node in candidates:
        pools.setdefault(node.warm_pool, []).append(node)
    for name, nodes in pools.items():
        if len(nodes) == job.instance_count and all(max(n.cpus, n.gpus) >= job.processes_per_node for n in nodes):
            # Node-rank order as the pool's previous job had it, so node 0 stays node 0.
            return Placement(sorted(nodes, key=lambda n: n.name), warm_pool=name)
    return None


def expire_warm_pools() -> int:
    """Pools past their keep-alive free their nodes (the node's agent then closes its fork
    server, jobs.runner.warm)."""
    now = timezone.now()
    expired = Node.objects.filter(state=NodeState.WARM, warm_until__lt=now)
    ended = cost.warm_nodes(expired)  # read first: the update clears whose pool it was
    count = (expired.filter(pk__in=[node.node_id for node in ended])
             .update(state=NodeState.IDLE, warm_pool="", warm_until=None, warm_project=None, warm_instance_count=0,
                     warm_from_job=None))
    if count:
        cost.end_warm(ended, now)  # each launch's warm time runs to its pool's warm_until
    if count:
        log.info("freed %d node(s) of expired warm pools", count)
    return count


def _idle_count(nodes) -> int:
    return nodes.filter(state=NodeState.IDLE, current_job__isnull=True).count()


def _dispatch(job_id: int, attempt: int, targets: list[tuple[str, int]]) -> None:
    from jobs.tasks import run_node_task

    for queue, node_rank in targets:
        try:
            run_node_task.apply_async(args=(job_id, attempt, node_rank), queue=queue)
        except Exception:  # noqa: BLE001 - the job's start lease runs out and the sweep fails it, with a reason
            log.exception("could not send job %s attempt %s to %s", job_id, attempt, queue)


def expire_stale_leases() -> list[int]:
    """Jobs whose agents stopped renewing their lease (node died, task never arrived) do
    not look busy forever: the attempt ends (jobs.recovery) — retried from the last
    checkpoint within the job's retries, else failed with an infrastructure reason; a
    stopping job ends Stopped."""
    from jobs.recovery import end_attempt

    now = timezone.now()
    stale = list(TrainingJob.objects.running().filter(lease_expires_at__lt=now).values_list("pk", "attempt"))
    ended = []
    for job_id, attempt in stale:
        silent = list(JobAttempt.objects.filter(job_id=job_id, attempt=attempt, finished_at__isnull=True)
                      .exclude(node__name=None).values_list("node__name", flat=True))
        nodes = ", ".join(silent) or "its node"
        cause = (f"the node agent on {nodes} stopped renewing the job's lease (the node or its worker died, or "
                 "never received the job)")
        try:
            if end_attempt(job_id, attempt, cause=cause):
                ended.append(job_id)
        except Exception:  # noqa: BLE001 - the next tick tries again
            log.exception("could not end job %s's silent attempt", job_id)
            continue
        # The silent agents cannot release their nodes; a node that is alive takes work again.
        with transaction.atomic():
            Node.objects.filter(current_job_id=job_id, state=NodeState.BUSY, name__in=silent).update(
                state=NodeState.IDLE, current_job=None)
            JobAttempt.objects.filter(job_id=job_id, attempt=attempt, finished_at__isnull=True).update(
                finished_at=now, outcome="lost")
            cost.settle_launches(job_id, attempt)
    if ended:
        log.warning("ended attempts of jobs whose agents stopped renewing their leases: %s", ended)
    return ended
