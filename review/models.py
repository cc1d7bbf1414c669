"""Human review after Amazon Augmented AI (docs/SPEC.md §5): who reviews (WorkTeam), when and how
items are sent to people (FlowDefinition), each item (HumanLoop) and each reviewer's hold
on one of its slots (Assignment).

Slot accounting lives on the loop as counters changed only inside a transaction that
holds the loop's row lock (or by compare-and-set updates):

    answers_needed = task_count (+1 per tie escalation, at most +2)
    open_slots     = answers_needed - answers_count - holds_count

A claim takes a loop with open_slots > 0 (PostgreSQL: FOR UPDATE SKIP LOCKED), inserts a
held Assignment and moves one slot from open to held; an answer moves it from held to
answered; a release or an expired lease moves it back to open. The unique constraint
"one live assignment per reviewer per loop" makes "a reviewer never gets a loop they
already answered or hold" a database invariant, not a hope.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from studio.models import Project


class TaskType(models.TextChoices):
    CLASSIFICATION = "classification"
    FREE_TEXT = "free_text"


class LoopOrder(models.TextChoices):
    OLDEST = "oldest"
    LEAST_CONFIDENT = "least_confident"


class LoopStatus(models.TextChoices):
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    EXPIRED = "Expired"
    STOPPED = "Stopped"
    FAILED = "Failed"


FINISHED_LOOP_STATUSES = frozenset({LoopStatus.COMPLETED, LoopStatus.EXPIRED, LoopStatus.STOPPED, LoopStatus.FAILED})


class AssignmentStatus(models.TextChoices):
    HELD = "held"  # claimed, lease running
    ANSWERED = "answered"
    RELEASED = "released"  # the reviewer skipped it (S); they will not be offered it again
    EXPIRED = "expired"  # the lease ran out, or the loop ended while it was held


# A reviewer's assignment that blocks them from being offered the loop again.
LIVE_ASSIGNMENT_STATUSES = (AssignmentStatus.HELD, AssignmentStatus.ANSWERED, AssignmentStatus.RELEASED)


class WorkTeamQuerySet(models.QuerySet["WorkTeam"]):
    def of_member(self, user: User) -> WorkTeamQuerySet:
        return self.filter(members=user)


class WorkTeam(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="work_teams")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="work_teams", blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[WorkTeamQuerySet] = WorkTeamQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="work_team_name_unique_in_project")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"


class FlowDefinitionQuerySet(models.QuerySet["FlowDefinition"]):
    def reviewable_by(self, user: User) -> FlowDefinitionQuerySet:
        """The flows whose items this user may claim: those of their work teams."""
        return self.filter(work_team__members=user)


class FlowDefinition(models.Model):
    """When to ask people and how. `activation` is {"confidence_below": float | None,
    "sample_percent": float (0–100), "combine": "any" | "all"}; `labels` lists the
    classification choices in the order keys 1–9 pick them."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="flow_definitions")
    name = models.CharField(max_length=200)
    work_team = models.ForeignKey(WorkTeam, on_delete=models.PROTECT, related_name="flow_definitions")
    task_type = models.CharField(max_length=16, choices=TaskType.choices, default=TaskType.CLASSIFICATION)
    labels = models.JSONField(default=list, blank=True)
    title = models.CharField(max_length=300)
    instructions = models.TextField(blank=True, help_text="Markdown, as written.")
    instructions_html = models.TextField(blank=True, help_text="Rendered and sanitised; what pages show.")
    task_count = models.PositiveIntegerField(default=1)
    task_availability_seconds = models.PositiveIntegerField(default=7 * 24 * 3600)
    task_time_limit_seconds = models.PositiveIntegerField(default=300)
    activation = models.JSONField(default=dict, blank=True)
    # Where activation.confidence_below came from when an evaluation set it (docs/SPEC.md §9):
    # {"evaluation", "model_version", "temperature", "calibrated", "target_error", "delta", "choice",
    # "threshold", "expected": {coverage, risk, risk_upper, workload}, "set_at", "set_by"}; {} when set by hand.
    calibration = models.JSONField(default=dict, blank=True)
    order = models.CharField(max_length=16, choices=LoopOrder.choices, default=LoopOrder.OLDEST)
    show_prediction = models.BooleanField(default=True, help_text="Show reviewers the model's label and confidence.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[FlowDefinitionQuerySet] = FlowDefinitionQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="flow_name_unique_in_project")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"


class HumanLoopQuerySet(models.QuerySet["HumanLoop"]):
    def in_progress(self) -> HumanLoopQuerySet:
        return self.filter(status=LoopStatus.IN_PROGRESS)

    def claimable_by(self, user: User, now: datetime) -> HumanLoopQuerySet:
        """Loops with an open slot, still available at `now`, that the user holds, answered
        or skipped nothing of: what a claim may give them (SQLite's claim path) and what the
        inbox counts as available. PostgreSQL's claim says the same in review.sql."""
        mine = Assignment.objects.filter(loop=OuterRef("pk"), worker=user).live()
        return (self.filter(status=LoopStatus.IN_PROGRESS, open_slots__gt=0, expires_at__gt=now)
                .filter(~Exists(mine)))

    def in_claim_order(self, order: str) -> HumanLoopQuerySet:
        """The flow's order (least confident first, unknown confidence last; or oldest),
        as the partial indexes loop_claim_oldest / loop_claim_least_confident hold them."""
        if order == LoopOrder.LEAST_CONFIDENT:
            return self.order_by(F("confidence").asc(nulls_last=True), "id")
        return self.order_by("created_at", "id")

    def past_availability(self, now: datetime) -> HumanLoopQuerySet:
        """InProgress loops whose task_availability_seconds ran out, oldest first."""
        return self.filter(status=LoopStatus.IN_PROGRESS, expires_at__lte=now).order_by("expires_at")

    def output_missing(self, completed_before: datetime) -> HumanLoopQuerySet:
        """Completed loops whose output JSON is not written yet, oldest first."""
        return (self.filter(status=LoopStatus.COMPLETED, output_uri="", completed_at__lte=completed_before)
                .order_by("completed_at"))


class HumanLoop(models.Model):
    """One item sent to people (A2I's StartHumanLoop). Names are unique across the studio
    because the API addresses a loop by name alone (GET /api/v1/human-loops/<name>/)."""

    name = models.CharField(max_length=128, unique=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="human_loops")
    flow_definition = models.ForeignKey(FlowDefinition, on_delete=models.CASCADE, related_name="human_loops")
    status = models.CharField(max_length=16, choices=LoopStatus.choices, default=LoopStatus.IN_PROGRESS)
    failure_reason = models.TextField(blank=True)
    # What reviewers see: {"text": ...} | {"row": {...}} | {"image": "<base64>", "media_type": ...}
    # or any JSON object a client sent to StartHumanLoop.
    input_content = models.JSONField(default=dict)
    # The model's answer when a prediction started the loop: {"label", "confidence", "probabilities"}.
    prediction = models.JSONField(null=True, blank=True)
    # Copy of prediction["confidence"] for least_confident ordering (null sorts last).
    confidence = models.FloatField(null=True, blank=True)
    # Why it started: "confidence_below" | "sampled" | "api".
    activation_reason = models.CharField(max_length=32, blank=True)
    source = models.JSONField(default=dict, blank=True)  # {"endpoint": name, "model_version": id, "batch": id, "record": n}
    model_version = models.ForeignKey("hosting.ModelVersion", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="human_loops")
    answers_needed = models.PositiveIntegerField()
    answers_count = models.PositiveIntegerField(default=0)
    holds_count = models.PositiveIntegerField(default=0)
    open_slots = models.PositiveIntegerField()
    escalations = models.PositiveIntegerField(default=0)
    consolidated_label = models.CharField(max_length=300, blank=True)  # a label, or consolidation.NO_CONSENSUS
    agreement = models.FloatField(null=True, blank=True)  # share of answers that gave the consolidated label
    output_uri = models.CharField(max_length=1024, blank=True)  # the A2I-shaped output JSON, once written
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[HumanLoopQuerySet] = HumanLoopQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # claim_next_slot, order "oldest": the first open loop of the reviewer's flows.
            models.Index(fields=["flow_definition", "created_at", "id"], name="loop_claim_oldest",
                         condition=Q(status=LoopStatus.IN_PROGRESS, open_slots__gt=0)),
            # claim_next_slot, order "least_confident".
            models.Index(fields=["flow_definition", "confidence", "id"], name="loop_claim_least_confident",
                         condition=Q(status=LoopStatus.IN_PROGRESS, open_slots__gt=0)),
            # expire_loops: InProgress loops past their availability.
            models.Index(fields=["expires_at"], name="loop_expiry", condition=Q(status=LoopStatus.IN_PROGRESS)),
            # lists and stats per flow and status.
            models.Index(fields=["flow_definition", "status", "-created_at"], name="loop_flow_status"),
        ]

    def __str__(self) -> str:
        return self.name

    def is_finished(self) -> bool:
        return self.status in FINISHED_LOOP_STATUSES

    def needs_answers(self) -> bool:
        return self.status == LoopStatus.IN_PROGRESS and self.answers_count < self.answers_needed


