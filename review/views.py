"""Review pages: the reviewer inbox, the flows list and a flow's page with its loops,
stats, Export and Retrain.

The inbox is the one page reviewers reach; it lists only the flows of their work teams
and does its work through the reviewer API (claim, answer, release) from
static/js/review_inbox.js. Flow pages are the project's view of the work: admins,
scientists and viewers read them; reviewers get 404 (review.api_stats.get_flow_for_reader).
Export and Retrain post here and call the same actions as the API."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from datasets.models import DatasetVersion, SourceKind
from review.actions.teams import create_flow_definition, create_work_team
from review.api_stats import get_flow_for_reader
from review.consolidation import NO_CONSENSUS
from review.export import export_flow, page_source, preview_export, retrain_confirm_text, retrain_from_export, source_uri_of
from review.forms import FLOW_FIELD_FOR, FlowForm, WorkTeamForm
from review.markdown import render_instructions
from review.models import (
    Assignment,
    AssignmentStatus,
    FlowDefinition,
    HumanLoop,
    LoopStatus,
    TaskType,
    WorkTeam,
)
from review.serializers import FlowDefinitionCreateSerializer, claim_json
from review.stats import closing_the_loop, flow_stats
from studio.access import check_role, signed_in
from studio.forms import run_or_message
from studio.models import Membership
from studio.pages import can_write_in, duration_text
from studio.views import page, project_roles, readable_projects, reviewer_only

LOOPS_SHOWN = 200
EXPORTS_SHOWN = 20


# --- the inbox --------------------------------------------------------------------------------
@dataclass(frozen=True)
class InboxFlow:
    flow: FlowDefinition
    available: int  # items this user could claim now
    held: int  # items they hold, lease running
    answered_today: int


def start_of_today(now: datetime) -> datetime:
    return timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)


def inbox_flows(user: User, now: datetime | None = None) -> list[InboxFlow]:
    """The user's work teams' flows with their counts, in three grouped queries."""
    now = now or timezone.now()
    flows = list(FlowDefinition.objects.reviewable_by(user).select_related("project", "work_team")
                 .distinct().order_by("project__slug", "title", "pk"))
    ids = [flow.pk for flow in flows]
    if not ids:
        return []
    available = dict(
        HumanLoop.objects.filter(flow_definition_id__in=ids).claimable_by(user, now)
        .values("flow_definition_id").annotate(n=Count("id")).values_list("flow_definition_id", "n"))
    by_status = (Assignment.objects.filter(worker=user, loop__flow_definition_id__in=ids)
                 .values("loop__flow_definition_id")
                 .annotate(held=Count("id", filter=Q(status=AssignmentStatus.HELD, lease_expires_at__gt=now)),
                           answered=Count("id", filter=Q(status=AssignmentStatus.ANSWERED,
                                                         answered_at__gte=start_of_today(now)))))
    mine_counts = {row["loop__flow_definition_id"]: row for row in by_status}
    return [InboxFlow(flow=flow, available=available.get(flow.pk, 0),
                      held=mine_counts.get(flow.pk, {}).get("held", 0),
                      answered_today=mine_counts.get(flow.pk, {}).get("answered", 0)) for flow in flows]


@page(reviewers=True)
def review_inbox(request: HttpRequest) -> HttpResponse:
    rows = inbox_flows(signed_in(request.user))
    return render(request, "review/inbox.html", {
        "rows": rows,
        "available_total": sum(row.available for row in rows),
        "answered_today": sum(row.answered_today for row in rows),
        "is_reader": not reviewer_only(request) and bool(project_roles(request)),
        "team_names": [] if rows else list(WorkTeam.objects.of_member(signed_in(request.user)).order_by("name")
                                          .values_list("name", flat=True)[:5]),
        "inbox": {
            "urls": {
                "claim": reverse("api-review-claim"),
                "answer": reverse("api-review-answer", args=[0]),
                "release": reverse("api-review-release", args=[0]),
                "counts": reverse("review-inbox-counts"),
                "held": reverse("review-inbox-held"),
            },
            "flows": {str(row.flow.pk): row.flow.title for row in rows},
        },
    })


@page(reviewers=True)
def review_inbox_counts(request: HttpRequest) -> JsonResponse:
    """The inbox's per-flow counts, re-read after each answer so the table stays true."""
    rows = inbox_flows(signed_in(request.user))
    response = JsonResponse({"flows": [{"id": row.flow.pk, "available": row.available, "held": row.held,
                                        "answered_today": row.answered_today} for row in rows]})
    response["Cache-Control"] = "private, no-store"
    return response


