"""The browser forms for a work team and a flow: they follow the API's rules (one message
per bad field, next to the field) and write through the same actions."""

from __future__ import annotations

from django.test import Client

from review.models import FlowDefinition, WorkTeam


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


FLOW = {"name": "triage", "title": "Which animal?", "task_type": "classification", "labels": "cat\ndog, bird",
        "instructions": "Pick **one**. <script>alert(1)</script>", "task_count": "2", "task_time_limit_seconds": "120",
        "task_availability_seconds": "3600", "confidence_below": "0.7", "sample_percent": "5", "combine": "any",
        "order": "least_confident", "show_prediction": "on"}


def test_scientist_creates_a_team_then_a_flow_from_the_browser(project, teammate, reviewer, reviewers):
    client = signed_in(teammate)
    other = reviewers(1)[0]
    response = client.post("/review/teams/new/", {"project": "acme", "name": "labellers",
                                                  "members": f"{reviewer.username}, {other.username}"})
    team = WorkTeam.objects.get(name="labellers")
    assert response.status_code == 302 and response.url == f"/review/flows/new/?team={team.pk}"
    assert sorted(team.members.values_list("username", flat=True)) == ["reviewer", "reviewer-1"]

    form_page = client.get(response.url)
    assert form_page.status_code == 200 and form_page.context["form"].initial["work_team"] == team.pk
    assert f'<option value="{team.pk}" selected>labellers (acme)</option>' in form_page.content.decode()
    response = client.post("/review/flows/new/", {**FLOW, "work_team": team.pk})
    flow = FlowDefinition.objects.get(name="triage")
    assert response.status_code == 302 and response.url == f"/review/flows/{flow.pk}/"
    assert flow.labels == ["cat", "dog", "bird"] and flow.task_count == 2 and flow.order == "least_confident"
    assert flow.activation == {"confidence_below": 0.7, "sample_percent": 5.0, "combine": "any"}
    assert "<strong>one</strong>" in flow.instructions_html and "<script>" not in flow.instructions_html
    assert flow.created_by == teammate and flow.show_prediction is True


def test_flow_form_puts_each_api_error_next_to_its_field(project, teammate, reviewer, team, owner):
    crew = team(owner, reviewer, name="duo")
    client = signed_in(teammate)
    cases = [
        ({"task_count": "3"}, "task_count", "at most the work team's size (1 member)"),
        ({"confidence_below": "1.5"}, "confidence_below", "from 0 to 1"),
        ({"labels": "cat"}, "labels", "at least two labels"),
        ({"labels": "cat\ncat"}, "labels", "Duplicate labels: cat"),
    ]
    for change, field, text in cases:
        response = client.post("/review/flows/new/", {**FLOW, "work_team": crew.pk, "task_count": "1", **change})
        assert response.status_code == 200, change
        errors = response.context["form"].errors
        assert field in errors and text in " ".join(errors[field]), (change, errors)
    assert not FlowDefinition.objects.exists()


def test_team_form_names_unknown_and_outside_members(project, teammate, outsider):
    client = signed_in(teammate)
    response = client.post("/review/teams/new/", {"project": "acme", "name": "x", "members": "nobody"})
    assert "No user named nobody." in response.context["form"].errors["members"]
    response = client.post("/review/teams/new/", {"project": "acme", "name": "x", "members": "outsider"})
    assert "Not members of project 'acme': outsider." in response.context["form"].errors["members"]
    assert not WorkTeam.objects.exists()


def test_viewers_and_reviewers_cannot_open_the_forms(project, viewer, reviewer):
    assert signed_in(viewer).get("/review/flows/new/").status_code == 403
    assert signed_in(viewer).post("/review/teams/new/", {"project": "acme", "name": "x", "members": "viewer"}).status_code == 403
    assert signed_in(reviewer).get("/review/flows/new/").status_code == 404
    assert not WorkTeam.objects.exists()
