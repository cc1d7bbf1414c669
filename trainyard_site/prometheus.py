"""GET /metrics: the cluster's health in Prometheus's text format, for the tools operators
already run (Prometheus, Grafana, Alertmanager).

Not part of the API (no JSON, no session, not in the OpenAPI schema). A scraper is let in
when it sends `Authorization: Bearer <STUDIO_METRICS_TOKEN>` (if a token is set) or when
its address (REMOTE_ADDR; X-Forwarded-For is not trusted) is in
STUDIO_METRICS_ALLOWED_NETWORKS (loopback by default). Anyone else: 401 when a token is
set (send it), else 403.

Each scrape runs StudioCollector: a handful of grouped queries and one Redis HGETALL,
whatever the number of jobs, points or loops. The figures are the API's:
- trainyard_nodes{state,instance_type}: nodes by the state the Nodes page shows (a node
  silent past STUDIO_NODE_LOST_SECONDS reads lost before the sweep marks it);
  trainyard_gpus the same for their GPUs.
- trainyard_node_cpu_utilization_percent{node}, trainyard_node_gpu_utilization_percent
  {node,gpu}: the latest system sample (last minute) of the job a node runs, else (idle,
  warm) the node's own heartbeat figure (jobs.cluster); gpu="all" (the mean over the node's
  GPUs). A node silent for a minute has none.
- trainyard_jobs{status,instance_type}: jobs as the jobs list counts them (archived jobs
  left out); trainyard_queue_depth{instance_type}: Pending jobs;
  trainyard_queue_oldest_pending_seconds{instance_type}: the oldest one's wait (0: none).
- trainyard_metric_points_written_total, trainyard_metric_points_dropped_total,
  trainyard_flusher_lag_seconds, trainyard_flusher_last_cycle_timestamp_seconds,
  trainyard_flushers: the live flushers' own figures (jobs.metrics.ingest.FLUSHER_STATS),
  summed (lag: the worst). Each flusher counts from its start, so a restart shows as a
  counter reset, which rate() expects.
- trainyard_review_backlog{project}, trainyard_review_open_slots{project},
  trainyard_review_oldest_loop_age_seconds{project}: InProgress human loops, per project
  with a review flow (0 when none waits).
- trainyard_rule_alarms_firing{project,rule_type}, trainyard_rules{state}: enabled rules of
  unfinished jobs only. A finished job's rule keeps its last state as history (a job a rule
  stopped stays ALARM), which would page someone for ever about a job that is over.
"""

from __future__ import annotations

import hmac
import logging
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Min, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs.cluster import node_utilisation, pending_queues
from jobs.metrics.ingest import read_flusher_stats
from jobs.models import FINISHED_STATUSES, JobRule, JobStatus, Node, NodeState, RuleState, TrainingJob
from jobs.node_overview import DEFAULT_INSTANCE_TYPE, shown_state_expression
from review.models import FlowDefinition, HumanLoop, LoopStatus
from studio.networks import in_networks, networks
from studio.redis_conn import redis_client

log = logging.getLogger(__name__)