@page(reviewers=True)
def review_inbox_held(request: HttpRequest) -> HttpResponse:
    """The item this reviewer already holds (lease running), as the claim API shows it, so
    Start after a reload resumes it instead of leaving it locked until its lease runs out;
    204 when they hold none. ?flow=<id> narrows to one flow."""
    held = (Assignment.objects.filter(worker=signed_in(request.user), status=AssignmentStatus.HELD,
                                      lease_expires_at__gt=timezone.now(), loop__status=LoopStatus.IN_PROGRESS,
                                      loop__flow_definition__in=FlowDefinition.objects.reviewable_by(signed_in(request.user)))
            .select_related("loop", "loop__flow_definition").order_by("claimed_at", "pk"))
    flow = request.GET.get("flow", "")
    if flow:
        if not flow.isdigit():
            raise Http404("flow must be a flow definition id.")
        held = held.filter(loop__flow_definition_id=int(flow))
    assignment = held.first()
    if assignment is None:
        return HttpResponse(status=204)
    response = JsonResponse(claim_json(assignment))
    response["Cache-Control"] = "private, no-store"
    return response


# --- flows ----------------------------------------------------------------------------------------
def _readers_only(request: HttpRequest) -> None:
    if reviewer_only(request):
        raise Http404("Not found.")


def with_loop_counts(flows):
    """Loops per status and the open slots still wanted, counted in the list's one query."""
    return flows.annotate(
        in_progress=Count("human_loops", filter=Q(human_loops__status=LoopStatus.IN_PROGRESS)),
        completed=Count("human_loops", filter=Q(human_loops__status=LoopStatus.COMPLETED)),
        expired=Count("human_loops", filter=Q(human_loops__status=LoopStatus.EXPIRED)),
        ended_other=Count("human_loops", filter=Q(human_loops__status__in=[LoopStatus.STOPPED, LoopStatus.FAILED])),
        open_slots=Sum("human_loops__open_slots", filter=Q(human_loops__status=LoopStatus.IN_PROGRESS)),
    )


@page(reviewers=True)
def flow_list(request: HttpRequest) -> HttpResponse:
    _readers_only(request)
    projects = readable_projects(request)
    flows = list(with_loop_counts(FlowDefinition.objects.filter(project__in=projects)
                                  .select_related("project", "work_team")).order_by("project__slug", "name"))
    return render(request, "review/flow_list.html", {
        "flows": flows,
        "show_project": len(project_roles(request)) > 1,
        "can_create": any(entry.can_write for entry in project_roles(request)),
        "api_url": reverse("api-flow-definitions"),
        # The work teams, each with its Delete (review.views_delete) where the user may write.
        "teams": _teams_with_flows(projects, flows),
        "writable_project_ids": {entry.project.pk for entry in project_roles(request) if entry.can_write},
    })


def _teams_with_flows(projects, flows: list[FlowDefinition]) -> list[WorkTeam]:
    """The projects' work teams (one query), each with the flows that use it (`flows` is
    every flow of those projects, already read)."""
    teams = list(WorkTeam.objects.filter(project__in=projects).select_related("project")
                 .annotate(member_count=Count("members", distinct=True)).order_by("project__slug", "name"))
    for team in teams:
        team.flow_list = [flow for flow in flows if flow.work_team_id == team.pk]  # type: ignore[attr-defined]
    return teams


