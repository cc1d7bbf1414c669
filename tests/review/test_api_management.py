"""The management API: work teams, flow definitions, human loops; and each bad input a
clear 4xx naming its field."""

from __future__ import annotations

import pytest

from review.actions.teams import create_work_team
from review.models import FlowDefinition, HumanLoop, LoopStatus, WorkTeam
from studio import actions as studio_actions
from studio.models import Role

pytestmark = pytest.mark.django_db


@pytest.fixture
def labellers(project, owner, reviewer, reviewers):
    return create_work_team(project=project, name="labellers", members=[reviewer, *reviewers(2)], user=owner)


def flow_body(team, **overrides) -> dict:
    body = {"name": "animals", "work_team": team.pk, "task_type": "classification", "labels": ["cat", "dog"],
            "title": "Which animal?", "instructions": "Pick one.", "task_count": 2,
            "task_availability_seconds": 3600, "task_time_limit_seconds": 120,
            "activation": {"confidence_below": 0.8, "sample_percent": 5, "combine": "any"}, "order": "oldest"}
    body.update(overrides)
    return body


def assert_field_error(response, status: int, field: str) -> None:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert field in error["message"] or status == 409, error


def test_work_teams_create_list_and_read(client_for, owner, reviewer, teammate):
    client = client_for(owner)
    created = client.post("/api/v1/work-teams/", {"project": "acme", "name": "labellers",
                                                  "members": ["reviewer", "teammate"]}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["members"] == ["reviewer", "teammate"] and body["project"] == "acme"
    listed = client.get("/api/v1/work-teams/?project=acme").json()
    assert [t["name"] for t in listed["results"]] == ["labellers"]
    assert client.get(f"/api/v1/work-teams/{body['id']}/").json()["name"] == "labellers"
    again = client.post("/api/v1/work-teams/", {"project": "acme", "name": "labellers", "members": ["reviewer"]},
                        format="json")
    assert again.status_code == 409


def test_work_team_members_must_belong_to_the_project(client_for, owner, outsider, reviewer):
    client = client_for(owner)
    for members in (["outsider"], ["nobody-at-all"], []):
        response = client.post("/api/v1/work-teams/", {"project": "acme", "name": "t", "members": members},
                               format="json")
        assert_field_error(response, 400, "members")
    assert not WorkTeam.objects.exists()


def test_viewers_and_reviewers_cannot_create_teams_or_flows(client_for, viewer, reviewer, labellers):
    body = {"project": "acme", "name": "mine", "members": ["reviewer"]}
    assert client_for(viewer).post("/api/v1/work-teams/", body, format="json").status_code == 403
    assert client_for(reviewer).post("/api/v1/work-teams/", body, format="json").status_code == 400
    assert client_for(viewer).post("/api/v1/flow-definitions/", flow_body(labellers), format="json").status_code == 403
    assert client_for(reviewer).post("/api/v1/flow-definitions/", flow_body(labellers),
                                     format="json").status_code == 400
    assert not FlowDefinition.objects.exists()


def test_flow_definition_create_renders_sanitised_instructions(client_for, owner, labellers):
    instructions = "# Animals\n<script>alert(1)</script>\n[home](javascript:alert(2)) <b onclick=x()>bold</b>"
    response = client_for(owner).post("/api/v1/flow-definitions/", flow_body(labellers, instructions=instructions),
                                      format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["instructions"] == instructions
    html = body["instructions_html"]
    assert "<h1>Animals</h1>" in html and "<b>bold</b>" in html
    assert "<script" not in html and "javascript:" not in html and "onclick" not in html
    assert body["activation"] == {"confidence_below": 0.8, "sample_percent": 5.0, "combine": "any"}
    assert body["work_team"] == {"id": labellers.pk, "name": "labellers"}
    listed = client_for(owner).get("/api/v1/flow-definitions/?project=acme").json()["results"]
    assert [f["name"] for f in listed] == ["animals"]


@pytest.mark.parametrize(("overrides", "field"), [
    ({"task_count": 0}, "task_count"),
    ({"task_count": 4}, "task_count"),  # the team has 3 members
    ({"activation": {"confidence_below": 1.2}}, "activation"),
    ({"activation": {"confidence_below": -0.5}}, "activation"),
    ({"activation": {"sample_percent": 150}}, "activation"),
    ({"activation": {"combine": "sometimes"}}, "activation"),
    ({"labels": []}, "labels"),
    ({"labels": ["cat", "cat"]}, "labels"),
    ({"labels": ["cat", " "]}, "labels"),
    ({"labels": ["cat", "no consensus"]}, "labels"),
    ({"task_type": "free_text", "labels": ["cat", "dog"]}, "labels"),
    ({"task_type": "ranking"}, "task_type"),
    ({"order": "random"}, "order"),
    ({"work_team": 999999}, "work_team"),
    ({"task_time_limit_seconds": 0}, "task_time_limit_seconds"),
    ({"task_availability_seconds": -1}, "task_availability_seconds"),
    ({"title": ""}, "title"),
])
def test_bad_flow_definitions_are_400_naming_the_field(client_for, owner, labellers, overrides, field):
    response = client_for(owner).post("/api/v1/flow-definitions/", flow_body(labellers, **overrides), format="json")
    assert_field_error(response, 400, field)


def test_a_flow_cannot_use_another_projects_team(client_for, owner, other_project, outsider):
    studio_actions.set_membership(project=other_project, user=owner, role=Role.SCIENTIST)
    theirs = create_work_team(project=other_project, name="rivals", members=[outsider], user=outsider)
    response = client_for(owner).post("/api/v1/flow-definitions/", flow_body(theirs, project="acme", task_count=1),
                                      format="json")
    assert_field_error(response, 400, "work_team")
    # A team the user cannot even read is simply unknown.
    stranger = client_for(outsider).post("/api/v1/flow-definitions/", flow_body(theirs, task_count=1), format="json")
    assert stranger.status_code == 201
    acme_team = WorkTeam.objects.create(project_id=owner.memberships.get(project__slug="acme").project_id, name="x")
    assert_field_error(client_for(outsider).post("/api/v1/flow-definitions/", flow_body(acme_team, task_count=1),
                                                 format="json"), 400, "work_team")


def test_a_duplicate_flow_name_is_a_conflict(client_for, owner, labellers):
    client = client_for(owner)
    assert client.post("/api/v1/flow-definitions/", flow_body(labellers), format="json").status_code == 201
    assert client.post("/api/v1/flow-definitions/", flow_body(labellers), format="json").status_code == 409


def test_human_loops_start_read_list_and_stop(client_for, owner, make_flow):
    flow = make_flow()
    client = client_for(owner)
    created = client.post("/api/v1/human-loops/", {"name": "check-1", "flow_definition": flow.pk,
                                                   "input_content": {"text": "a cat?"}}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["status"] == "InProgress" and created.json()["activation_reason"] == "api"
    again = client.post("/api/v1/human-loops/", {"name": "check-1", "flow_definition": flow.pk,
                                                 "input_content": {"text": "again"}}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    detail = client.get("/api/v1/human-loops/check-1/").json()
    assert detail["input_content"] == {"text": "a cat?"} and detail["human_answers"] == []
    listed = client.get(f"/api/v1/human-loops/?flow_definition={flow.pk}&status=InProgress").json()
    assert [row["name"] for row in listed["results"]] == ["check-1"]
    assert client.get(f"/api/v1/human-loops/?flow_definition={flow.pk}&status=Completed").json()["results"] == []
    stopped = client.post("/api/v1/human-loops/check-1/stop/")
    assert stopped.status_code == 200 and stopped.json()["status"] == "Stopped"
    assert HumanLoop.objects.get(name="check-1").status == LoopStatus.STOPPED
    assert client.post("/api/v1/human-loops/check-1/stop/").status_code == 409


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x", "input_content": ["a", "list"]}, "input_content"),
    ({"name": "x", "input_content": "text"}, "input_content"),
    ({"name": "x"}, "input_content"),
    ({"input_content": {"text": "t"}}, "name"),
    ({"name": "x", "input_content": {"text": "t"}, "flow_definition": 99999}, "flow_definition"),
    ({"name": "a/b", "input_content": {"text": "t"}}, "name"),
])
def test_bad_human_loops_are_400_naming_the_field(client_for, owner, make_flow, body, field):
    flow = make_flow()
    response = client_for(owner).post("/api/v1/human-loops/", {"flow_definition": flow.pk, **body}, format="json")
    assert_field_error(response, 400, field)


def test_bad_loop_list_filters_are_400(client_for, owner):
    client = client_for(owner)
    assert_field_error(client.get("/api/v1/human-loops/?status=Done"), 400, "status")
    assert_field_error(client.get("/api/v1/human-loops/?flow_definition=abc"), 400, "flow_definition")


def test_reviewer_api_bad_inputs(client_for, make_flow, make_loops, reviewer):
    flow = make_flow()
    make_loops(flow, 2)
    client = client_for(reviewer)
    assert_field_error(client.post("/api/v1/review/claim/", {"flow_definition": "x"}, format="json"), 400,
                       "flow_definition")
    held = client.post("/api/v1/review/claim/", {}, format="json").json()
    url = f"/api/v1/review/assignments/{held['assignment']}"
    assert_field_error(client.post(f"{url}/answer/", {"answer": {"label": "horse"}}, format="json"), 400, "answer")
    # Nothing but a whole label counts (never a piece of the label list's JSON).
    for not_a_label in ("ca", 'cat", "dog', "[", ", ", ""):
        assert_field_error(client.post(f"{url}/answer/", {"answer": {"label": not_a_label}}, format="json"), 400,
                           "answer")
    assert_field_error(client.post(f"{url}/answer/", {}, format="json"), 400, "answer")
    assert client.post(f"{url}/release/").status_code == 200
    released = client.post(f"{url}/answer/", {"answer": {"label": "cat"}}, format="json")
    assert released.status_code == 409 and released.json()["error"]["code"] == "conflict"
    assert "released" in released.json()["error"]["message"]
    assert client.post("/api/v1/review/assignments/999999/answer/", {"answer": {"label": "cat"}},
                       format="json").status_code == 404


def test_answering_an_expired_assignment_is_a_conflict(client_for, make_flow, make_loops, reviewer):
    from review.models import Assignment
    from tests.review.conftest import backdate_leases

    flow = make_flow()
    [loop] = make_loops(flow, 1)
    client = client_for(reviewer)
    held = client.post("/api/v1/review/claim/", {}, format="json").json()
    backdate_leases(Assignment.objects.get(pk=held["assignment"]))
    response = client.post(f"/api/v1/review/assignments/{held['assignment']}/answer/", {"answer": {"label": "cat"}},
                           format="json")
    assert response.status_code == 409 and "expired" in response.json()["error"]["message"]
    assert HumanLoop.objects.get(pk=loop.pk).open_slots == 1


def test_prediction_is_hidden_when_the_flow_says_so(client_for, make_flow, make_loops, reviewer):
    flow = make_flow(show_prediction=False)
    make_loops(flow, 1)
    held = client_for(reviewer).post("/api/v1/review/claim/", {}, format="json").json()
    assert held["prediction"] is None
