"""`studio adduser` and `studio token`: the shell's way to add people and automation."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from studio import actions
from studio.models import Membership, Project, Role
from tests.factories import make_member


def run(*args: str) -> str:
    out = StringIO()
    call_command("studio", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_adduser_creates_the_user_the_project_and_the_membership():
    output = run("adduser", "bob", "--password", "pw-bob-12345", "--project", "vision", "--role", "scientist")

    project = Project.objects.get(slug="vision")
    bob = get_user_model().objects.get(username="bob")
    assert bob.check_password("pw-bob-12345")
    assert Membership.objects.get(project=project, user=bob).role == Role.SCIENTIST
    assert "new project" in output


@pytest.mark.django_db
def test_adduser_changes_the_role_of_an_existing_member_and_keeps_the_password():
    run("adduser", "bob", "--password", "pw-bob-12345", "--project", "vision", "--role", "scientist")

    output = run("adduser", "bob", "--project", "vision", "--role", "reviewer")

    bob = get_user_model().objects.get(username="bob")
    assert bob.check_password("pw-bob-12345")
    assert Membership.objects.get(user=bob).role == Role.REVIEWER
    assert "Updated" in output and "new project" not in output


@pytest.mark.django_db
def test_adduser_without_password_prints_a_generated_one_once():
    output = run("adduser", "carol", "--project", "vision", "--role", "viewer")

    password = output.split("shown only this once): ")[1].strip()
    assert get_user_model().objects.get(username="carol").check_password(password)
    assert output.count(password) == 1


@pytest.mark.django_db
def test_adduser_refuses_an_unknown_role():
    with pytest.raises(CommandError, match="invalid choice: 'boss'"):
        run("adduser", "bob", "--password", "pw-bob-12345", "--project", "vision", "--role", "boss")
    assert not get_user_model().objects.filter(username="bob").exists()
    assert not Project.objects.filter(slug="vision").exists()


@pytest.mark.django_db
def test_adduser_refuses_a_bad_slug_and_a_short_password():
    with pytest.raises(CommandError, match="Bad project slug"):
        run("adduser", "bob", "--password", "pw-bob-12345", "--project", "Not A Slug", "--role", "viewer")
    with pytest.raises(CommandError, match="Password refused"):
        run("adduser", "bob", "--password", "short", "--project", "vision", "--role", "viewer")
    assert not get_user_model().objects.filter(username="bob").exists()


@pytest.mark.django_db
def test_token_prints_only_a_token_that_the_api_accepts():
    project = actions.create_project(slug="vision")
    user = make_member(project, "bot", Role.SCIENTIST, password="pw-bot-12345")

    output = run("token", "bot", "--name", "ci")

    assert output.endswith("\n") and output.count("\n") == 1
    token = output.strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.get("/api/v1/projects/")
    assert response.status_code == 200, response.content
    assert [p["slug"] for p in response.json()["results"]] == ["vision"]
    assert user.api_tokens.get().name == "ci"
    assert APIClient().get("/api/v1/projects/").status_code == 401


@pytest.mark.django_db
def test_token_for_an_unknown_user_says_how_to_create_one():
    with pytest.raises(CommandError, match="studio adduser ghost"):
        run("token", "ghost")
