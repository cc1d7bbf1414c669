"""What a job costs: prices per instance type, the per-launch snapshot, billable and
training time, warm-pool time, a running job's projection, a project's monthly spend.

    price_for(project_id, instance_type, gpus)   per node-hour of one node (GPUs included)
    snapshot_prices(job, nodes)                  the price each launch row gets at placement
    settle_launches(job_id, attempt)             billable/training seconds and cost once ended
    end_warm(nodes, at)                          the warm-pool time a node then held for its job
    job_costs(jobs) / job_cost(job)              a job's figures, summed over attempts and nodes
    project_spend(project, month), tuning_cost(tuning_job)

Precedence: the project's own InstancePrice row, then the site's (project null), then
STUDIO_INSTANCE_PRICES; an unknown type costs 0. A launch keeps the price in force when it
was placed (JobAttempt.price_per_hour): a later price change never rewrites a launch's cost.

Billable: from the launch's start (the agent's claim; placement when it never claimed) to
its end. Training: from the job turning Training in that attempt to the end (0 when it never
trained). Warm: the time the node then stayed in a warm pool for the job, until the pool was
taken by its next job or released; SageMaker bills warm pools, so it is billed here too
(cost = (billable + warm) × price) and shown apart. Every figure is per node row: a job's
total is the sum over its rows, i.e. × its node count. Cost is a Decimal with 6 places,
rounded half-up; pages show it to the cent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.models import F, Max, Q, Sum
from django.utils import timezone

from jobs.models import InstancePrice, JobAttempt, MetricChunk, MetricPoint, Node, NodeState, TrainingJob

SIX_PLACES = Decimal("0.000001")
CENTS = Decimal("0.01")
ZERO = Decimal("0")
# The largest price a person may set (per node-hour or GPU-hour): far above any real one,
# far below what the columns hold (14 digits, 6 places).
MAX_PRICE = Decimal("100000")
# Hyperparameters that say how long a run is, as steps or as epochs.
STEP_HYPERPARAMETERS = ("max_steps", "steps", "num_steps", "total_steps")
EPOCH_HYPERPARAMETERS = ("epochs", "num_epochs", "max_epochs")
EPOCH_METRIC = "epoch"
# A running job's step rate is read from the newest points of its furthest series: up to this
# many (one chunk's worth), all of its current attempt.
RATE_POINTS = 256
# A point's time is the training process's clock; a launch's start, the studio's. A point
# this much before the attempt's start still counts as the attempt's (clock skew).
CLOCK_SKEW_SECONDS = 2.0


# --- prices ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SettingsPrice:
    node: Decimal
    gpu: Decimal


@lru_cache(maxsize=8)
def _parse_settings_prices(raw: str) -> dict[str, SettingsPrice]:
    """STUDIO_INSTANCE_PRICES, parsed once per value (keyed on the text, so a test that
    overrides the setting sees its own). {"cpu": 0.12, "gpu": {"node": 1.0, "gpu": 2.5}}."""
    try:
        data = json.loads(raw or "{}")
    except ValueError as exc:
        raise ValueError(f"STUDIO_INSTANCE_PRICES is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("STUDIO_INSTANCE_PRICES must be a JSON object of instance type → price")
    prices: dict[str, SettingsPrice] = {}
    for kind, value in data.items():
        if isinstance(value, dict):
            node, gpu = value.get("node", 0), value.get("gpu", 0)
        else:
            node, gpu = value, 0
        prices[str(kind)] = SettingsPrice(node=_settings_decimal(kind, node), gpu=_settings_decimal(kind, gpu))
    return prices


def _settings_decimal(kind: str, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"STUDIO_INSTANCE_PRICES[{kind!r}]: {value!r} is not a number")
    try:
        number = Decimal(str(value))
    except InvalidOperation as exc:
        raise ValueError(f"STUDIO_INSTANCE_PRICES[{kind!r}]: {value!r} is not a number") from exc
    if not number.is_finite() or number < 0:
        raise ValueError(f"STUDIO_INSTANCE_PRICES[{kind!r}]: {value!r} must be a number ≥ 0")
    return number


def settings_prices() -> dict[str, SettingsPrice]:
    return _parse_settings_prices(str(settings.STUDIO_INSTANCE_PRICES or "{}"))


def default_currency() -> str:
    return str(getattr(settings, "STUDIO_CURRENCY", "USD") or "USD")


# ISO 4217's codes that name no money a price could be in: "no currency" and the testing code.
NOT_MONEY = frozenset({"XXX", "XTS"})


def currency_error(code: str) -> str | None:
    """None when `code` (upper case) is a currency of ISO 4217's list (the iso4217 package's
    table, published yearly), else a sentence saying why not: "ZZZ" has the form, not the code."""
    from iso4217 import Currency

    if len(code) != 3 or not code.isascii() or not code.isalpha():
        return "Use a three-letter ISO 4217 code such as USD or EUR."
    try:
        Currency(code)
    except ValueError:
        return f"{code} is not an ISO 4217 currency code; use one such as USD, EUR or JPY."
    if code in NOT_MONEY:
        return f"{code} is ISO 4217's code for no currency or for testing; use one such as USD or EUR."
    return None


@dataclass(frozen=True)
class Price:
    node: Decimal  # per node-hour
    gpu: Decimal  # per GPU-hour, on top
    currency: str
    source: str  # "project", "site", "settings" or "none"

    def per_node_hour(self, gpus: int) -> Decimal:
        return (self.node + self.gpu * int(gpus or 0)).quantize(SIX_PLACES, rounding=ROUND_HALF_UP)


def price_of(project_id: int | None, instance_type: str) -> Price:
    """The price in force for the type in the project (one query)."""
    rows = {row.project_id: row for row in InstancePrice.objects.filter(
        Q(project_id=project_id) | Q(project__isnull=True), instance_type=instance_type)}
    row = rows.get(project_id) if project_id is not None else None
    if row is not None:
        return Price(row.price_per_node_hour, row.price_per_gpu_hour, row.currency, "project")
    if None in rows:
        site = rows[None]
        return Price(site.price_per_node_hour, site.price_per_gpu_hour, site.currency, "site")
    configured = settings_prices().get(instance_type)
    if configured is not None:
        return Price(configured.node, configured.gpu, default_currency(), "settings")
    return Price(ZERO, ZERO, default_currency(), "none")


def price_for(project_id: int | None, instance_type: str, gpus: int) -> tuple[Decimal, str]:
    """Per node-hour for one node of that type with `gpus` GPUs, and its currency."""
    price = price_of(project_id, instance_type)
    return price.per_node_hour(gpus), price.currency


def snapshot_prices(job: TrainingJob, nodes: Iterable[Node]) -> list[tuple[Decimal, str]]:
    """The price of each node's launch, in node order (one query for the lot)."""
    price = price_of(job.project_id, job.instance_type)
    return [(price.per_node_hour(node.gpus), price.currency) for node in nodes]


