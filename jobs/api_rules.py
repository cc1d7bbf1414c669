"""Rules on a job and their alarms (docs/SPEC.md §10):

    GET/POST/PATCH /api/v1/jobs/<id>/rules/           list, add one, change one (by "name" or "id")
    GET/PATCH/DELETE /api/v1/jobs/<id>/rules/<rule>/  one rule
    GET /api/v1/jobs/<id>/alarm-transitions/          every state change of the job's rules
    GET /api/v1/alarms/?project=&state=ALARM          what is firing across the projects you read
                                                      (running jobs; ?finished=true adds finished ones)

A rule with bad parameters is a 400 naming the field (`parameters.window`); a finished
job's rules no longer change (409)."""

from __future__ import annotations

from django.db import IntegrityError
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import get_job_for_user
from jobs.models import FINISHED_STATUSES, AlarmTransition, JobRule, RuleState, TrainingJob
from jobs.rules.engine import RuleError
from jobs.rules.store import RuleConflict, add_rule, delete_rule, update_rule
from jobs.serializers import (
    AlarmTransitionSerializer,
    RuleChangeSerializer,
    RulePatchSerializer,
    RuleSerializer,
    RuleSpecSerializer,
)
from studio.access import get_project_for_user
from studio.api import ApiError, PaginatedAPIView, id_param, paginate
from studio.models import Project


class RuleJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    project = serializers.CharField()


class AlarmSerializer(RuleSerializer):
    """A rule with its job (the Alarms list across jobs)."""

    job = serializers.SerializerMethodField()

    class Meta(RuleSerializer.Meta):
        fields = [*RuleSerializer.Meta.fields, "job"]
        read_only_fields = fields

    @extend_schema_field(RuleJobSerializer)
    def get_job(self, rule: JobRule) -> dict:
        return {"id": rule.job_id, "name": rule.job.name, "status": rule.job.status, "project": rule.job.project.slug}


def rule_error(exc: RuleError) -> ApiError:
    return ApiError(f"{exc.field}: {exc.message}", fields={exc.field: [exc.message]})


def conflict(message: str) -> ApiError:
    return ApiError(message, code="conflict", status_code=409)


def _body(request: Request) -> dict:
    if not isinstance(request.data, dict):
        raise ApiError("The body must be a JSON object (one rule).", fields={"body": ["Expected an object."]})
    return dict(request.data)


class JobRuleListView(PaginatedAPIView):
    @extend_schema(responses=RuleSerializer(many=True), summary="The job's rules with their states")
    def get(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk)
        return paginate(self, request, JobRule.objects.filter(job=job).order_by("pk"),
                        lambda page: RuleSerializer(page, many=True).data)

    @extend_schema(request=RuleSpecSerializer, responses={201: RuleSerializer}, summary="Add a rule to a pending or running job")
    def post(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk, write=True)
        try:
            rule = add_rule(job.pk, _body(request), job_finished=job.is_finished(), project_id=job.project_id)
        except RuleError as exc:
            raise rule_error(exc) from exc
        except RuleConflict as exc:
            raise conflict(str(exc)) from exc
        except IntegrityError as exc:  # two adds of one name at once
            raise conflict("The job already has a rule of that name.") from exc
        return Response(RuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=RuleChangeSerializer, responses=RuleSerializer, operation_id="v1_jobs_rules_update_by_name",
                   summary='Change one rule, named by "name" (or "id") in the body')
    def patch(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk, write=True)
        body = _body(request)
        rules = JobRule.objects.filter(job=job)
        if body.get("id") is not None:
            rule_id = body.pop("id")
            if type(rule_id) is not int:
                raise ApiError("id: Must be an integer id.", fields={"id": ["Must be an integer id."]})
            rule = rules.filter(pk=rule_id).first()
            if "new_name" in body:  # the schema offers it beside id too: the same rename as "name"
                if "name" in body and body["name"] != body["new_name"]:
                    raise ApiError('new_name: give the new name once, as "name" or as "new_name".',
                                   fields={"new_name": ["Two different new names."]})
                body["name"] = body.pop("new_name")
        elif isinstance(body.get("name"), str):
            rule = rules.filter(name=body.pop("name")).first()
            if "new_name" in body:
                body["name"] = body.pop("new_name")
        else:
            raise ApiError('name: say which rule to change ("name", or "id").', fields={"name": ["This field is required."]})
        if rule is None:
            raise ApiError("The job has no such rule.", code="not_found", status_code=404)
        renamed_by = "new_name" if "new_name" in request.data else "name"
        return Response(RuleSerializer(_update(rule, body, job, name_field=renamed_by)).data)