class AssignmentQuerySet(models.QuerySet["Assignment"]):
    def live(self) -> AssignmentQuerySet:
        """Held, answered or released: a reviewer with one is not offered the loop again."""
        return self.filter(status__in=LIVE_ASSIGNMENT_STATUSES)

    def answered(self) -> AssignmentQuerySet:
        return self.filter(status=AssignmentStatus.ANSWERED)

    def held(self) -> AssignmentQuerySet:
        return self.filter(status=AssignmentStatus.HELD)


class Assignment(models.Model):
    """One reviewer's hold on one slot of a loop, and their answer."""

    loop = models.ForeignKey(HumanLoop, on_delete=models.CASCADE, related_name="assignments")
    worker = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="review_assignments")
    status = models.CharField(max_length=16, choices=AssignmentStatus.choices, default=AssignmentStatus.HELD)
    claimed_at = models.DateTimeField(default=timezone.now)
    lease_expires_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)  # released or expired
    answer = models.JSONField(null=True, blank=True)  # {"label": ...} or {"text": ...}
    time_spent_seconds = models.FloatField(null=True, blank=True)

    objects: ClassVar[AssignmentQuerySet] = AssignmentQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["claimed_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["loop", "worker"], name="one_live_assignment_per_reviewer",
                                    condition=Q(status__in=list(LIVE_ASSIGNMENT_STATUSES))),
        ]
        indexes = [
            # expire_leases: held assignments past their lease.
            models.Index(fields=["lease_expires_at"], name="assignment_lease", condition=Q(status=AssignmentStatus.HELD)),
            # stats: answers per reviewer over time.
            models.Index(fields=["worker", "answered_at"], name="assignment_worker_answered"),
        ]

    def __str__(self) -> str:
        return f"{self.loop.name} by {self.worker_id} ({self.status})"

    def lease_expired(self, now=None) -> bool:
        return self.status == AssignmentStatus.HELD and self.lease_expires_at <= (now or timezone.now())