@dataclass(frozen=True)
class ExportRow:
    """A dataset version exported from the flow, with what Retrain asks before it starts."""

    version: DatasetVersion
    retrain_confirm: str


@dataclass(frozen=True)
class LoopRow:
    loop: HumanLoop
    model_label: str | None
    confidence: float | None
    answers: list[str]  # the labels (or texts) given, in order
    consolidated: str
    no_consensus: bool


def loop_rows(flow: FlowDefinition) -> tuple[list[LoopRow], int]:
    loops = list(flow.human_loops.order_by("-created_at", "-id")
                 .only("id", "name", "status", "prediction", "confidence", "answers_count", "answers_needed",
                       "consolidated_label", "agreement", "created_at", "completed_at", "activation_reason",
                       "flow_definition_id", "output_uri")[:LOOPS_SHOWN])
    answers: dict[int, list[str]] = {}
    for loop_id, answer in (Assignment.objects.filter(loop__in=loops, status=AssignmentStatus.ANSWERED)
                            .order_by("answered_at", "id").values_list("loop_id", "answer")):
        answer = answer or {}
        answers.setdefault(loop_id, []).append(str(answer.get("label", answer.get("text", ""))))
    rows = []
    for loop in loops:
        prediction = loop.prediction if isinstance(loop.prediction, dict) else {}
        label = prediction.get("label")
        rows.append(LoopRow(loop=loop, model_label=str(label) if label is not None else None,
                            confidence=loop.confidence, answers=answers.get(loop.pk, []),
                            consolidated=loop.consolidated_label, no_consensus=loop.consolidated_label == NO_CONSENSUS))
    total = len(rows) if len(rows) < LOOPS_SHOWN else flow.human_loops.count()
    return rows, total


def exported_versions(flow: FlowDefinition) -> list[DatasetVersion]:
    return list(DatasetVersion.objects.filter(source_kind=SourceKind.REVIEW, source_uri=source_uri_of(flow))
                .select_related("dataset").order_by("-created_at", "-pk")[:EXPORTS_SHOWN])


def activation_text(activation: dict) -> str:
    threshold = activation.get("confidence_below")
    sample = activation.get("sample_percent") or 0
    if not isinstance(sample, (int, float)):
        sample = 0
    parts = []
    if isinstance(threshold, (int, float)):
        parts.append(f"confidence below {threshold:g}")
    if sample:
        parts.append(f"a {sample:g} % random sample")
    if not parts:
        return "only loops started through the API"
    joiner = " and " if activation.get("combine") == "all" else " or "
    return joiner.join(parts)


@page(reviewers=True)
def flow_detail(request: HttpRequest, pk: int) -> HttpResponse:
    flow = get_flow_for_reader(request.user, pk)
    rows, total = loop_rows(flow)
    stats = flow_stats(flow)
    can_write = can_write_in(request, flow.project_id)
    exportable = (flow.human_loops.filter(status=LoopStatus.COMPLETED)
                  .exclude(consolidated_label__in=["", NO_CONSENSUS]).count())
    highlight = request.GET.get("exported", "")
    export_source = page_source(flow) if can_write and exportable and flow.task_type == TaskType.CLASSIFICATION else None
    exports = [ExportRow(version, retrain_confirm_text(version) if can_write else "") for version in exported_versions(flow)]
    return render(request, "review/flow_detail.html", {
        "flow": flow,
        "rows": rows,
        "total": total,
        "limited": total > len(rows),
        "stats": stats,
        "median_text": duration_text(stats["median_seconds_to_complete"]),
        "instructions_html": render_instructions(flow.instructions),
        "activation": activation_text(flow.activation or {}),
        "members": list(flow.work_team.members.order_by("username").values_list("username", flat=True)),
        "can_write": can_write,
        "can_export": can_write and flow.task_type == TaskType.CLASSIFICATION,
        "exportable": exportable,
        "exports": exports,
        "export_source": export_source,
        "export_base": export_source.base if export_source else None,
        "highlight": int(highlight) if highlight.isdigit() else None,
        "chart_data_url": reverse("review-flow-data", args=[flow.pk]),
        "loop_closing": closing_the_loop(flow) if flow.task_type == TaskType.CLASSIFICATION else None,
    })


