"""API endpoints of the studio itself: tokens, projects and members."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import BasicAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from studio import actions
from studio.access import get_project_for_user
from studio.api import PaginatedAPIView, paginate
from studio.authentication import BearerTokenAuthentication, CsrfSessionAuthentication
from studio.models import ApiToken, Membership, Project
from studio.serializers import (
    MemberSerializer,
    MembershipSerializer,
    ProjectCreateSerializer,
    ProjectSerializer,
    TokenCreateSerializer,
    TokenSerializer,
)


class TokenListView(PaginatedAPIView):
    # HTTP Basic is accepted here only, so automation can trade a password for a token.
    authentication_classes = [BearerTokenAuthentication, CsrfSessionAuthentication, BasicAuthentication]

    @extend_schema(responses=TokenSerializer(many=True))
    def get(self, request: Request) -> Response:
        tokens = ApiToken.objects.filter(user=request.user)
        return paginate(self, request, tokens, lambda page: TokenSerializer(page, many=True).data)

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenSerializer})
    def post(self, request: Request) -> Response:
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, raw = actions.issue_token(request.user, **serializer.validated_data)
        body = {"id": token.pk, "name": token.name, "token": raw, "expires_at": token.expires_at, "key_id": token.key_id,
                "created_at": token.created_at}
        return Response(body, status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    authentication_classes = [BearerTokenAuthentication, CsrfSessionAuthentication, BasicAuthentication]

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        token = get_object_or_404(ApiToken, pk=pk, user=request.user)
        actions.revoke_token(token)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProjectListView(PaginatedAPIView):
    @extend_schema(responses=ProjectSerializer(many=True))
    def get(self, request: Request) -> Response:
        projects = Project.objects.visible_to(request.user)
        roles = dict(Membership.objects.filter(user=request.user).values_list("project_id", "role"))
        if request.user.is_superuser:
            roles = {pk: roles.get(pk, "admin") for pk in projects.values_list("pk", flat=True)}
        return paginate(self, request, projects, lambda page: ProjectSerializer(page, many=True, context={"roles": roles}).data)

    @extend_schema(request=ProjectCreateSerializer, responses={201: ProjectSerializer})
    def post(self, request: Request) -> Response:
        serializer = ProjectCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = actions.create_project(owner=request.user, **serializer.validated_data)
        return Response(ProjectSerializer(project, context={"roles": {project.pk: "admin"}}).data, status=status.HTTP_201_CREATED)


class ProjectMembersView(PaginatedAPIView):
    @extend_schema(responses=MembershipSerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug)
        members = project.memberships.select_related("user").order_by("user__username")
        return paginate(self, request, members, lambda page: MembershipSerializer(page, many=True).data)

    @extend_schema(request=MemberSerializer, responses={201: MembershipSerializer})
    def post(self, request: Request, slug: str) -> Response:
        project = get_project_for_user(request.user, slug, admin=True)
        serializer = MemberSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = actions.set_membership(project=project, user=serializer.validated_data["username"],
                                            role=serializer.validated_data["role"])
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)