def effective_prices(project_id: int | None) -> list[dict[str, Any]]:
    """Every instance type with a price that applies in the project: its own, the site's,
    the settings' — the one that wins, with where it comes from."""
    found: dict[str, dict[str, Any]] = {}
    for kind, configured in settings_prices().items():
        found[kind] = {"instance_type": kind, "price_per_node_hour": configured.node, "price_per_gpu_hour": configured.gpu,
                       "currency": default_currency(), "source": "settings", "updated_at": None, "updated_by": None}
    rows = (InstancePrice.objects.filter(Q(project_id=project_id) | Q(project__isnull=True))
            .select_related("updated_by").order_by("project_id"))
    for row in sorted(rows, key=lambda r: r.project_id is not None):  # site first, the project's over it
        found[row.instance_type] = {
            "instance_type": row.instance_type, "price_per_node_hour": row.price_per_node_hour,
            "price_per_gpu_hour": row.price_per_gpu_hour, "currency": row.currency,
            "source": "site" if row.project_id is None else "project", "updated_at": row.updated_at,
            "updated_by": row.updated_by.username if row.updated_by else None}
    return [found[kind] for kind in sorted(found)]


def currency_conflict(project, instance_type: str, currency: str) -> str | None:
    """Why a project price in `currency` would mix currencies in the project's sums (a
    job's cost, a tuning job's, the month's spend add amounts up), else None. The
    project's currency is that of its launches so far, else of its other prices (its own
    and the site's), else STUDIO_CURRENCY."""
    launched = (JobAttempt.objects.filter(job__project=project, price_per_hour__isnull=False).exclude(currency="")
                .exclude(currency=currency).values_list("currency", flat=True).first())
    if launched:
        return (f"This project's jobs have run at prices in {launched}; a price in {currency} would add "
                f"{currency} and {launched} amounts together in its costs and spend. Use {launched}.")
    # The prices that would apply to the project's other instance types: its own where it has
    # one, else the site's, else STUDIO_INSTANCE_PRICES'. A site price for this very type does
    # not count: the project's own price replaces it.
    effective: dict[str, tuple[str, str]] = {kind: (default_currency(), "settings") for kind in settings_prices()}
    for row in (InstancePrice.objects.filter(Q(project=project) | Q(project__isnull=True))
                .order_by(F("project").asc(nulls_first=True)).values("instance_type", "currency")):
        effective[row["instance_type"]] = (row["currency"], "priced")
    effective.pop(instance_type, None)
    clashes = sorted((source, other) for other, source in effective.values() if other != currency)
    if clashes and clashes[0][0] == "priced":
        priced = clashes[0][1]
        return (f"This project's other prices (its own or the site's) are in {priced}; a price in {currency} would add "
                f"{currency} and {priced} amounts together in its costs and spend. Use {priced}.")
    if clashes:
        return (f"The site's prices (STUDIO_INSTANCE_PRICES) are in {default_currency()}; a price in {currency} would "
                f"mix currencies in this project's costs and spend. Use {default_currency()}.")
    return None