def _update(rule: JobRule, body: dict, job: TrainingJob, *, name_field: str = "name") -> JobRule:
    try:
        return update_rule(rule, body, job_finished=job.is_finished(), project_id=job.project_id, name_field=name_field)
    except RuleError as exc:
        raise rule_error(exc) from exc
    except RuleConflict as exc:
        raise conflict(str(exc)) from exc
    except IntegrityError as exc:
        raise conflict("The job already has a rule of that name.") from exc


class JobRuleDetailView(APIView):
    def _rule(self, request: Request, pk: int, rule_id: int, *, write: bool = False) -> tuple[JobRule, TrainingJob]:
        job = get_job_for_user(request.user, pk, write=write)
        rule = JobRule.objects.filter(job=job, pk=rule_id).first()
        if rule is None:
            raise ApiError("The job has no such rule.", code="not_found", status_code=404)
        return rule, job

    @extend_schema(responses=RuleSerializer)
    def get(self, request: Request, pk: int, rule_id: int) -> Response:
        rule, _ = self._rule(request, pk, rule_id)
        return Response(RuleSerializer(rule).data)

    @extend_schema(request=RulePatchSerializer, responses=RuleSerializer)
    def patch(self, request: Request, pk: int, rule_id: int) -> Response:
        rule, job = self._rule(request, pk, rule_id, write=True)
        return Response(RuleSerializer(_update(rule, _body(request), job)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int, rule_id: int) -> Response:
        rule, job = self._rule(request, pk, rule_id, write=True)
        try:
            delete_rule(rule, job_finished=job.is_finished())
        except RuleConflict as exc:
            raise conflict(str(exc)) from exc
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobAlarmTransitionsView(PaginatedAPIView):
    @extend_schema(responses=AlarmTransitionSerializer(many=True),
                   parameters=[OpenApiParameter("rule", int, description="Only this rule's transitions")],
                   summary="Every state change of the job's rules, oldest first")
    def get(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk)
        rows = AlarmTransition.objects.filter(job=job).select_related("rule").order_by("at", "pk")
        if (rule_id := id_param(request.query_params, "rule")) is not None:
            rows = rows.filter(rule_id=rule_id)
        return paginate(self, request, rows, lambda page: AlarmTransitionSerializer(page, many=True).data)


class AlarmListView(PaginatedAPIView):
    @extend_schema(
        parameters=[OpenApiParameter("project", str), OpenApiParameter("state", str, enum=RuleState.values,
                                                                         description="Default ALARM (what is firing)"),
                    OpenApiParameter("job", int),
                    OpenApiParameter("finished", bool, description="Include finished jobs' rules (default: running "
                                     "and pending jobs only — a stopped job's alarm is history, not something firing)")],
        responses=AlarmSerializer(many=True), summary="Rules in a state across the projects you can read (default: firing)")
    def get(self, request: Request) -> Response:
        params = request.query_params
        state = params.get("state") or RuleState.ALARM
        if state not in RuleState.values:
            raise ApiError(f"state: use one of {', '.join(RuleState.values)}.", fields={"state": ["Unknown state."]})
        rules = JobRule.objects.filter(job__project__in=Project.objects.readable_by(request.user), state=state, enabled=True)
        if slug := params.get("project"):
            rules = rules.filter(job__project=get_project_for_user(request.user, slug))
        if (job_id := id_param(params, "job")) is not None:
            rules = rules.filter(job_id=job_id)
        finished = params.get("finished", "false").lower()
        if finished not in ("true", "false", "1", "0"):
            raise ApiError("finished: use true or false.", fields={"finished": ["Must be true or false."]})
        if finished in ("false", "0") and job_id is None:
            rules = rules.exclude(job__status__in=FINISHED_STATUSES)
        rules = rules.select_related("job", "job__project").order_by("-state_changed_at", "-pk")
        return paginate(self, request, rules, lambda page: AlarmSerializer(page, many=True).data)
