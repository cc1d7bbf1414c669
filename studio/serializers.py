from __future__ import annotations

from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework import serializers

from studio.models import ApiToken, Membership, Project, Role, slug_validator


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)

    def validate_expires_at(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("Must be in the future.")
        return value


class TokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "key_id", "created_at", "expires_at", "last_used_at"]


class ProjectSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Project
        fields = ["slug", "name", "description", "created_at", "role"]

    def get_role(self, project: Project) -> str | None:
        roles = self.context.get("roles", {})
        return roles.get(project.pk)


class ProjectCreateSerializer(serializers.Serializer):
    slug = serializers.CharField(max_length=63, validators=[slug_validator])
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True)

    def validate_slug(self, value: str) -> str:
        if Project.objects.filter(slug=value).exists():
            raise serializers.ValidationError(f"A project with slug '{value}' already exists.")
        return value


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)

    def validate_username(self, value: str):
        user = get_user_model().objects.filter(username=value).first()
        if user is None:
            raise serializers.ValidationError(f"No user '{value}'.")
        return user


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