def set_project_price(*, project, instance_type: str, node: Decimal, gpu: Decimal, currency: str, user) -> InstancePrice:
    """A project admin's price for a type (created or replaced). Launches placed from now on
    snapshot it; launches already placed keep theirs."""
    row, _ = InstancePrice.objects.update_or_create(
        project=project, instance_type=instance_type,
        defaults={"price_per_node_hour": node, "price_per_gpu_hour": gpu, "currency": currency,
                  "updated_at": timezone.now(), "updated_by": user})
    return row


def remove_project_price(*, project, instance_type: str) -> bool:
    """The project's own price goes; the site's (or the settings') applies again."""
    deleted, _ = InstancePrice.objects.filter(project=project, instance_type=instance_type).delete()
    return bool(deleted)


# --- one launch's figures ------------------------------------------------------------------------
def quantize(amount: Decimal) -> Decimal:
    return amount.quantize(SIX_PLACES, rounding=ROUND_HALF_UP)


def to_cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENTS, rounding=ROUND_HALF_UP)


def _seconds(value: float) -> Decimal:
    return Decimal(repr(round(float(value), 3)))


def cost_of(seconds: float, price_per_hour: Decimal | None) -> Decimal:
    """Seconds (billable + warm) at a price per node-hour, to 6 places."""
    if not price_per_hour:
        return quantize(ZERO)
    return quantize(_seconds(seconds) * Decimal(price_per_hour) / Decimal(3600))


def _between(start: datetime | None, end: datetime | None) -> float:
    if start is None or end is None:
        return 0.0
    return round(max(0.0, (end - start).total_seconds()), 3)


def launch_seconds(started_at: datetime, training_started_at: datetime | None, end: datetime) -> tuple[float, float]:
    """(billable, training) seconds of one launch ending at `end`."""
    billable = _between(started_at, end)
    training = _between(max(training_started_at, started_at), end) if training_started_at else 0.0
    return billable, min(training, billable)


def settle_launches(job_id: int, attempt: int | None = None) -> int:
    """Fix the billable and training seconds and the cost of the job's ended launch rows
    that have none yet (of one attempt, or all). Compare-and-set on billable_seconds null:
    two callers settle a row once. Returns how many rows it settled."""
    rows = JobAttempt.objects.filter(job_id=job_id, finished_at__isnull=False, billable_seconds__isnull=True)
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    settled = 0
    for row in rows.only("pk", "started_at", "finished_at", "training_started_at", "warm_seconds", "price_per_hour"):
        assert row.finished_at is not None
        billable, training = launch_seconds(row.started_at, row.training_started_at, row.finished_at)
        settled += JobAttempt.objects.filter(pk=row.pk, billable_seconds__isnull=True).update(
            billable_seconds=billable, training_seconds=training,
            cost=cost_of(billable + (row.warm_seconds or 0), row.price_per_hour))
    return settled


