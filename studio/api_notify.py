"""A project's notification channels (studio.notify) in the API. Project readers list them
(name, kind, enabled); admins also see where they send, and change them.

    GET/POST         /api/v1/projects/<slug>/notification-channels/
    GET/PATCH/DELETE /api/v1/projects/<slug>/notification-channels/<id>/
    POST             /api/v1/projects/<slug>/notification-channels/<id>/test/
    POST             /api/v1/projects/<slug>/notification-channels/<id>/rotate-secret/
    GET              /api/v1/projects/<slug>/notification-channels/<id>/deliveries/
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from studio import notify
from studio.access import get_project_for_user, role_allows, signed_in
from studio.api import MAX_ID, KnownFieldsOnly, PaginatedAPIView, paginate
from studio.models import Delivery, NotificationChannel, Project
from studio.validators import clean_name


# --- request bodies -------------------------------------------------------------------------
class _ChannelFields(KnownFieldsOnly):
    name = serializers.CharField(max_length=100, help_text="Unique in the project, 1–100 characters.")
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True,
                                help_text="Webhooks: the http(s) URL deliveries are POSTed to.")
    emails = serializers.ListField(child=serializers.CharField(max_length=254), required=False,
                                   max_length=notify.MAX_EMAILS, help_text="E-mail channels: the addresses.")
    enabled = serializers.BooleanField(required=False, default=True)

    def validate_name(self, value: str) -> str:
        return clean_name(value)

    def validate_url(self, value: str) -> str:
        value = value.strip()
        if value and (problem := notify.webhook_url_problem(value)):
            raise serializers.ValidationError(problem)
        return value

    def validate_emails(self, value: list[str]) -> list[str]:
        addresses: list[str] = []
        for address in (item.strip() for item in value):
            if problem := notify.email_problem(address):
                raise serializers.ValidationError(problem)
            if address not in addresses:
                addresses.append(address)
        return addresses


class NotificationChannelCreateSerializer(_ChannelFields):
    kind = serializers.ChoiceField(choices=NotificationChannel.Kind.choices)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The other kind's field is refused, not dropped (a PATCH refuses it too): a webhook
        # given addresses would never mail them.
        if attrs["kind"] == NotificationChannel.Kind.WEBHOOK and attrs.get("emails"):
            raise serializers.ValidationError({"emails": ["A webhook channel sends to its url; leave emails out (or "
                                                          "make an e-mail channel)."]})
        if attrs["kind"] == NotificationChannel.Kind.EMAIL and attrs.get("url"):
            raise serializers.ValidationError({"url": ["An e-mail channel sends to its emails; leave url out (or make "
                                                       "a webhook channel)."]})
        if attrs["kind"] == NotificationChannel.Kind.WEBHOOK and not attrs.get("url"):
            raise serializers.ValidationError({"url": ["A webhook needs a URL."]})
        if attrs["kind"] == NotificationChannel.Kind.EMAIL and not attrs.get("emails"):
            raise serializers.ValidationError({"emails": ["An e-mail channel needs at least one address."]})
        return attrs


class NotificationChannelUpdateSerializer(_ChannelFields):
    """Any of name, url (webhooks), emails (e-mail channels), enabled; the kind is fixed."""

    name = serializers.CharField(max_length=100, required=False)
    enabled = serializers.BooleanField(required=False)


# --- answers ----------------------------------------------------------------------------------
class NotificationChannelSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    kind = serializers.ChoiceField(choices=NotificationChannel.Kind.choices, read_only=True)
    enabled = serializers.BooleanField(read_only=True)
    has_secret = serializers.SerializerMethodField(help_text="A webhook's signing secret is set (it is never shown "
                                                             "again after creation; rotate it to get a new one).")
    created_at = serializers.DateTimeField(read_only=True)
    url = serializers.CharField(required=False, help_text="Project admins only.")
    emails = serializers.ListField(child=serializers.CharField(), required=False, help_text="Project admins only.")

    def get_has_secret(self, channel: NotificationChannel) -> bool:
        return bool(channel.secret)

    def to_representation(self, instance: NotificationChannel) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not self.context.get("admin"):
            data.pop("url", None)
            data.pop("emails", None)
        return data


STANDARD_SECRET_HELP = ("The same secret as Standard Webhooks libraries take it (Webhook(\"whsec_…\").verify(body, "
                        "headers) checks webhook-id, webhook-timestamp and webhook-signature); shown this once.")


class NotificationChannelCreatedSerializer(NotificationChannelSerializer):
    secret = serializers.CharField(read_only=True, allow_null=True, help_text=(
        "The webhook's signing secret, shown this once (null for e-mail channels). Receivers verify "
        "X-Trainyard-Signature: t=<unix time>,v1=<hex HMAC-SHA256(secret, '<t>.' + raw body)>."))
    standard_webhooks_secret = serializers.CharField(read_only=True, allow_null=True, help_text=STANDARD_SECRET_HELP)


class NotificationSecretSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    secret = serializers.CharField(read_only=True, help_text="The new signing secret, shown this once.")
    standard_webhooks_secret = serializers.CharField(read_only=True, help_text=STANDARD_SECRET_HELP)


class NotificationDeliverySerializer(serializers.ModelSerializer):
    channel = serializers.IntegerField(source="channel_id", read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "channel", "event", "status", "attempts", "last_error", "response_status", "next_attempt_at",
                  "created_at", "delivered_at"]
        read_only_fields = fields


# --- access -----------------------------------------------------------------------------------
def _channel(request: Request, slug: str, pk: int, *, admin: bool = False) -> tuple[Project, NotificationChannel]:
    project = get_project_for_user(request.user, slug, admin=admin)
    channel = NotificationChannel.objects.filter(project=project, pk=pk).first() if pk <= MAX_ID else None
    if channel is None:
        raise Http404(f"No notification channel {pk} in project '{slug}'.")
    return project, channel


def _is_admin(request: Request, project: Project) -> bool:
    return role_allows(project.role_of(request.user), admin=True)


def _created(channel: NotificationChannel, secret: str) -> dict[str, Any]:
    return {**NotificationChannelSerializer(channel, context={"admin": True}).data, "secret": secret or None,
            "standard_webhooks_secret": notify.standard_webhooks_secret(secret) if secret else None}


ADMIN_ONLY = "Project admins only; other members get a 403."


class ChannelListView(PaginatedAPIView):
    @extend_schema(operation_id="notification_channels_list", responses=NotificationChannelSerializer(many=True),
                   description="The project's channels: any project member who can read it; url and emails "
                               "for admins only.")
    def get(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug)
        admin = _is_admin(request, project)
        channels = NotificationChannel.objects.filter(project=project).order_by("name")
        return paginate(self, request, channels,
                        lambda page: NotificationChannelSerializer(page, many=True, context={"admin": admin}).data)

    @extend_schema(operation_id="notification_channels_create", request=NotificationChannelCreateSerializer,
                   responses={201: NotificationChannelCreatedSerializer}, description=f"Add a channel. {ADMIN_ONLY} A webhook's "
                   "signing secret is in this answer only.")
    def post(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug, admin=True)
        serializer = NotificationChannelCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        channel, secret = notify.create_channel(project=project, user=signed_in(request.user), **serializer.validated_data)
        return Response(_created(channel, secret), status=status.HTTP_201_CREATED)


class ChannelDetailView(APIView):
    @extend_schema(operation_id="notification_channels_retrieve", responses=NotificationChannelSerializer)
    def get(self, request: Request, slug: str, pk: int) -> Response:
        project, channel = _channel(request, slug, pk)
        return Response(NotificationChannelSerializer(channel, context={"admin": _is_admin(request, project)}).data)

    @extend_schema(operation_id="notification_channels_update", request=NotificationChannelUpdateSerializer,
                   responses=NotificationChannelSerializer, description=f"Rename, re-point, enable or disable. {ADMIN_ONLY}")
    def patch(self, request: Request, slug: str, pk: int) -> Response:
        _, channel = _channel(request, slug, pk, admin=True)
        serializer = NotificationChannelUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        if isinstance(request.data, dict) and request.data.get("kind", channel.kind) != channel.kind:
            raise serializers.ValidationError({"kind": ["A channel's kind cannot change; add a new channel."]})
        wrong = "emails" if channel.kind == NotificationChannel.Kind.WEBHOOK else "url"
        if wrong in changes:
            raise serializers.ValidationError({wrong: [
                "A webhook channel sends to its url; leave emails out (or make an e-mail channel)."
                if wrong == "emails" else
                "An e-mail channel sends to its emails; leave url out (or make a webhook channel)."]})
        notify.update_channel(channel, changes)
        return Response(NotificationChannelSerializer(channel, context={"admin": True}).data)

    @extend_schema(operation_id="notification_channels_destroy", request=None,
                   responses={204: OpenApiResponse(description="Deleted, with its deliveries.")},
                   description=ADMIN_ONLY)
    def delete(self, request: Request, slug: str, pk: int) -> Response:
        _, channel = _channel(request, slug, pk, admin=True)
        notify.delete_channel(channel)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ChannelTestView(APIView):
    @extend_schema(operation_id="notification_channels_test", request=None, responses={201: NotificationDeliverySerializer},
                   description=f"Send a delivery of event \"test\" (also to a disabled channel). {ADMIN_ONLY} It is "
                               "sent in the background: read it back from the deliveries list.")
    def post(self, request: Request, slug: str, pk: int) -> Response:
        _, channel = _channel(request, slug, pk, admin=True)
        delivery = notify.send_test(channel, signed_in(request.user))
        return Response(NotificationDeliverySerializer(delivery).data, status=status.HTTP_201_CREATED)


class ChannelRotateSecretView(APIView):
    @extend_schema(operation_id="notification_channels_rotate_secret", request=None, responses=NotificationSecretSerializer,
                   description=f"A new signing secret, shown this once; the old one stops at once. {ADMIN_ONLY} "
                               "An e-mail channel has none (409).")
    def post(self, request: Request, slug: str, pk: int) -> Response:
        _, channel = _channel(request, slug, pk, admin=True)
        secret = notify.rotate_secret(channel)
        return Response({"id": channel.pk, "secret": secret, "standard_webhooks_secret": notify.standard_webhooks_secret(secret)})


class ChannelDeliveriesView(PaginatedAPIView):
    @extend_schema(operation_id="notification_channels_deliveries", responses=NotificationDeliverySerializer(many=True),
                   description=f"The channel's deliveries, newest first. {ADMIN_ONLY}")
    def get(self, request: Request, slug: str, pk: int) -> Response:
        _, channel = _channel(request, slug, pk, admin=True)
        deliveries = Delivery.objects.filter(channel=channel).order_by("-created_at", "-pk")
        return paginate(self, request, deliveries, lambda page: NotificationDeliverySerializer(page, many=True).data)