@page(reviewers=True)
def loop_detail(request: HttpRequest, pk: int, name: str) -> HttpResponse:
    """One item of a flow: its input, the model's prediction, each reviewer's answer and its
    status. Readers of the flow's project only, as the flow page (reviewers get 404)."""
    flow = get_flow_for_reader(request.user, pk)
    loop = flow.human_loops.filter(name=name).first()
    if loop is None:
        raise Http404("No such item in this flow.")
    assignments = list(loop.assignments.select_related("worker").order_by("claimed_at", "pk"))
    prediction = loop.prediction if isinstance(loop.prediction, dict) else {}
    content = loop.input_content if isinstance(loop.input_content, dict) else {}
    row = content.get("row") if isinstance(content.get("row"), dict) else None
    text = content.get("text") if isinstance(content.get("text"), str) else None
    return render(request, "review/loop_detail.html", {
        "flow": flow,
        "loop": loop,
        "assignments": assignments,
        "prediction_label": prediction.get("label"),
        "input_row": [(key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))
                      for key, value in sorted(row.items())] if row is not None else None,
        "input_text": text,
        "input_json": json.dumps(loop.input_content, indent=2, ensure_ascii=False, sort_keys=True, default=str),
        "no_consensus": loop.consolidated_label == NO_CONSENSUS,
    })


@page(reviewers=True)
def flow_data(request: HttpRequest, pk: int) -> JsonResponse:
    """The flow's stats for the page's charts (the same body as the stats API)."""
    flow = get_flow_for_reader(request.user, pk)
    response = JsonResponse(flow_stats(flow))
    response["Cache-Control"] = "private, no-store"
    return response


@require_POST
@page(reviewers=True)
def flow_export(request: HttpRequest, pk: int) -> HttpResponse:
    flow = get_flow_for_reader(request.user, pk)
    check_role(request.user, flow.project, write=True)
    name = request.POST.get("dataset", "").strip() or None
    mode = request.POST.get("mode", "").strip() or None
    if request.POST.get("confirmed") != "1":
        # The page's script asks first (a dialog with the preview's sentence) and marks the post
        # confirmed; a post without it (a click before the script ran) gets the same question here.
        preview = run_or_message(request, lambda: preview_export(flow, mode, name), failed="Export failed")
        if preview is None:
            return redirect("review-flow", pk=flow.pk)
        return render(request, "review/export_confirm.html",
                      {"flow": flow, "project": flow.project, "preview": preview, "mode": mode or "", "dataset": name or ""})
    version = run_or_message(request, lambda: export_flow(flow, signed_in(request.user), name, mode), failed="Export failed")
    if version is None:
        return redirect("review-flow", pk=flow.pk)
    if getattr(version, "export_unchanged", False):
        messages.info(request, f"Nothing new: {version.dataset.name} v{version.version} already holds exactly this "
                               "export, so no version was made.")
        return redirect(reverse("review-flow", args=[flow.pk]) + f"?exported={version.pk}#exports")
    holds = (version.provenance or {}).get("summary") if isinstance(version.provenance, dict) else None
    messages.success(request, f"Exported to {version.dataset.name} v{version.version}"
                              f"{f' ({holds})' if holds else ''}; it is validated like any upload, then ready to "
                              "train on.")
    return redirect(reverse("review-flow", args=[flow.pk]) + f"?exported={version.pk}#exports")