def mark_training(job_id: int, attempt: int, at: datetime) -> int:
    """The attempt's rows start training now (the job turned Training in it)."""
    return JobAttempt.objects.filter(job_id=job_id, attempt=attempt, training_started_at__isnull=True).update(
        training_started_at=at)


@dataclass(frozen=True)
class WarmNode:
    node_id: int
    from_job_id: int | None
    warm_until: datetime | None


def warm_nodes(queryset) -> list[WarmNode]:
    return [WarmNode(pk, job, until) for pk, job, until in queryset.values_list("pk", "warm_from_job_id", "warm_until")]


def end_warm(nodes: Iterable[WarmNode | Node], at: datetime | None = None) -> int:
    """Each node's warm-pool time ends now (taken by the pool's next job, expired, left):
    the launch of its previous job on it gets warm_seconds = its end → min(now, warm_until),
    and its cost again. Once per launch (warm_seconds is still 0). Returns how many rows."""
    at = at or timezone.now()
    changed = 0
    for node in nodes:
        from_job = node.warm_from_job_id if isinstance(node, Node) else node.from_job_id
        node_id = node.pk if isinstance(node, Node) else node.node_id
        if from_job is None:
            continue
        settle_launches(from_job)
        row = (JobAttempt.objects.filter(job_id=from_job, node_id=node_id, finished_at__isnull=False)
               .order_by("-attempt", "-finished_at").only("pk", "finished_at", "billable_seconds", "price_per_hour").first())
        if row is None:
            continue
        end = min(at, node.warm_until) if node.warm_until else at
        warm = _between(row.finished_at, end)
        changed += JobAttempt.objects.filter(pk=row.pk, warm_seconds=0).update(
            warm_seconds=warm, cost=cost_of((row.billable_seconds or 0) + warm, row.price_per_hour))
    return changed


# --- a job's figures -----------------------------------------------------------------------------
@dataclass
class AttemptFigures:
    attempt: int
    nodes: int = 0
    billable_seconds: float = 0.0
    training_seconds: float = 0.0
    warm_seconds: float = 0.0
    cost: Decimal = ZERO
    price_per_hour: Decimal | None = None  # of node rank 0 (all nodes of a type cost the same unless GPUs differ)
    currency: str = ""
    running: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "nodes": self.nodes, "billable_seconds": round(self.billable_seconds, 3),
                "training_seconds": round(self.training_seconds, 3), "warm_seconds": round(self.warm_seconds, 3),
                "price_per_hour": str(self.price_per_hour) if self.price_per_hour is not None else None,
                "currency": self.currency, "cost": str(quantize(self.cost)), "running": self.running}


ATTEMPT_FIELDS = ("job_id", "attempt", "node_rank", "node_id", "started_at", "finished_at", "training_started_at",
                  "billable_seconds", "training_seconds", "warm_seconds", "price_per_hour", "currency", "cost")


def job_costs(jobs: Iterable[TrainingJob], *, now: datetime | None = None, projected: bool = True) -> dict[int, dict]:
    """{job id: job_cost figures} for many jobs in at most three queries (launch rows, warm
    nodes, and the furthest series of the running ones), plus, for each running job whose
    length is known, two for its projection (its epoch series, its newest points)."""
    now = now or timezone.now()
    jobs = list(jobs)
    by_id = {job.pk: job for job in jobs}
    if not by_id:
        return {}
    rows: dict[int, list[dict]] = {pk: [] for pk in by_id}
    for row in JobAttempt.objects.filter(job_id__in=list(by_id)).order_by("attempt", "node_rank").values(*ATTEMPT_FIELDS):
        rows[row["job_id"]].append(row)
    # Nodes held warm now for a job: their time so far counts, live.
    warm_now: dict[tuple[int, int], datetime | None] = {}
    if any(job.keep_alive_seconds for job in jobs):
        for node_id, job_id, until in Node.objects.filter(state=NodeState.WARM, warm_from_job_id__in=list(by_id)).values_list(
                "pk", "warm_from_job_id", "warm_until"):
            warm_now[(job_id, node_id)] = until
    running = [job.pk for job in jobs if not job.is_finished() and job.training_started_at]
    series = _furthest_series(running) if projected and running else {}
    result = {}
    for pk, job in by_id.items():
        result[pk] = _figures(job, rows[pk], warm_now, series.get(pk), now, projected=projected)
    return result


