"""Cost endpoints: a project's instance prices (readers list them, admins set them) and a
project's spend in a month, by instance type and by user (jobs.cost).

A price set here applies to launches placed from then on: each launch snapshots the price
in force when it is placed, so a finished job's cost never changes when a price does."""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import cost
from studio.access import get_project_for_user
from studio.api import ApiError, KnownFieldsOnly, PaginatedAPIView, paginate

INSTANCE_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PRICE_HELP = "≥ 0 and at most {max}, up to 6 decimal places."


# --- serializers ----------------------------------------------------------------------------------
# Named SourceEnum in the schema (studio.settings ENUM_NAME_OVERRIDES), beside a log page's source.
PRICE_SOURCES = ["project", "site", "settings"]

class _PriceField(serializers.DecimalField):
    """A price: one that is too large is told the maximum ("Ensure this value is less than or
    equal to 100000."), not how many digits the column holds."""

    def validate_precision(self, value):
        if self.max_value is not None and value > self.max_value:
            self.fail("max_value", max_value=self.max_value)
        return super().validate_precision(value)


def price_field(help_text: str, **kwargs) -> serializers.DecimalField:
    return _PriceField(max_digits=14, decimal_places=6, min_value=cost.ZERO, max_value=cost.MAX_PRICE,
                       help_text=f"{help_text} {PRICE_HELP.format(max=cost.MAX_PRICE)}", **kwargs)


class InstancePriceSerializer(serializers.Serializer):
    """The price that applies to an instance type in the project, and where it comes from."""

    instance_type = serializers.CharField()
    price_per_node_hour = serializers.DecimalField(max_digits=20, decimal_places=6)
    price_per_gpu_hour = serializers.DecimalField(max_digits=20, decimal_places=6,
                                                  help_text="On top of the node price, per GPU of the node.")
    currency = serializers.CharField()
    source = serializers.ChoiceField(choices=PRICE_SOURCES, help_text=(
        "project: this project's own (an admin set it); site: the site's (admin site, project empty); settings: "
        "STUDIO_INSTANCE_PRICES."))
    updated_at = serializers.DateTimeField(allow_null=True)
    updated_by = serializers.CharField(allow_null=True)


class InstancePriceSetSerializer(KnownFieldsOnly):
    price_per_node_hour = price_field("Per node-hour.")
    price_per_gpu_hour = price_field("Per GPU-hour, on top of the node price.", required=False, default=cost.ZERO)
    currency = serializers.CharField(required=False, max_length=3, help_text="ISO 4217, e.g. USD; default STUDIO_CURRENCY.")

    def validate_currency(self, value: str) -> str:
        value = value.strip().upper()
        problem = cost.currency_error(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class SpendBucketSerializer(serializers.Serializer):
    jobs = serializers.IntegerField()
    launches = serializers.IntegerField(help_text="Node launches (an attempt on n nodes counts n).")
    billable_seconds = serializers.FloatField()
    training_seconds = serializers.FloatField()
    warm_seconds = serializers.FloatField()
    node_hours = serializers.FloatField(help_text="(billable + warm seconds) / 3600.")
    cost = serializers.DecimalField(max_digits=20, decimal_places=6)
    cost_display = serializers.DecimalField(max_digits=20, decimal_places=2)


class SpendByTypeSerializer(SpendBucketSerializer):
    instance_type = serializers.CharField()


class SpendByUserSerializer(SpendBucketSerializer):
    user = serializers.CharField(help_text="Who submitted the jobs.")


class SpendSerializer(serializers.Serializer):
    month = serializers.CharField(help_text="YYYY-MM (UTC).")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(help_text="Exclusive.")
    currency = serializers.CharField()
    total = SpendBucketSerializer()
    by_instance_type = SpendByTypeSerializer(many=True)
    by_user = SpendByUserSerializer(many=True)


class LaunchCostSerializer(serializers.Serializer):
    """One launch (a node's part of one attempt of a job): the spend's line item."""

    job_id = serializers.IntegerField()
    job_name = serializers.CharField()
    user = serializers.CharField(help_text="Who submitted the job.")
    instance_type = serializers.CharField()
    attempt = serializers.IntegerField()
    node_rank = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True, help_text="null: still running (its figures up to now).")
    billable_seconds = serializers.FloatField()
    training_seconds = serializers.FloatField()
    warm_seconds = serializers.FloatField()
    price_per_hour = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True, help_text=(
        "Snapshotted when the launch was placed: the node's price plus its GPUs' (null: no price then, cost 0)."))
    currency = serializers.CharField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=6)


