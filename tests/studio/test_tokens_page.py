from __future__ import annotations

from rest_framework.test import APIClient

from studio.models import ApiToken, hash_token


def test_token_created_on_the_page_is_shown_once_and_works(client, owner):
    client.force_login(owner)
    response = client.post("/account/tokens/", {"name": "notebook", "expires_in_days": "30"})
    assert response.status_code == 200
    raw = response.context["new_token"]
    assert raw in response.content.decode()
    token = ApiToken.objects.get(name="notebook")
    assert token.secret_hash == hash_token(raw) and token.expires_at is not None
    assert APIClient().get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    listing = client.get("/account/tokens/").content.decode()
    assert "notebook" in listing and raw not in listing


def test_revoke_from_the_page(client, owner, teammate):
    mine, raw = ApiToken.issue(owner, name="old")
    theirs, _ = ApiToken.issue(teammate, name="theirs")
    client.force_login(owner)
    assert client.post(f"/account/tokens/{theirs.pk}/revoke/").status_code == 404
    assert client.post(f"/account/tokens/{mine.pk}/revoke/").status_code == 302
    assert not ApiToken.objects.filter(pk=mine.pk).exists()
    assert ApiToken.objects.filter(pk=theirs.pk).exists()
    assert APIClient().get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


def test_token_name_is_required_and_escaped(client, owner):
    client.force_login(owner)
    assert "This field is required" in client.post("/account/tokens/", {"name": ""}).content.decode()
    client.post("/account/tokens/", {"name": "<b>x</b>"})
    html = client.get("/account/tokens/").content.decode()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


def test_reviewer_can_manage_tokens(client, reviewer):
    client.force_login(reviewer)
    assert client.get("/account/tokens/").status_code == 200