def job_cost(job: TrainingJob, *, now: datetime | None = None) -> dict[str, Any]:
    """training_time_seconds, billable_time_seconds, warm_pool_seconds (each summed over
    attempts and node rows), cost (6 places) and cost_display (cents), currency,
    projected_cost (running jobs whose length is known, else None) and attempts."""
    return job_costs([job], now=now)[job.pk]


def _figures(job: TrainingJob, rows: list[dict], warm_now: dict, series: tuple[str, int] | None, now: datetime, *,
             projected: bool) -> dict[str, Any]:
    attempts: dict[int, AttemptFigures] = {}
    currencies: dict[int, set[str]] = {}  # per attempt
    current_price_per_second = ZERO
    gang_ends = _gang_ends(rows)
    for row in rows:
        figures = attempts.setdefault(row["attempt"], AttemptFigures(attempt=row["attempt"]))
        ended = row["finished_at"] is not None
        if ended and row["billable_seconds"] is not None:
            billable, training = row["billable_seconds"], row["training_seconds"] or 0.0
        else:
            # Running (live), or ended but not settled yet; a launch of a finished job that
            # never closed (its agent never ran) ends with the job.
            end = row["finished_at"] or _open_launch_end(row, job.attempt, job.finished_at if job.is_finished() else None,
                                                         gang_ends, now)
            billable, training = launch_seconds(row["started_at"], row["training_started_at"], end)
            figures.running = figures.running or not ended
        warm = row["warm_seconds"] or 0.0
        if ended and not warm and (row["job_id"], row["node_id"]) in warm_now and row["attempt"] == job.attempt:
            until = warm_now[(row["job_id"], row["node_id"])]
            warm = _between(row["finished_at"], min(now, until) if until else now)
        price = row["price_per_hour"]
        if ended and row["cost"] is not None and warm == (row["warm_seconds"] or 0.0):
            cost = Decimal(row["cost"])
        else:
            cost = cost_of(billable + warm, price)
        if not ended and price:
            current_price_per_second += Decimal(price) / Decimal(3600)
        figures.nodes += 1
        figures.billable_seconds += billable
        figures.training_seconds += training
        figures.warm_seconds += warm
        figures.cost += cost
        if figures.price_per_hour is None:
            figures.price_per_hour = Decimal(price) if price is not None else None
        if row["currency"]:
            currencies.setdefault(row["attempt"], set()).add(row["currency"])
    for number, figures in attempts.items():
        figures.currency = _label(currencies.get(number, set()))
    ordered = [attempts[number] for number in sorted(attempts)]
    total = quantize(sum((a.cost for a in ordered), ZERO))
    currency = _label(set().union(*currencies.values())) or default_currency()
    projection = None
    if projected and not job.is_finished() and ordered and series is not None:
        attempt_started = min((row["started_at"] for row in rows if row["attempt"] == job.attempt), default=None)
        projection = _projected_cost(job, series, attempt_started, total, current_price_per_second, now)
    return {
        "training_time_seconds": round(sum(a.training_seconds for a in ordered), 3),
        "billable_time_seconds": round(sum(a.billable_seconds for a in ordered), 3),
        "warm_pool_seconds": round(sum(a.warm_seconds for a in ordered), 3),
        "cost": str(total),
        "cost_display": str(to_cents(total)),
        "currency": currency,
        "projected_cost": str(projection) if projection is not None else None,
        "attempts": [a.as_dict() for a in ordered],
    }


def _label(currencies: set[str]) -> str:
    """The currency of a sum: "USD"; or, where launches were priced in several (the site's
    currency changed under old jobs: prices refuse a second one), "EUR+USD", so a mixed sum
    is never passed off as one currency's."""
    return "+".join(sorted(currencies))


def _gang_ends(rows: list[dict]) -> dict[tuple[int, int], datetime]:
    """{(job, attempt): the latest end among its launches that ended}."""
    ends: dict[tuple[int, int], datetime] = {}
    for row in rows:
        if row["finished_at"] is not None:
            key = (row["job_id"], row["attempt"])
            ends[key] = max(ends.get(key, row["finished_at"]), row["finished_at"])
    return ends