class StudioCollector(Collector):
    """Every trainyard_* family, read fresh at each scrape."""

    def describe(self) -> list[Metric]:
        return []  # nothing to describe up front: registering must not run the queries

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self.nodes(now)
        yield from self.utilisation(now)
        yield from self.jobs(now)
        yield from self.flushers()
        yield from self.review(now)
        yield from self.rules()

    # --- nodes ------------------------------------------------------------------------------
    def nodes(self, now: datetime) -> Iterator[Metric]:
        nodes = GaugeMetricFamily("trainyard_nodes", "Nodes by instance type and the state the Nodes page shows "
                                  "(silent past STUDIO_NODE_LOST_SECONDS: lost).", labels=["state", "instance_type"])
        gpus = GaugeMetricFamily("trainyard_gpus", "GPUs on the nodes, by instance type and the nodes' shown state.",
                                 labels=["state", "instance_type"])
        counts: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
        rows = (Node.objects.annotate(shown=shown_state_expression(now)).values("instance_type", "shown")
                .annotate(n=Count("pk"), gpus=Sum("gpus")).order_by())
        for row in rows:
            n, g = counts[row["instance_type"]].get(row["shown"], (0, 0))
            counts[row["instance_type"]][row["shown"]] = (n + row["n"], g + (row["gpus"] or 0))
        for instance_type in sorted(counts):
            for state in NodeState.values:
                n, g = counts[instance_type].get(state, (0, 0))
                nodes.add_metric([state, instance_type], n)
                gpus.add_metric([state, instance_type], g)
        yield nodes
        yield gpus

    def utilisation(self, now: datetime) -> Iterator[Metric]:
        cpu = GaugeMetricFamily("trainyard_node_cpu_utilization_percent",
                                "CPU use of a node: its job's latest system sample, else its own heartbeat's (last minute).",
                                labels=["node"])
        gpu = GaugeMetricFamily("trainyard_node_gpu_utilization_percent",
                                "GPU use of a node: its job's latest system sample, else its own heartbeat's (last minute); "
                                "gpu=\"all\": the mean over the node's GPUs.", labels=["node", "gpu"])
        for name, figures in sorted(node_utilisation(now).items()):
            cpu.add_metric([name], figures.cpu_percent)
            if figures.gpu_percent is not None:
                gpu.add_metric([name, "all"], figures.gpu_percent)
        yield cpu
        yield gpu

    # --- jobs and the queue -----------------------------------------------------------------
    def jobs(self, now: datetime) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("trainyard_jobs", "Training jobs (tuning trials included, archived ones not) by status "
                                 "and the instance type they ask for.", labels=["status", "instance_type"])
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        rows = (TrainingJob.objects.filter(archived_at__isnull=True).values("status", "resources__instance_type")
                .annotate(n=Count("pk")).order_by())
        for row in rows:
            counts[str(row["resources__instance_type"] or DEFAULT_INSTANCE_TYPE)][row["status"]] += row["n"]
        for instance_type in sorted(counts):
            for status in JobStatus.values:
                jobs.add_metric([status, instance_type], counts[instance_type].get(status, 0))
        yield jobs

        depth = GaugeMetricFamily("trainyard_queue_depth", "Pending jobs waiting for a node of this instance type.",
                                  labels=["instance_type"])
        oldest = GaugeMetricFamily("trainyard_queue_oldest_pending_seconds",
                                   "How long the oldest Pending job of this instance type has waited since its "
                                   "submission (0: none waits).", labels=["instance_type"])
        queues = {queue.instance_type: queue for queue in pending_queues()}
        node_types = set(Node.objects.exclude(state=NodeState.STOPPED).values_list("instance_type", flat=True).distinct())
        for instance_type in sorted(set(queues) | set(counts) | node_types):
            queue = queues.get(instance_type)
            depth.add_metric([instance_type], queue.jobs if queue else 0)
            oldest.add_metric([instance_type], max(0.0, (now - queue.oldest_created_at).total_seconds()) if queue else 0)
        yield depth
        yield oldest

    # --- the metrics ingest -----------------------------------------------------------------
    def flushers(self) -> Iterator[Metric]:
        try:
            stats = read_flusher_stats(redis_client())
        except Exception:  # noqa: BLE001 - Redis down: the other families still answer
            log.warning("/metrics: the flushers' stats could not be read from Redis", exc_info=True)
            return
        yield GaugeMetricFamily("trainyard_flushers", "Flushers that reported in the last minute.", value=stats.flushers)
        yield CounterMetricFamily("trainyard_metric_points_written", "Metric points and system samples the live "
                                  "flushers wrote to the database since each started.", value=stats.written)
        yield CounterMetricFamily("trainyard_metric_points_dropped", "Metric points and system samples of deleted jobs "
                                  "the live flushers dropped since each started.", value=stats.dropped)
        yield GaugeMetricFamily("trainyard_flusher_lag_seconds", "How far behind the writers the slowest live flusher "
                                "is: the age of the oldest entry its latest read returned (0: caught up).",
                                value=stats.lag_seconds)
        if stats.last_cycle_at is not None:
            yield GaugeMetricFamily("trainyard_flusher_last_cycle_timestamp_seconds",
                                    "When a flusher last finished a cycle (unix time; also after every flusher "
                                    "stopped: alert on its age).", value=stats.last_cycle_at)

    # --- review -----------------------------------------------------------------------------
    def review(self, now: datetime) -> Iterator[Metric]:
        backlog = GaugeMetricFamily("trainyard_review_backlog", "InProgress human loops (items waiting for review).",
                                    labels=["project"])
        slots = GaugeMetricFamily("trainyard_review_open_slots", "Answers the InProgress loops still want and no "
                                  "reviewer holds.", labels=["project"])
        age = GaugeMetricFamily("trainyard_review_oldest_loop_age_seconds", "Age of the oldest InProgress human loop "
                                "(0: none waits).", labels=["project"])
        waiting = {row["project__slug"]: row for row in
                   HumanLoop.objects.filter(status=LoopStatus.IN_PROGRESS).values("project__slug")
                   .annotate(n=Count("pk"), open_slots=Sum("open_slots"), oldest=Min("created_at")).order_by()}
        projects = set(FlowDefinition.objects.values_list("project__slug", flat=True).distinct()) | set(waiting)
        for slug in sorted(projects):
            row = waiting.get(slug)
            backlog.add_metric([slug], row["n"] if row else 0)
            slots.add_metric([slug], (row["open_slots"] or 0) if row else 0)
            age.add_metric([slug], max(0.0, (now - row["oldest"]).total_seconds()) if row else 0)
        yield backlog
        yield slots
        yield age

    # --- rules ------------------------------------------------------------------------------
    def rules(self) -> Iterator[Metric]:
        firing = GaugeMetricFamily("trainyard_rule_alarms_firing", "Enabled rules in ALARM on unfinished jobs.",
                                   labels=["project", "rule_type"])
        by_state = GaugeMetricFamily("trainyard_rules", "Enabled rules of unfinished jobs by state.", labels=["state"])
        states: dict[str, int] = defaultdict(int)
        alarms: dict[tuple[str, str], int] = defaultdict(int)
        rows = (JobRule.objects.filter(enabled=True).exclude(job__status__in=FINISHED_STATUSES)
                .values("state", "type", "job__project__slug").annotate(n=Count("pk")).order_by())
        for row in rows:
            states[row["state"]] += row["n"]
            if row["state"] == RuleState.ALARM:
                alarms[(row["job__project__slug"], row["type"])] += row["n"]
        for (project, rule_type), n in sorted(alarms.items()):
            firing.add_metric([project, rule_type], n)
        for state in RuleState.values:
            by_state.add_metric([state], states.get(state, 0))
        yield firing
        yield by_state


