"""Review pages through Django's test client: the inbox lists only the reviewer's teams'
flows with their counts; reviewers reach no flow page, flow data, stats, jobs or datasets;
a scientist's flow page shows settings, items, stats and sanitised instructions; Export
and Retrain from the page make a dataset version and a training job."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from datasets.actions import VersionOptions, register_local_files
from datasets.models import DatasetVersion, SourceKind, VersionStatus
from datasets.validation_run import run_validation
from hosting.models import Model, ModelKind, ModelVersion
from jobs.models import JobInput, JobStatus, TrainingJob
from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot, release_slot
from review.actions.loops import start_loops_for_predictions
from review.models import AssignmentStatus, HumanLoop, LoopStatus
from tests.review.conftest import backdate_leases


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def two_teams(project, owner, reviewer, reviewers, team, make_flow, make_loops):
    """Team A (the `reviewer` persona and reviewer-1) reviews "Animals"; team B (two other
    reviewers) reviews "Secret plants"; each flow has waiting items."""
    mine = reviewers(1)[0]
    others = reviewers(2, prefix="botanist")
    flow_a = make_flow(name="animals", title="Animals", work_team=team(owner, reviewer, mine, name="team-a"))
    flow_b = make_flow(name="secret-plants", title="Secret plants", work_team=team(owner, *others, name="team-b"),
                       labels=["fern", "moss"])
    make_loops(flow_a, 3)
    make_loops(flow_b, 2, content=lambda i: {"text": f"plant {i}"})
    return flow_a, flow_b


# --- the inbox ----------------------------------------------------------------------------------
def inbox_counts(client: Client) -> dict[int, dict]:
    response = client.get("/review/counts/")
    assert response.status_code == 200
    return {row["id"]: row for row in response.json()["flows"]}


def test_inbox_lists_only_the_reviewers_team_flows_with_counts(two_teams, reviewer):
    flow_a, flow_b = two_teams
    client = signed_in(reviewer)
    response = client.get("/review/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Animals" in page and f'data-flow="{flow_a.pk}"' in page
    assert "Secret plants" not in page and "secret-plants" not in page and f'data-flow="{flow_b.pk}"' not in page
    assert inbox_counts(client) == {flow_a.pk: {"id": flow_a.pk, "available": 3, "held": 0, "answered_today": 0}}

    held = claim_next_slot(reviewer, flow_a)
    assert inbox_counts(client)[flow_a.pk] == {"id": flow_a.pk, "available": 2, "held": 1, "answered_today": 0}
    answer_slot(held.pk, reviewer, {"label": "dog"})
    assert inbox_counts(client)[flow_a.pk] == {"id": flow_a.pk, "available": 2, "held": 0, "answered_today": 1}
    # A skipped item is not offered again, so it no longer counts as waiting for this reviewer.
    skipped = claim_next_slot(reviewer, flow_a)
    release_slot(skipped.pk, reviewer)
    assert inbox_counts(client)[flow_a.pk]["available"] == 1


def test_inbox_counts_an_item_another_reviewer_still_needs(two_teams, reviewer, reviewers):
    flow_a, _ = two_teams
    claim_next_slot(reviewers(1)[0], flow_a)  # task_count 1: that slot is held by reviewer-1
    assert inbox_counts(signed_in(reviewer))[flow_a.pk]["available"] == 2


def test_held_endpoint_resumes_the_reviewers_own_live_hold_only(two_teams, reviewer, reviewers):
    flow_a, flow_b = two_teams
    client = signed_in(reviewer)
    assert client.get("/review/held/").status_code == 204
    mine = claim_next_slot(reviewer, flow_a)
    claim_next_slot(reviewers(1)[0], flow_a)  # someone else's hold is never offered
    body = client.get("/review/held/").json()
    assert body["assignment"] == mine.pk and body["flow_definition"]["id"] == flow_a.pk
    assert body["labels"] == ["cat", "dog", "bird"] and body["input_content"]["text"].startswith("item ")
    assert client.get(f"/review/held/?flow={flow_a.pk}").json()["assignment"] == mine.pk
    assert client.get(f"/review/held/?flow={flow_b.pk}").status_code == 204
    assert client.get("/review/held/?flow=x").status_code == 404
    backdate_leases(mine)  # a hold whose lease ran out is not resumed
    assert client.get("/review/held/").status_code == 204


def test_inbox_without_a_team_says_what_will_happen(project, reviewer):
    response = signed_in(reviewer).get("/review/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Your inbox is empty" in page and "You are not in a work team yet" in page and "inbox-config" not in page


def test_inbox_of_a_team_without_flows_names_the_team(project, owner, reviewer, team):
    team(owner, reviewer, name="night-shift")
    page = signed_in(reviewer).get("/review/").content.decode()
    assert "Your work team (night-shift) has no review flow yet" in page


def test_inbox_page_carries_the_api_urls_its_script_calls(two_teams, reviewer):
    response = signed_in(reviewer).get("/review/")
    config = response.context["inbox"]
    assert config["urls"]["claim"] == "/api/v1/review/claim/"
    assert config["urls"]["answer"] == "/api/v1/review/assignments/0/answer/"
    assert config["urls"]["release"] == "/api/v1/review/assignments/0/release/"
    assert b"js/review_inbox." in response.content  # js/review_inbox.<hash>.js


# --- what reviewers cannot reach ----------------------------------------------------------------------
def test_reviewer_cannot_open_flow_pages_data_stats_or_exports(two_teams, reviewer):
    client = signed_in(reviewer)
    assert client.get("/review/flows/").status_code == 404
    for flow in two_teams:  # their own team's flow and the other team's
        assert client.get(f"/review/flows/{flow.pk}/").status_code == 404
        assert client.get(f"/review/flows/{flow.pk}/data/").status_code == 404
        assert client.get(f"/api/v1/flow-definitions/{flow.pk}/stats/").status_code == 404
        assert client.post(f"/review/flows/{flow.pk}/export/").status_code == 404
    assert not DatasetVersion.objects.exists()


def test_reviewer_cannot_claim_another_teams_items_from_the_page_api(two_teams, reviewer):
    _, flow_b = two_teams
    client_csrf = Client(enforce_csrf_checks=True)
    client_csrf.force_login(reviewer)
    client_csrf.get("/review/")
    token = client_csrf.cookies["csrftoken"].value
    response = client_csrf.post("/api/v1/review/claim/", {"flow_definition": flow_b.pk}, content_type="application/json",
                                HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 404
    response = client_csrf.post("/api/v1/review/claim/", {}, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200 and response.json()["flow_definition"]["name"] == "animals"
    assert not HumanLoop.objects.filter(flow_definition=flow_b, holds_count__gt=0).exists()


def test_reviewer_cannot_reach_jobs_or_datasets_pages(two_teams, reviewer, teammate, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,label\n1,x\n")
    version, _ = register_local_files(project=two_teams[0].project, name="private", description="", user=teammate,
                                      files={"d.csv": path}, options=VersionOptions())
    client = signed_in(reviewer)
    for url in ("/", "/jobs/", "/datasets/", f"/datasets/{version.dataset_id}/", "/tuning/", "/nodes/"):
        response = client.get(url)
        assert response.status_code == 302 and response.url == "/review/", url
    nav = client.get("/review/").context["nav_items"]
    assert [item.label for item in nav] == ["Review"]
    assert client.get("/api/v1/datasets/").json()["count"] == 0


# --- flow pages for the project -------------------------------------------------------------------------
def complete_all(flow, reviewer, label_for=lambda loop: "cat") -> int:
    done = 0
    while (assignment := claim_next_slot(reviewer, flow)) is not None:
        loop = HumanLoop.objects.get(pk=assignment.loop_id)
        answer_slot(assignment.pk, reviewer, {"label": label_for(loop)})
        done += 1
    return done


def test_scientist_flow_page_shows_settings_items_stats_and_safe_instructions(two_teams, teammate, reviewer):
    flow_a, _ = two_teams
    flow_a.instructions = "Pick the **animal**. <script>window.pwned = 1</script>"
    flow_a.save(update_fields=["instructions"])
    assert complete_all(flow_a, reviewer, lambda loop: loop.prediction["label"]) == 3
    response = signed_in(teammate).get(f"/review/flows/{flow_a.pk}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "<strong>animal</strong>" in page
    assert "<script>window.pwned" not in page  # sanitised, not merely hidden
    assert page.count('data-status="completed"') == 3 and "team-a" in page
    stats = response.context["stats"]
    assert stats["counts"]["Completed"] == 3 and stats["model_vs_human"]["accuracy"] == 1.0
    assert 'id="export-button"' in page and "Export 3 labels as a dataset" in page
    assert f'data-url="/review/flows/{flow_a.pk}/data/"' in page and "js/review_flow." in page  # hashed name
    data = signed_in(teammate).get(f"/review/flows/{flow_a.pk}/data/").json()
    assert data["model_vs_human"]["compared"] == 3


def test_flows_list_shows_backlog_per_flow_for_readers_only(two_teams, viewer, outsider):
    flow_a, flow_b = two_teams
    response = signed_in(viewer).get("/review/flows/")
    assert response.status_code == 200
    rows = {flow.pk: flow for flow in response.context["flows"]}
    assert rows[flow_a.pk].in_progress == 3 and rows[flow_a.pk].open_slots == 3
    assert rows[flow_b.pk].in_progress == 2
    outsider_page = signed_in(outsider).get("/review/flows/")
    assert outsider_page.status_code == 200 and outsider_page.context["flows"] == []
    assert signed_in(outsider).get(f"/review/flows/{flow_a.pk}/").status_code == 404


def test_viewer_sees_no_export_and_cannot_post_one(two_teams, viewer, reviewer):
    flow_a, _ = two_teams
    complete_all(flow_a, reviewer)
    client = signed_in(viewer)
    page = client.get(f"/review/flows/{flow_a.pk}/").content.decode()
    assert 'id="export-button"' not in page
    assert client.post(f"/review/flows/{flow_a.pk}/export/").status_code == 403
    assert not DatasetVersion.objects.exists()


def test_export_button_makes_a_dataset_version_listed_on_the_flow_page(two_teams, teammate, reviewer):
    flow_a, _ = two_teams
    complete_all(flow_a, reviewer, lambda loop: "bird")
    client = signed_in(teammate)
    response = client.post(f"/review/flows/{flow_a.pk}/export/", {"confirmed": "1"})
    version = DatasetVersion.objects.get()
    assert response.status_code == 302 and response.url == f"/review/flows/{flow_a.pk}/?exported={version.pk}#exports"
    assert version.source_kind == SourceKind.REVIEW and version.dataset.name == "animals-reviewed"
    page = client.get(response.url).content.decode()
    assert f'href="/datasets/{version.dataset_id}/?version=1"' in page and 'class="is-highlight"' in page
    assert "Exported to animals-reviewed v1" in page


def test_an_export_posted_without_the_pages_confirm_asks_first(two_teams, teammate, reviewer):
    """A click before the page's script ran posts the form as it is: the server asks the same
    question as the dialog, and only its confirm button makes the version."""
    flow_a, _ = two_teams
    complete_all(flow_a, reviewer, lambda loop: "bird")
    client = signed_in(teammate)
    response = client.post(f"/review/flows/{flow_a.pk}/export/", {"mode": ""})
    page = response.content.decode()
    assert response.status_code == 200 and 'id="export-confirm-text"' in page and "animals-reviewed v1" in page
    assert not DatasetVersion.objects.exists()
    confirm = re.search(r'<form class="actions" method="post" action="([^"]+)">', page)
    assert confirm and 'name="confirmed" value="1"' in page
    response = client.post(confirm.group(1), {"confirmed": "1", "mode": "", "dataset": ""})
    assert response.status_code == 302 and DatasetVersion.objects.count() == 1


def test_export_with_nothing_completed_says_why(two_teams, teammate):
    flow_a, _ = two_teams
    client = signed_in(teammate)
    response = client.post(f"/review/flows/{flow_a.pk}/export/", follow=True)
    assert response.status_code == 200
    assert "Export failed: Nothing to export" in response.content.decode()
    assert not DatasetVersion.objects.exists()


@pytest.fixture
def deployed_source(project, teammate, tmp_path):
    """A completed tabular job on a ready version, registered as a model version."""
    path = tmp_path / "train.csv"
    path.write_text("x1,x2,label\n" + "".join(f"{i % 7},{i % 5},{'pos' if i % 7 > 3 else 'neg'}\n" for i in range(60)))
    train, _ = register_local_files(project=project, name="points", description="", user=teammate,
                                    files={"train.csv": path}, options=VersionOptions(label_column="label"))
    assert run_validation(train.pk) == "ready"
    job = TrainingJob.objects.create(project=project, name="points-v1", algorithm="tabular-classifier",
                                     hyperparameters={"epochs": 2, "label_column": "label"}, created_by=teammate,
                                     resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1},
                                     status=JobStatus.COMPLETED)
    JobInput.objects.create(job=job, channel="train", dataset_version=train)
    model = Model.objects.create(project=project, name="points", created_by=teammate)
    return ModelVersion.objects.create(model=model, version=1, job=job, artifact_uri="file:///nowhere/model.tar.gz",
                                       algorithm="tabular-classifier", kind=ModelKind.TABULAR, labels=["neg", "pos"],
                                       input_schema={"label_column": "label", "columns": ["x1", "x2"]})


def test_retrain_button_clones_the_source_job_onto_the_export(project, owner, reviewer, team, make_flow, teammate,
                                                              deployed_source):
    flow = make_flow(name="points-review", labels=["neg", "pos"], work_team=team(owner, reviewer, name="graders"))
    items = [({"row": {"x1": i % 7, "x2": i % 5}}, {"label": "pos", "confidence": 0.55, "probabilities": {}})
             for i in range(12)]
    flow.activation = {"confidence_below": 0.8, "sample_percent": 0.0, "combine": "any"}
    start_loops_for_predictions(flow, items, source={"endpoint": "points"}, model_version=deployed_source)
    assert complete_all(flow, reviewer, lambda loop: "pos" if loop.input_content["row"]["x1"] > 3 else "neg") == 12
    client = signed_in(teammate)
    # Every reviewed row is a training row with the same label: a merge would change nothing.
    client.post(f"/review/flows/{flow.pk}/export/", {"mode": "reviewed_only", "confirmed": "1"})
    version = DatasetVersion.objects.get(source_kind=SourceKind.REVIEW)
    assert run_validation(version.pk) == VersionStatus.READY
    page = client.get(f"/review/flows/{flow.pk}/").content.decode()
    assert re.search(rf'action="/review/flows/{flow.pk}/exports/{version.pk}/retrain/"', page)

    response = client.post(f"/review/flows/{flow.pk}/exports/{version.pk}/retrain/")
    job = TrainingJob.objects.exclude(pk=deployed_source.job_id).get()
    assert response.status_code == 302 and response.url == f"/jobs/{job.pk}/"
    assert job.algorithm == "tabular-classifier" and job.status == JobStatus.PENDING
    assert job.inputs.get(channel="train").dataset_version_id == version.pk
    # Another flow's export cannot be retrained from this flow's page.
    other = make_flow(name="elsewhere", work_team=team(owner, reviewer, name="others"))
    assert client.post(f"/review/flows/{other.pk}/exports/{version.pk}/retrain/").status_code == 404


def test_answers_recorded_in_the_inbox_are_visible_on_the_flow_page(two_teams, reviewer, teammate):
    flow_a, _ = two_teams
    assignment = claim_next_slot(reviewer, flow_a)
    answer_slot(assignment.pk, reviewer, {"label": "dog"})
    assert assignment.__class__.objects.get(pk=assignment.pk).status == AssignmentStatus.ANSWERED
    rows = signed_in(teammate).get(f"/review/flows/{flow_a.pk}/").context["rows"]
    answered = [row for row in rows if row.loop.status == LoopStatus.COMPLETED]
    assert len(answered) == 1 and answered[0].answers == ["dog"] and answered[0].consolidated == "dog"


def test_overview_shows_the_review_backlog_of_readable_projects(two_teams, teammate, outsider):
    flow_a, flow_b = two_teams
    response = signed_in(teammate).get("/")
    backlog = response.context["review_backlog"]
    assert (backlog["loops"], backlog["open_slots"]) == (5, 5)
    assert [(flow.name, flow.backlog) for flow in backlog["flows"]] == [("animals", 3), ("secret-plants", 2)]
    page = response.content.decode()
    assert f'href="/review/flows/{flow_a.pk}/"' in page and "5 items in review" in page.replace("</strong>", "").replace("<strong>", "")
    other = signed_in(outsider).get("/")
    assert other.context["review_backlog"]["loops"] == 0 and "Nothing waits for review" in other.content.decode()


def test_inbox_and_flow_pages_take_a_bounded_number_of_queries(project, owner, reviewer, team, make_flow, make_loops,
                                                               teammate, django_assert_max_num_queries):
    crew = team(owner, reviewer, name="crew")
    flows = [make_flow(name=f"flow-{i}", work_team=crew) for i in range(5)]
    for flow in flows:
        make_loops(flow, 6)
    for _ in range(4):
        assignment = claim_next_slot(reviewer)
        answer_slot(assignment.pk, reviewer, {"label": "cat"})
    reviewer_client, scientist_client = signed_in(reviewer), signed_in(teammate)
    with django_assert_max_num_queries(8):
        assert reviewer_client.get("/review/").status_code == 200
    with django_assert_max_num_queries(6):
        assert reviewer_client.get("/review/counts/").status_code == 200
    with django_assert_max_num_queries(28):
        assert scientist_client.get(f"/review/flows/{flows[0].pk}/").status_code == 200
    with django_assert_max_num_queries(6):
        assert scientist_client.get("/review/flows/").status_code == 200


def test_retrain_without_a_source_model_says_why(two_teams, teammate, reviewer):
    flow_a, _ = two_teams
    complete_all(flow_a, reviewer)
    client = signed_in(teammate)
    client.post(f"/review/flows/{flow_a.pk}/export/", {"confirmed": "1"})
    version = DatasetVersion.objects.get()
    response = client.post(f"/review/flows/{flow_a.pk}/exports/{version.pk}/retrain/", follow=True)
    assert response.redirect_chain[-1][0] == f"/review/flows/{flow_a.pk}/#exports"
    assert "Retrain failed: No source job" in response.content.decode()
    assert not TrainingJob.objects.exists()