def _open_launch_end(row: dict, job_attempt: int, job_finished_at: datetime | None, gang_ends: dict,
                     now: datetime) -> datetime:
    """When a launch that was never closed stops counting: now while its attempt is the
    job's running one; else (a node that vanished and was never swept, an agent that never
    ran) when the rest of its gang ended, or the job did."""
    if row["attempt"] == job_attempt and job_finished_at is None:
        return now
    return gang_ends.get((row["job_id"], row["attempt"])) or job_finished_at or now


def _furthest_series(job_ids: list[int]) -> dict[int, tuple[str, int]]:
    """{job id: (name, rank) of the series that reached the latest step}, the one with the
    most points among those that did (a loss logged each step, not an epoch counter); one
    query over the M4 chunks."""
    furthest: dict[int, tuple[int, int, str, int]] = {}
    for job_id, name, rank, step, count in (
            MetricChunk.objects.filter(job_id__in=job_ids).values("job_id", "name", "rank")
            .annotate(step=Max("last_step"), points=Sum("count")).values_list("job_id", "name", "rank", "step", "points")):
        if step is not None and (job_id not in furthest or (step, count or 0) > furthest[job_id][:2]):
            furthest[job_id] = (int(step), int(count or 0), name, rank)
    return {job_id: (name, rank) for job_id, (_, _, name, rank) in furthest.items()}


@dataclass(frozen=True)
class StepRate:
    """Where a run is and how fast it goes, from the points themselves: the newest step,
    the time it was logged, and steps per second over the newest points of the attempt."""

    step: int
    at: datetime
    per_second: float


def step_rate(job_id: int, name: str, rank: int, since: datetime | None) -> StepRate | None:
    """The step rate of one series over its newest RATE_POINTS points logged since the
    attempt started (a resumed attempt's rate never spans the downtime before it). Each
    point's own time, not the studio's clock: the setup before the first step (imports,
    data loading) and the flusher's lag behind the run do not count as training slowly.
    None with fewer than two points in the attempt."""
    points = list(MetricPoint.objects.filter(job_id=job_id, name=name, rank=rank).order_by("-step")
                  .values_list("step", "time")[:RATE_POINTS])
    if since is not None:
        floor = since.timestamp() - CLOCK_SKEW_SECONDS
        kept = []
        for step, at in points:  # newest first; stop at the first point of an earlier attempt
            if at.timestamp() < floor:
                break
            kept.append((step, at))
        points = kept
    if len(points) < 2:
        return None
    (last_step, last_at), (first_step, first_at) = points[0], points[-1]
    seconds = (last_at - first_at).total_seconds()
    if last_step <= first_step or seconds <= 0:
        return None
    return StepRate(step=int(last_step), at=last_at, per_second=(last_step - first_step) / seconds)


def _planned(job: TrainingJob, names: tuple[str, ...]) -> float | None:
    hyperparameters = job.hyperparameters or {}
    for name in names:
        try:
            number = float(hyperparameters.get(name))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and number > 0:  # max_steps 0 means "no limit"
            return number
    return None


def planned_steps(job: TrainingJob) -> float | None:
    """How many steps the run takes: max_steps, or epochs × the steps of an epoch (its
    "epoch" series says how many steps one took), whichever ends it first. None when the
    run does not say its length (or has not finished an epoch yet)."""
    totals = []
    if (steps := _planned(job, STEP_HYPERPARAMETERS)) is not None:
        totals.append(steps)
    if (epochs := _planned(job, EPOCH_HYPERPARAMETERS)) is not None:
        latest_epoch = (MetricChunk.objects.filter(job_id=job.pk, name=EPOCH_METRIC).order_by("-last_step")
                        .values_list("last_step", "last_value").first())
        if latest_epoch is not None and math.isfinite(latest_epoch[1]) and latest_epoch[1] > 0:
            totals.append(epochs * latest_epoch[0] / latest_epoch[1])
    return min(totals) if totals else None


def _projected_cost(job: TrainingJob, series: tuple[str, int], attempt_started: datetime | None, cost_so_far: Decimal,
                    price_per_second: Decimal, now: datetime) -> Decimal | None:
    """What the job will have cost when it reaches its planned length at its current step
    rate: the cost so far, plus the time its remaining steps take at that rate — less the
    time since its newest point was logged, already in the cost so far — at the running
    launches' prices. None while it cannot say its length or has no rate yet.

    The rate is the run's own (StepRate): a rate over the training time so far counted the
    setup before step 1 and the flusher's lag as training, and read a run several times
    too dear early on — and a budget rule then stopped a job that would end under it."""
    total = planned_steps(job)
    if total is None:
        return None
    rate = step_rate(job.pk, series[0], series[1], attempt_started)
    if rate is None:
        return None
    remaining = max(0.0, (total - rate.step) / rate.per_second - max(0.0, (now - rate.at).total_seconds()))
    return quantize(cost_so_far + _seconds(remaining) * price_per_second)


