from __future__ import annotations

import base64
from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from studio.models import ApiToken, hash_token


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_token_created_with_basic_auth_is_shown_once_and_stored_hashed(owner):
    client = APIClient()
    response = client.post("/api/v1/tokens/", {"name": "ci"}, format="json", HTTP_AUTHORIZATION=basic("owner", "pw-owner-123"))
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) >= {"id", "name", "token", "expires_at"}
    raw = body["token"]
    stored = ApiToken.objects.get(pk=body["id"])
    assert raw not in {stored.secret_hash, stored.key_id}
    assert stored.secret_hash == hash_token(raw)
    listing = client.get("/api/v1/tokens/", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert listing["count"] == 1
    assert "token" not in listing["results"][0]
    assert raw not in str(listing)


def test_bearer_token_authenticates_and_revocation_stops_it(owner, client_for):
    client = APIClient()
    _, raw = ApiToken.issue(owner, name="laptop")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/projects/").status_code == 200
    token_id = ApiToken.objects.get(name="laptop").pk
    assert client.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    response = client.get("/api/v1/projects/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_expired_token_is_refused(owner):
    _, raw = ApiToken.issue(owner, name="old", expires_at=timezone.now() - timedelta(seconds=1))
    response = APIClient().get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 401
    assert "expired" in response.json()["error"]["message"]


def test_expiry_in_the_past_is_a_field_error(owner, client_for):
    response = client_for(owner).post("/api/v1/tokens/", {"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, format="json")
    assert response.status_code == 400
    assert "expires_at" in response.json()["error"]["fields"]


def test_tampered_token_is_refused(owner):
    _, raw = ApiToken.issue(owner, name="t")
    forged = raw[:-4] + ("aaaa" if not raw.endswith("aaaa") else "bbbb")
    assert APIClient().get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Bearer {forged}").status_code == 401


def test_user_cannot_revoke_someone_elses_token(owner, teammate, client_for):
    token, _ = ApiToken.issue(owner, name="mine")
    response = client_for(teammate).delete(f"/api/v1/tokens/{token.pk}/")
    assert response.status_code == 404
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_anonymous_request_gets_401_envelope(db):
    response = APIClient().get("/api/v1/datasets/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