@require_POST
@page(reviewers=True)
def flow_retrain(request: HttpRequest, pk: int, version_pk: int) -> HttpResponse:
    """Retrain on one of this flow's exports: clones the source job onto that version."""
    flow = get_flow_for_reader(request.user, pk)
    check_role(request.user, flow.project, write=True)
    version = (DatasetVersion.objects.select_related("dataset__project")
               .filter(pk=version_pk, source_kind=SourceKind.REVIEW, source_uri=source_uri_of(flow)).first())
    if version is None:
        raise Http404("No such export of this flow.")
    job = run_or_message(request, lambda: retrain_from_export(version, signed_in(request.user)), failed="Retrain failed")
    if job is None:
        return redirect(reverse("review-flow", args=[flow.pk]) + "#exports")
    messages.success(request, f"Started {job.name} on {version.dataset.name} v{version.version}.")
    return redirect("job-detail", pk=job.pk)


# --- create forms ---------------------------------------------------------------------------------
def _writable_projects(request: HttpRequest) -> list:
    projects = [entry.project for entry in project_roles(request) if entry.can_write]
    if not projects:
        raise PermissionDenied("Creating review flows and work teams needs the scientist or admin role in a project; "
                               "ask a project admin to change your role.")
    return projects


def _serializer_errors(form, errors: dict, field_for: dict[str, str]) -> None:
    for name, messages_ in errors.items():
        field = field_for.get(name, name)
        text = " ".join(str(m) for m in (messages_ if isinstance(messages_, list) else [messages_]))
        form.add_error(field if field in form.fields else None, text)


@page(reviewers=True)
def team_create(request: HttpRequest) -> HttpResponse:
    _readers_only(request)
    projects = _writable_projects(request)
    form = WorkTeamForm(request.POST or None, projects=projects,
                        initial={"project": request.GET.get("project") or projects[0].slug})
    if request.method == "POST" and form.is_valid():
        project = next(p for p in projects if p.slug == form.cleaned_data["project"])
        User = get_user_model()
        found = {user.username: user for user in User.objects.filter(username__in=form.cleaned_data["members"])}
        missing = [name for name in form.cleaned_data["members"] if name not in found]
        if missing:
            form.add_error("members", f"No user named {', '.join(missing)}.")
        else:
            team = form.run_action(lambda: create_work_team(
                project=project, name=form.cleaned_data["name"], members=list(found.values()), user=signed_in(request.user),
                description=form.cleaned_data["description"]))
            if team is not None:
                messages.success(request, f"Work team {team.name} created with {len(found)} member{'s' if len(found) != 1 else ''}.")
                return redirect(reverse("review-flow-create") + f"?team={team.pk}")
    members = {p.slug: sorted(Membership.objects.filter(project=p).values_list("user__username", flat=True))
               for p in projects}
    return render(request, "review/team_form.html", {"form": form, "members": members})


@page(reviewers=True)
def flow_create(request: HttpRequest) -> HttpResponse:
    """The flow form; its fields are checked by the API's serializer and written by the
    same action, so a flow made here obeys exactly the API's rules."""
    _readers_only(request)
    projects = _writable_projects(request)
    teams = WorkTeam.objects.filter(project__in=projects).select_related("project").order_by("project__slug", "name")
    team_param = request.GET.get("team", "")
    initial = {"work_team": int(team_param)} if team_param.isdigit() else {}
    form = FlowForm(request.POST or None, teams=teams, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.api_data()
        serializer = FlowDefinitionCreateSerializer(data=data)
        if not serializer.is_valid():
            _serializer_errors(form, serializer.errors, FLOW_FIELD_FOR)
        else:
            team = form.cleaned_data["work_team"]
            flow = form.run_action(lambda: create_flow_definition(
                project=team.project, user=signed_in(request.user), data={**serializer.validated_data, "work_team": team}))
            if flow is not None:
                messages.success(request, f"Flow {flow.name} created. Attach it to an endpoint or a batch prediction, "
                                          "or start items through the API.")
                return redirect("review-flow", pk=flow.pk)
    return render(request, "review/flow_form.html", {"form": form, "has_teams": teams.exists()})