# --- a project's month, a tuning job ---------------------------------------------------------------
def month_bounds(month: str) -> tuple[datetime, datetime]:
    """"YYYY-MM" → [first instant, first instant of the next month) in UTC; ValueError otherwise."""
    if (len(month) != 7 or month[4] != "-" or not month.isascii()  # "１２".isdigit() holds too
            or not (month[:4].isdigit() and month[5:].isdigit())):
        raise ValueError("Use YYYY-MM, e.g. 2026-12.")
    year, number = int(month[:4]), int(month[5:])
    if not 1 <= number <= 12 or year < 1970 or year > 9998:
        raise ValueError("Use YYYY-MM with a month 01-12 and a year from 1970 to 9998.")
    start = datetime(year, number, 1, tzinfo=UTC)
    end = datetime(year + (number == 12), number % 12 + 1, 1, tzinfo=UTC)
    return start, end


def current_month(now: datetime | None = None) -> str:
    now = (now or timezone.now()).astimezone(UTC)
    return f"{now.year:04d}-{now.month:02d}"


def _empty_bucket(key: str, value: str) -> dict[str, Any]:
    return {key: value, "jobs": set(), "launches": 0, "billable_seconds": 0.0, "training_seconds": 0.0,
            "warm_seconds": 0.0, "cost": ZERO}


def project_spend(project, month: str, *, now: datetime | None = None) -> dict[str, Any]:
    """The project's spend in a calendar month (UTC): every launch that started in it, by
    instance type and by the user who submitted the job (cost, billable, training and warm
    seconds, node-hours)."""
    now = now or timezone.now()
    start, end = month_bounds(month)
    by_type: dict[str, dict[str, Any]] = {}
    by_user: dict[str, dict[str, Any]] = {}
    total = _empty_bucket("month", month)
    currencies: set[str] = set()
    for row, (billable, training, warm, cost) in _month_rows(project, start, end, now):
        kind, user = _instance_type(row), _user(row)
        for bucket in (by_type.setdefault(kind, _empty_bucket("instance_type", kind)),
                       by_user.setdefault(user, _empty_bucket("user", user)), total):
            bucket["jobs"].add(row["job_id"])
            bucket["launches"] += 1
            bucket["billable_seconds"] += billable
            bucket["training_seconds"] += training
            bucket["warm_seconds"] += warm
            bucket["cost"] += cost
        if row["currency"]:
            currencies.add(row["currency"])

    def shown(bucket: dict[str, Any]) -> dict[str, Any]:
        cost = quantize(bucket["cost"])
        return {**bucket, "jobs": len(bucket["jobs"]), "billable_seconds": round(bucket["billable_seconds"], 3),
                "training_seconds": round(bucket["training_seconds"], 3), "warm_seconds": round(bucket["warm_seconds"], 3),
                "node_hours": round((bucket["billable_seconds"] + bucket["warm_seconds"]) / 3600, 4),
                "cost": str(cost), "cost_display": str(to_cents(cost))}

    ordered = lambda buckets: sorted((shown(b) for b in buckets.values()), key=lambda b: (-Decimal(b["cost"]), str(b)))  # noqa: E731
    return {"month": month, "start": start, "end": end, "currency": _label(currencies) or default_currency(),
            "total": {k: v for k, v in shown(total).items() if k != "month"},
            "by_instance_type": ordered(by_type), "by_user": ordered(by_user)}


def _month_rows(project, start: datetime, end: datetime, now: datetime) -> list[tuple[dict, tuple]]:
    """Every launch (a node's part of an attempt) of the project that started in [start,
    end), with its (billable, training, warm seconds, cost) as of `now`: two queries."""
    rows = list(JobAttempt.objects.filter(job__project=project, started_at__gte=start, started_at__lt=end)
                .order_by("started_at", "job_id", "attempt", "node_rank")
                .values(*ATTEMPT_FIELDS, "job__name", "job__resources", "job__created_by__username", "job__status",
                        "job__finished_at", "job__attempt"))
    warm_now = {(job_id, node_id): until for node_id, job_id, until in Node.objects.filter(
        state=NodeState.WARM, warm_from_job__project=project).values_list("pk", "warm_from_job_id", "warm_until")}
    gang_ends = _gang_ends(rows)
    return [(row, _row_figures(row, warm_now, now, gang_ends)) for row in rows]