# --- views ----------------------------------------------------------------------------------------
def month_param(request: Request) -> str:
    month = (request.query_params.get("month") or "").strip() or cost.current_month()
    try:
        cost.month_bounds(month)
    except ValueError as exc:
        raise ApiError(f"month: {exc}", fields={"month": [str(exc)]}) from None
    return month


def instance_type_param(instance_type: str) -> str:
    if not INSTANCE_TYPE.match(instance_type):
        message = "Letters, digits, '.', '_' or '-', at most 64, starting with a letter or digit."
        raise ApiError(f"instance_type: {message}", fields={"instance_type": [message]})
    return instance_type


class ProjectSpendView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("month", str, description="YYYY-MM (UTC); the current month when left out.")],
        responses=SpendSerializer,
        description="The project's spend in a calendar month (UTC): every launch that started in it, at the price it "
                    "snapshotted, by instance type and by the user who submitted the job. Readers.")
    def get(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug)
        month = month_param(request)
        return Response(SpendSerializer(cost.project_spend(project, month)).data)


class ProjectSpendLaunchesView(PaginatedAPIView):
    @extend_schema(
        parameters=[OpenApiParameter("month", str, description="YYYY-MM (UTC); the current month when left out.")],
        responses=LaunchCostSerializer(many=True),
        description="The line items of the month's spend, oldest first: one per launch that started in it, with its "
                    "seconds, the price it snapshotted and its cost (they add up to the spend's total). The Spend "
                    "page downloads the same as CSV. Readers.")
    def get(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug)
        launches = cost.month_launches(project, month_param(request))
        return paginate(self, request, launches, lambda page: LaunchCostSerializer(page, many=True).data)


class InstancePriceListView(PaginatedAPIView):
    @extend_schema(responses=InstancePriceSerializer(many=True),
                   description="The price of every instance type that has one in this project: its own, else the "
                               "site's, else STUDIO_INSTANCE_PRICES. Readers.")
    def get(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug)
        prices = cost.effective_prices(project.pk)
        return paginate(self, request, prices, lambda page: InstancePriceSerializer(page, many=True).data)


class InstancePriceDetailView(APIView):
    @extend_schema(responses=InstancePriceSerializer,
                   description="The price in force for the type (0 with source \"settings\" when none is set).")
    def get(self, request: Request, slug: str, instance_type: str) -> Response:
        project = get_project_for_user(request.user, slug)
        kind = instance_type_param(instance_type)
        found = next((p for p in cost.effective_prices(project.pk) if p["instance_type"] == kind), None)
        if found is None:
            raise ApiError(f"No price for instance type {kind!r} in this project or the site.", code="not_found",
                           status_code=404)
        return Response(InstancePriceSerializer(found).data)

    @extend_schema(request=InstancePriceSetSerializer, responses=InstancePriceSerializer,
                   description="Set the project's own price for the type (project admins). Launches placed from now "
                               "on use it; jobs already placed keep the price they snapshotted.")
    def put(self, request: Request, slug: str, instance_type: str) -> Response:
        project = get_project_for_user(request.user, slug, admin=True)
        kind = instance_type_param(instance_type)
        serializer = InstancePriceSetSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        currency = data.get("currency") or cost.default_currency()
        if (conflict := cost.currency_conflict(project, kind, currency)) is not None:
            raise serializers.ValidationError({"currency": [conflict]})
        cost.set_project_price(project=project, instance_type=kind, node=data["price_per_node_hour"],
                               gpu=data.get("price_per_gpu_hour") or cost.ZERO,
                               currency=currency, user=request.user)
        found = next(p for p in cost.effective_prices(project.pk) if p["instance_type"] == kind)
        return Response(InstancePriceSerializer(found).data)

    @extend_schema(responses={204: OpenApiResponse(description="The project's own price is gone; the site's (or the "
                                                               "settings') applies again.")},
                   description="Remove the project's own price for the type (project admins).")
    def delete(self, request: Request, slug: str, instance_type: str) -> Response:
        project = get_project_for_user(request.user, slug, admin=True)
        kind = instance_type_param(instance_type)
        if not cost.remove_project_price(project=project, instance_type=kind):
            raise ApiError(f"The project has no price of its own for {kind!r}.", code="not_found", status_code=404)
        return Response(status=status.HTTP_204_NO_CONTENT)