REGISTRY = CollectorRegistry(auto_describe=False)  # ours alone: no process or platform collectors
REGISTRY.register(StudioCollector())


# --- who may scrape ------------------------------------------------------------------------------
def _from_allowed_network(request: HttpRequest) -> bool:
    allowed = networks(tuple(settings.STUDIO_METRICS_ALLOWED_NETWORKS), "STUDIO_METRICS_ALLOWED_NETWORKS")
    return in_networks(request.META.get("REMOTE_ADDR", ""), allowed)


def _has_token(request: HttpRequest, token: str) -> bool:
    scheme, _, sent = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode())


def _refusal(request: HttpRequest) -> HttpResponse | None:
    token = settings.STUDIO_METRICS_TOKEN
    if (token and _has_token(request, token)) or _from_allowed_network(request):
        return None
    if token:
        response = HttpResponse("Send Authorization: Bearer <STUDIO_METRICS_TOKEN>.\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="trainyard metrics"'
        return response
    return HttpResponse("Scrapes are allowed from STUDIO_METRICS_ALLOWED_NETWORKS only (or set STUDIO_METRICS_TOKEN).\n",
                        status=403, content_type="text/plain; charset=utf-8")


@require_http_methods(["GET", "HEAD"])
def metrics_view(request: HttpRequest) -> HttpResponse:
    if (refusal := _refusal(request)) is not None:
        return refusal
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