def _instance_type(row: dict) -> str:
    return str((row["job__resources"] or {}).get("instance_type", "cpu"))


def _user(row: dict) -> str:
    return row["job__created_by__username"] or "(deleted user)"


LAUNCH_COLUMNS = ("job_id", "job_name", "user", "instance_type", "attempt", "node_rank", "started_at", "finished_at",
                  "billable_seconds", "training_seconds", "warm_seconds", "price_per_hour", "currency", "cost")


def month_launches(project, month: str, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """The line items under project_spend: one per launch that started in the month, in
    LAUNCH_COLUMNS (a running one's figures up to now, finished_at null). Their costs add up
    to the month's total before its rounding."""
    now = now or timezone.now()
    start, end = month_bounds(month)
    return [{"job_id": row["job_id"], "job_name": row["job__name"], "user": _user(row), "instance_type": _instance_type(row),
             "attempt": row["attempt"], "node_rank": row["node_rank"], "started_at": row["started_at"],
             "finished_at": row["finished_at"], "billable_seconds": round(billable, 3),
             "training_seconds": round(training, 3), "warm_seconds": round(warm, 3),
             "price_per_hour": row["price_per_hour"], "currency": row["currency"] or default_currency(),
             "cost": str(quantize(cost))}
            for row, (billable, training, warm, cost) in _month_rows(project, start, end, now)]


def _row_figures(row: dict, warm_now: dict, now: datetime, gang_ends: dict) -> tuple[float, float, float, Decimal]:
    finished = row["job__status"] in ("Completed", "Stopped", "Failed")
    if row["finished_at"] is not None and row["billable_seconds"] is not None:
        billable, training = row["billable_seconds"], row["training_seconds"] or 0.0
    else:
        end = row["finished_at"] or _open_launch_end(row, row["job__attempt"], row["job__finished_at"] if finished else None,
                                                     gang_ends, now)
        billable, training = launch_seconds(row["started_at"], row["training_started_at"], end)
    warm = row["warm_seconds"] or 0.0
    key = (row["job_id"], row["node_id"])
    if row["finished_at"] is not None and not warm and key in warm_now and row["job__attempt"] == row["attempt"]:
        until = warm_now[key]
        warm = _between(row["finished_at"], min(now, until) if until else now)
    if row["cost"] is not None and warm == (row["warm_seconds"] or 0.0) and row["billable_seconds"] is not None:
        return billable, training, warm, Decimal(row["cost"])
    return billable, training, warm, cost_of(billable + warm, row["price_per_hour"])


def tuning_cost(tuning_job, *, now: datetime | None = None) -> dict[str, Any]:
    """The sum over a tuning job's trials (each summed over its attempts and nodes)."""
    return sum_costs(TrainingJob.objects.filter(tuning_job=tuning_job), now=now)


def sum_costs(jobs: Iterable[TrainingJob], *, now: datetime | None = None) -> dict[str, Any]:
    """The figures of many jobs added up (a tuning job's trials)."""
    trials = list(jobs)
    figures = list(job_costs(trials, now=now, projected=False).values())
    total = quantize(sum((Decimal(f["cost"]) for f in figures), ZERO))
    currency = _label({part for f in figures if f["attempts"] for part in f["currency"].split("+")}) or default_currency()
    return {
        "trials": len(trials),
        "training_time_seconds": round(sum(f["training_time_seconds"] for f in figures), 3),
        "billable_time_seconds": round(sum(f["billable_time_seconds"] for f in figures), 3),
        "warm_pool_seconds": round(sum(f["warm_pool_seconds"] for f in figures), 3),
        "cost": str(total), "cost_display": str(to_cents(total)), "currency": currency,
    }


def duration_words(seconds: float) -> str:
    """1 h 02 min, 3 min 05 s, 12.3 s — for the pages."""
    seconds = max(0.0, float(seconds or 0))
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s"

