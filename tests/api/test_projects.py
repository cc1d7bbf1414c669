from __future__ import annotations

from studio.models import Membership


def test_project_list_shows_only_my_projects_with_role(owner, outsider, client_for):
    body = client_for(owner).get("/api/v1/projects/").json()
    assert [(p["slug"], p["role"]) for p in body["results"]] == [("acme", "admin")]


def test_create_project_makes_creator_admin(outsider, client_for):
    response = client_for(outsider).post("/api/v1/projects/", {"slug": "vision", "name": "Vision"}, format="json")
    assert response.status_code == 201
    assert Membership.objects.get(project__slug="vision", user=outsider).role == "admin"


def test_duplicate_project_slug_is_a_field_error(owner, client_for):
    response = client_for(owner).post("/api/v1/projects/", {"slug": "acme"}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "slug" in error["fields"]
    assert "already exists" in error["message"]


def test_bad_slug_is_a_field_error(owner, client_for):
    response = client_for(owner).post("/api/v1/projects/", {"slug": "Not A Slug"}, format="json")
    assert response.status_code == 400
    assert "slug" in response.json()["error"]["fields"]


def test_admin_adds_member_and_scientist_cannot(owner, teammate, outsider, client_for):
    ok = client_for(owner).post("/api/v1/projects/acme/members/", {"username": "outsider", "role": "viewer"}, format="json")
    assert ok.status_code == 201
    assert Membership.objects.get(project__slug="acme", user=outsider).role == "viewer"
    refused = client_for(teammate).post("/api/v1/projects/acme/members/", {"username": "outsider", "role": "admin"}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"


def test_outsider_gets_404_for_another_projects_members(owner, outsider, client_for):
    response = client_for(outsider).get("/api/v1/projects/acme/members/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_unknown_user_and_role_are_field_errors(owner, client_for):
    response = client_for(owner).post("/api/v1/projects/acme/members/", {"username": "ghost", "role": "boss"}, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"username", "role"}
