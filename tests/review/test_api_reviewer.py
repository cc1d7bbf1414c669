"""The reviewer API (claim/answer/release) with the payloads the inbox page relies on."""

from __future__ import annotations

import pytest

from review.models import HumanLoop, LoopStatus


@pytest.mark.django_db
def test_claim_answer_release_payloads(make_flow, make_loops, reviewer, client_for):
    flow = make_flow(instructions="Look <script>alert(1)</script> **closely**")
    first, second = make_loops(flow, 2)
    client = client_for(reviewer)
    claimed = client.post("/api/v1/review/claim/", {}, format="json")
    assert claimed.status_code == 200, claimed.content
    body = claimed.json()
    assert set(body) == {"assignment", "human_loop", "flow_definition", "input_content", "labels", "instructions",
                         "prediction", "lease_expires_at", "task_time_limit_seconds", "claimed_at"}
    assert body["human_loop"] == first.name
    assert body["flow_definition"] == {"id": flow.pk, "name": flow.name, "title": flow.title,
                                       "task_type": "classification"}
    assert body["labels"] == ["cat", "dog", "bird"]
    assert "<script" not in body["instructions"] and "<strong>closely</strong>" in body["instructions"]
    assert body["prediction"]["confidence"] == 0.5
    assert body["input_content"] == first.input_content and isinstance(body["input_content"], dict)
    answered = client.post(f"/api/v1/review/assignments/{body['assignment']}/answer/", {"answer": {"label": "cat"}},
                           format="json")
    assert answered.status_code == 200, answered.content
    assert answered.json() == {"assignment": body["assignment"], "status": "answered", "human_loop": first.name,
                               "loop_status": "Completed"}
    again = client.post("/api/v1/review/claim/", {"flow_definition": flow.pk}, format="json")
    assert again.json()["human_loop"] == second.name
    released = client.post(f"/api/v1/review/assignments/{again.json()['assignment']}/release/")
    assert released.status_code == 200
    assert released.json()["status"] == "released"
    assert client.post("/api/v1/review/claim/", {}, format="json").status_code == 204
    assert HumanLoop.objects.get(pk=second.pk).open_slots == 1
    assert HumanLoop.objects.get(pk=first.pk).status == LoopStatus.COMPLETED


@pytest.mark.django_db
def test_claim_flow_definition_is_checked(make_flow, make_loops, reviewer, client_for):
    flow = make_flow()
    make_loops(flow, 1)
    client = client_for(reviewer)
    for bad in ("x", 0, -3, True, "1.5", [flow.pk]):
        response = client.post("/api/v1/review/claim/", {"flow_definition": bad}, format="json")
        assert response.status_code == 400, (bad, response.content)
        assert "flow_definition" in response.json()["error"]["fields"]
    missing = client.post("/api/v1/review/claim/", {"flow_definition": flow.pk + 1000}, format="json")
    assert missing.status_code == 404
    assert client.post("/api/v1/review/claim/", [1], format="json").status_code == 400
    # A form post with the id as text claims too.
    claimed = client.post("/api/v1/review/claim/", {"flow_definition": str(flow.pk)})
    assert claimed.status_code == 200, claimed.content
    assert claimed.json()["flow_definition"]["id"] == flow.pk
