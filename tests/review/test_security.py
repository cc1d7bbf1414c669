"""A reviewer of team A never sees team B's items by API: not in lists, not by claim, not
by answering or releasing B's assignments, not by opening B's loops; and reviewers reach
neither jobs nor datasets."""

from __future__ import annotations

import pytest

from review.actions.claims import claim_next_slot
from review.models import Assignment, AssignmentStatus, HumanLoop

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_teams(make_flow, make_loops, owner, reviewers, team):
    alice, bob = reviewers(1, prefix="alice")[0], reviewers(1, prefix="bob")[0]
    flow_a = make_flow(name="flow-a", work_team=team(owner, alice, name="team-a"))
    flow_b = make_flow(name="flow-b", work_team=team(owner, bob, name="team-b"))
    loops_a = make_loops(flow_a, 3)
    loops_b = make_loops(flow_b, 3)
    return {"alice": alice, "bob": bob, "flow_a": flow_a, "flow_b": flow_b, "loops_a": loops_a, "loops_b": loops_b}


def test_a_reviewer_lists_and_opens_only_their_teams_flows(client_for, two_teams):
    client = client_for(two_teams["alice"])
    listed = client.get("/api/v1/flow-definitions/").json()["results"]
    assert [f["name"] for f in listed] == ["flow-a"]
    assert client.get(f"/api/v1/flow-definitions/{two_teams['flow_a'].pk}/").status_code == 200
    assert client.get(f"/api/v1/flow-definitions/{two_teams['flow_b'].pk}/").status_code == 404
    assert client.get("/api/v1/work-teams/").json()["results"] == []


def test_a_reviewer_cannot_list_or_open_loops(client_for, two_teams):
    client = client_for(two_teams["alice"])
    assert client.get("/api/v1/human-loops/").json()["results"] == []
    assert client.get(f"/api/v1/human-loops/?flow_definition={two_teams['flow_b'].pk}").json()["results"] == []
    for loop in (two_teams["loops_b"][0], two_teams["loops_a"][0]):
        assert client.get(f"/api/v1/human-loops/{loop.name}/").status_code == 404
        assert client.post(f"/api/v1/human-loops/{loop.name}/stop/").status_code == 404
    assert client.post(f"/api/v1/flow-definitions/{two_teams['flow_b'].pk}/export/", {}, format="json").status_code == 404


def test_a_reviewer_claims_only_their_teams_items(client_for, two_teams):
    client = client_for(two_teams["alice"])
    assert client.post("/api/v1/review/claim/", {"flow_definition": two_teams["flow_b"].pk},
                       format="json").status_code == 404
    names_b = {loop.name for loop in two_teams["loops_b"]}
    claimed = []
    while (response := client.post("/api/v1/review/claim/", {}, format="json")).status_code == 200:
        claimed.append(response.json()["human_loop"])
    assert response.status_code == 204
    assert sorted(claimed) == sorted(loop.name for loop in two_teams["loops_a"])
    assert not names_b & set(claimed)


def test_a_reviewer_cannot_answer_or_release_another_teams_assignment(client_for, two_teams):
    bobs = claim_next_slot(two_teams["bob"])
    client = client_for(two_teams["alice"])
    answer = client.post(f"/api/v1/review/assignments/{bobs.pk}/answer/", {"answer": {"label": "cat"}}, format="json")
    assert answer.status_code == 404
    assert client.post(f"/api/v1/review/assignments/{bobs.pk}/release/").status_code == 404
    assert Assignment.objects.get(pk=bobs.pk).status == AssignmentStatus.HELD
    assert HumanLoop.objects.get(pk=bobs.loop_id).holds_count == 1


def test_reviewers_reach_neither_jobs_nor_datasets(client_for, two_teams, project):
    from datasets.models import Dataset
    from jobs.models import TrainingJob

    dataset = Dataset.objects.create(project=project, name="secret")
    job = TrainingJob.objects.create(project=project, name="secret-job", algorithm="tabular-classifier")
    client = client_for(two_teams["alice"])
    assert client.get(f"/api/v1/datasets/{dataset.pk}/").status_code == 404
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    for url in ("/api/v1/datasets/", "/api/v1/jobs/", "/api/v1/dataset-versions/"):
        response = client.get(url)
        assert response.status_code in (200, 403, 404)
        if response.status_code == 200:
            assert response.json()["results"] == [], url
    assert client.post("/api/v1/jobs/", {"project": "acme", "name": "x", "algorithm": "tabular-classifier"},
                       format="json").status_code in (400, 403, 404)
    assert not TrainingJob.objects.filter(name="x").exists()


def test_anonymous_requests_are_refused(two_teams):
    from rest_framework.test import APIClient

    client = APIClient()
    assert client.post("/api/v1/review/claim/", {}, format="json").status_code in (401, 403)
    assert client.get("/api/v1/flow-definitions/").status_code in (401, 403)
