"""The evaluation pages through Django's test client: the report (with its charts' JSON and
its three forms), the new-evaluation form, the comparison, the model and job pages' links,
and the flow page's "closing the loop" panel on loops made here."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from evaluations.actions import submit_evaluation
from evaluations.models import Evaluation, EvaluationStatus
from hosting.models import ModelVersion
from jobs.models import JobStatus, TrainingJob
from review.consolidation import NO_CONSENSUS
from review.models import FlowDefinition, HumanLoop, LoopStatus, TaskType
from review.stats import closing_the_loop
from tests.hosting.conftest import make_flow


def page_for(client, user):
    client.force_login(user)
    return client


def chart_data(response) -> dict:
    match = re.search(r'<script id="evaluation-chart-data" type="application/json">(.*?)</script>',
                      response.content.decode(), re.S)
    assert match, "the report embeds its charts' JSON"
    return json.loads(match.group(1))


def twin(evaluation: Evaluation, **changes) -> Evaluation:
    """Another completed evaluation row of the same model with the same stored figures."""
    fields = {name: getattr(evaluation, name) for name in (
        "project", "model_version", "dataset_version", "channel", "calibration_fraction", "kind", "labels",
        "records_total", "records_done", "report", "calibration", "proposal", "options", "artifacts")}
    return Evaluation.objects.create(status=EvaluationStatus.COMPLETED, **{**fields, **changes})


# --- the report ------------------------------------------------------------------------------
def test_report_page_shows_figures_charts_data_and_the_forms_to_writers(client, owner, project, completed_evaluation):
    flow = make_flow(project, owner)
    response = page_for(client, owner).get(f"/evaluations/{completed_evaluation.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    report = completed_evaluation.report
    low, high = report["intervals"]["accuracy"]
    assert f"{report['accuracy']:.3f}" in html and f"{low:.3f} – {high:.3f}" in html
    for element in ("confusion-chart", "per-class-table", "reliability-after-mass", "risk-coverage-chart", "proposal-table",
                    "propose-form", "calibrate-form", "activate-form"):
        assert f'id="{element}"' in html, element
    assert f'<option value="{flow.pk}"' in html
    assert 'id="calibrate-isotonic"' not in html  # 300 calibration items: no isotonic fit
    data = chart_data(response)
    assert data["confusion_matrix"] == report["confusion_matrix"]
    assert data["reliability"]["after"]["width"] == completed_evaluation.calibration["after"]["bins"]["width"]
    assert len(data["candidates"]) == len(completed_evaluation.proposal["candidates"])
    assert data["markers"]["0.8"]["threshold"] == 0.8
    assert "/static/vendor/plotly/plotly.min" in html and "https://" not in html


def test_viewer_sees_the_report_without_forms_and_cannot_post(client, viewer, completed_evaluation):
    client = page_for(client, viewer)
    response = client.get(f"/evaluations/{completed_evaluation.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="confusion-chart"' in html
    assert "<form" not in html.split('id="main"', 1)[1].split("</main>")[0]
    assert client.post(f"/evaluations/{completed_evaluation.pk}/proposal/", {"target_error": "0.2"}).status_code == 403
    assert client.get(f"/evaluations/new/?model_version={completed_evaluation.model_version_id}").status_code == 403


def test_outsider_gets_404_on_every_page(client, outsider, completed_evaluation, demo_job):
    client = page_for(client, outsider)
    pk = completed_evaluation.pk
    for url in (f"/evaluations/{pk}/", f"/evaluations/{pk}/status/", f"/evaluations/compare/?a={pk}&b={pk}",
                f"/evaluations/new/?model_version={completed_evaluation.model_version_id}", f"/evaluations/new/?job={demo_job.pk}"):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/evaluations/{pk}/apply/", {"flow_definition": "1", "choice": "risk"}).status_code == 404


def test_a_running_evaluation_polls_its_status_and_asks_for_a_refresh_once_finished(client, owner, project, model_version,
                                                                                  demo_version):
    evaluation = submit_evaluation(project=project, user=owner, body={"model_version": model_version.pk,
                                                                      "dataset_version": demo_version.pk})
    Evaluation.objects.filter(pk=evaluation.pk).update(status=EvaluationStatus.RUNNING, records_done=300)
    client = page_for(client, owner)
    html = client.get(f"/evaluations/{evaluation.pk}/").content.decode()
    assert f'hx-get="/evaluations/{evaluation.pk}/status/"' in html
    assert "Predicted <span id=\"evaluation-records-done\">300</span> of 600 records" in html
    assert 'id="confusion-chart"' not in html
    fragment = client.get(f"/evaluations/{evaluation.pk}/status/", headers={"HX-Request": "true"})
    assert fragment.status_code == 200 and "HX-Refresh" not in fragment.headers
    Evaluation.objects.filter(pk=evaluation.pk).update(status=EvaluationStatus.FAILED, failure_reason="record 7: bad row")
    assert client.get(f"/evaluations/{evaluation.pk}/status/", headers={"HX-Request": "true"}).headers["HX-Refresh"] == "true"
    html = client.get(f"/evaluations/{evaluation.pk}/").content.decode()
    assert "record 7: bad row" in html and "hx-get" not in html


# --- the report's forms ----------------------------------------------------------------------
def test_propose_again_stores_the_new_proposal_or_shows_the_refusal_on_its_field(client, owner, completed_evaluation):
    client = page_for(client, owner)
    url = f"/evaluations/{completed_evaluation.pk}/proposal/"
    response = client.post(url, {"target_error": "0.2", "delta": "0.1", "flow_definition": "", "review_cost": "1",
                                 "error_cost": "20"})
    assert response.status_code == 302
    completed_evaluation.refresh_from_db()
    assert completed_evaluation.proposal["target_error"] == 0.2 and completed_evaluation.proposal["delta"] == 0.1
    assert completed_evaluation.proposal["cost"] is not None

    refused = client.post(url, {"target_error": "0.9", "delta": "", "flow_definition": "", "review_cost": "",
                                "error_cost": ""})
    assert refused.status_code == 400
    form = refused.content.decode().split('id="propose-form"', 1)[1]
    assert re.search(r'id="propose-target" value="0.9">.*?<p class="field-error">Must be in \(0, 0.5\]', form, re.S)
    one_cost = client.post(url, {"target_error": "0.1", "review_cost": "1", "error_cost": ""})
    assert one_cost.status_code == 400 and "Give both review_cost" in one_cost.content.decode()
    completed_evaluation.refresh_from_db()
    assert completed_evaluation.proposal["target_error"] == 0.2  # refusals wrote nothing


def test_calibrate_button_serves_the_temperature_and_isotonic_is_refused(client, owner, completed_evaluation):
    client = page_for(client, owner)
    url = f"/evaluations/{completed_evaluation.pk}/calibrate/"
    refused = client.post(url, {"method": "isotonic"})
    assert refused.status_code == 400 and "Isotonic regression needs at least 1000" in refused.content.decode()
    version = ModelVersion.objects.get(pk=completed_evaluation.model_version_id)
    assert not version.calibration

    response = client.post(url, {"method": "temperature"}, follow=True)
    assert response.status_code == 200
    version.refresh_from_db()
    assert version.calibration["temperature"] == completed_evaluation.calibration["temperature"]
    assert version.calibration["evaluation"] == completed_evaluation.pk
    html = response.content.decode()
    assert "now serves calibrated confidences" in html and 'id="calibrate-none"' in html
    model_page = client.get(f"/models/{version.model_id}/").content.decode()
    assert f'id="calibrated-{version.version}"' in model_page and f"/evaluations/{completed_evaluation.pk}/" in model_page


def test_apply_to_a_flow_routes_it_at_the_proposal_and_records_where_it_came_from(client, owner, project,
                                                                                 completed_evaluation):
    flow = make_flow(project, owner, confidence_below=0.5, sample_percent=5)
    client = page_for(client, owner)
    url = f"/evaluations/{completed_evaluation.pk}/apply/"
    refused = client.post(url, {"flow_definition": str(flow.pk), "choice": "cost"})
    assert refused.status_code == 400
    assert "The proposal has no cost threshold" in refused.content.decode().split('id="activate-form"', 1)[1]
    flow.refresh_from_db()
    assert flow.activation["confidence_below"] == 0.5 and not flow.calibration

    response = client.post(url, {"flow_definition": str(flow.pk), "choice": "risk"}, follow=True)
    assert response.status_code == 200
    flow.refresh_from_db()
    completed_evaluation.refresh_from_db()
    risk = completed_evaluation.proposal["risk"]
    assert flow.activation["confidence_below"] == risk["threshold"]
    assert flow.calibration["evaluation"] == completed_evaluation.pk and flow.calibration["choice"] == "risk"
    assert f"Flow {flow.name} now sends items with confidence below" in response.content.decode()
    assert f'data-flow-uses="{flow.pk}"' in response.content.decode()


def test_apply_refuses_a_free_text_flow(client, owner, project, completed_evaluation):
    flow = make_flow(project, owner, name="describe")
    FlowDefinition.objects.filter(pk=flow.pk).update(task_type=TaskType.FREE_TEXT)
    response = page_for(client, owner).post(f"/evaluations/{completed_evaluation.pk}/apply/",
                                            {"flow_definition": str(flow.pk), "choice": "risk"})
    assert response.status_code == 400 and "collects free text" in response.content.decode()


# --- a new evaluation ------------------------------------------------------------------------
def test_new_evaluation_form_starts_one_or_shows_the_action_refusal(client, owner, model_version, demo_version):
    client = page_for(client, owner)
    url = f"/evaluations/new/?model_version={model_version.pk}"
    html = client.get(url).content.decode()
    assert f'<option value="{demo_version.pk}"' in html and 'value="0.05"' in html

    refused = client.post(url, {"dataset_version": str(demo_version.pk), "channel": "", "target_error": "0.05",
                                "calibration_fraction": "1.5", "flow_definition": ""})
    assert refused.status_code == 400
    assert re.search(r'id="evaluation-fraction" value="1.5">.*?<p class="field-error">Must be in \(0, 1\)',
                     refused.content.decode(), re.S)
    no_test_channel = client.post(url, {"dataset_version": str(demo_version.pk), "channel": "test"})
    assert no_test_channel.status_code == 400 and "has no test records" in no_test_channel.content.decode()
    assert not Evaluation.objects.exists()

    response = client.post(url, {"dataset_version": str(demo_version.pk), "channel": "", "target_error": "0.1",
                                 "calibration_fraction": "0.6", "flow_definition": ""})
    evaluation = Evaluation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/evaluations/{evaluation.pk}/"
    assert evaluation.status == EvaluationStatus.PENDING
    assert evaluation.calibration_fraction == 0.6 and evaluation.options["target_error"] == 0.1


def test_new_from_a_job_picks_its_newest_version_or_says_to_register_first(client, owner, project, demo_job,
                                                                          model_version):
    client = page_for(client, owner)
    html = client.get(f"/evaluations/new/?job={demo_job.pk}").content.decode()
    assert 'id="from-job"' in html and f"{model_version.model.name} v{model_version.version}" in html
    bare = TrainingJob.objects.create(project=project, name="unregistered", algorithm="tabular-classifier",
                                      status=JobStatus.COMPLETED, model_uri="s3://x/model.tar.gz", created_by=owner)
    html = client.get(f"/evaluations/new/?job={bare.pk}").content.decode()
    assert "has no registered model version yet" in html and "/models/#register-form" in html
    assert 'id="evaluation-form"' not in html
    assert "Open this page from a model version" in client.get("/evaluations/new/").content.decode()


# --- comparison, the model page and the job page -----------------------------------------------
def test_compare_shows_both_figures_and_differences(client, owner, completed_evaluation):
    report = {**completed_evaluation.report, "accuracy": completed_evaluation.report["accuracy"] - 0.1}
    other = twin(completed_evaluation, report=report)
    response = page_for(client, owner).get(f"/evaluations/compare/?a={completed_evaluation.pk}&b={other.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    row = html.split('data-figure="accuracy"', 1)[1].split("</tr>", 1)[0]
    assert f"{completed_evaluation.report['accuracy']:.4f}" in row and "-0.1000" in row
    assert 'id="reliability-a"' in html and 'id="compare-chart-data"' in html
    assert page_for(client, owner).get("/evaluations/compare/?a=1").status_code == 400


def test_model_page_lists_its_evaluations_with_links_and_the_job_page_offers_evaluate(client, owner, demo_job,
                                                                                    completed_evaluation):
    other = twin(completed_evaluation)
    client = page_for(client, owner)
    html = client.get(f"/models/{completed_evaluation.model_version.model_id}/").content.decode()
    table = html.split('id="evaluations-table"', 1)[1].split("</table>", 1)[0]
    assert f'href="/evaluations/{completed_evaluation.pk}/"' in table and f'href="/evaluations/{other.pk}/"' in table
    assert f"{completed_evaluation.report['accuracy']:.3f}" in table
    assert f"{completed_evaluation.calibration['temperature']:.3f}" in table
    assert f"/evaluations/compare/?a={completed_evaluation.pk}&amp;b={other.pk}" in html
    assert f"/evaluations/new/?model_version={completed_evaluation.model_version_id}" in html
    assert f'href="/evaluations/new/?job={demo_job.pk}"' in client.get(f"/jobs/{demo_job.pk}/").content.decode()


# --- the flow page's "closing the loop" panel ---------------------------------------------------
def _loop(flow, number, *, reason, model, human, status=LoopStatus.COMPLETED):
    now = timezone.now()
    return HumanLoop.objects.create(
        name=f"loop-{number}", project=flow.project, flow_definition=flow, status=status, answers_needed=1, open_slots=0,
        prediction={"label": model, "confidence": 0.9}, activation_reason=reason, consolidated_label=human,
        expires_at=now + timedelta(days=1), completed_at=now if status == LoopStatus.COMPLETED else None)


def test_closing_the_loop_splits_reviewed_from_audited_and_bounds_the_audit(client, owner, project):
    from trainyard.evaluation import clopper_pearson_upper

    flow = make_flow(project, owner, confidence_below=0.7, sample_percent=10)
    number = iter(range(100))
    for model, human in [("alpine", "alpine")] * 3 + [("alpine", "desert")] * 2:  # reviewed: 3 of 5 right
        _loop(flow, next(number), reason="confidence_below", model=model, human=human)
    for model, human in [("coastal", "coastal")] * 9 + [("coastal", "alpine")]:  # audit: 9 of 10 right
        _loop(flow, next(number), reason="sampled", model=model, human=human)
    _loop(flow, next(number), reason="sampled", model="alpine", human=NO_CONSENSUS)  # left out
    _loop(flow, next(number), reason="sampled", model="alpine", human="", status=LoopStatus.IN_PROGRESS)  # left out
    _loop(flow, next(number), reason="api", model="alpine", human="desert")  # neither part

    closing = closing_the_loop(flow)
    assert closing["reviewed"] == {"compared": 5, "matches": 3, "errors": 2, "accuracy": 0.6}
    assert closing["audit"]["compared"] == 10 and closing["audit"]["errors"] == 1
    assert closing["audit"]["upper"] == pytest.approx(clopper_pearson_upper(1, 10, 0.05))
    assert closing["calibration"] is None and closing["warning"] is None  # set by hand: no target to check

    FlowDefinition.objects.filter(pk=flow.pk).update(calibration={
        "evaluation": 41, "temperature": 1.5, "target_error": 0.05, "delta": 0.1, "threshold": 0.7, "choice": "risk"})
    flow.refresh_from_db()
    closing = closing_the_loop(flow)
    assert closing["audit"]["upper"] == pytest.approx(clopper_pearson_upper(1, 10, 0.1))
    assert closing["warning"] and "above the target 5.0%" in closing["warning"]

    html = page_for(client, owner).get(f"/review/flows/{flow.pk}/").content.decode()
    panel = html.split('id="closing-the-loop"', 1)[1].split("</section>", 1)[0]
    assert 'id="audit-warning"' in panel and 'href="/evaluations/41/"' in panel
    assert re.search(r'id="closing-reviewed">.*?>5</td>.*?>3</td>.*?0\.600', panel, re.S)
    assert f"{clopper_pearson_upper(1, 10, 0.1):.4f}" in panel


def test_register_and_evaluate_from_a_job_without_a_version(client, owner, project, demo_job):
    from hosting.models import ModelVersion

    client = page_for(client, owner)
    html = client.get(f"/evaluations/new/?job={demo_job.pk}").content.decode()
    assert 'id="register-and-evaluate"' in html
    response = client.post(f"/evaluations/new/register/{demo_job.pk}/", {"name": "biomes"})
    version = ModelVersion.objects.get(job=demo_job)
    assert response.status_code == 302 and response["Location"].endswith(f"?model_version={version.pk}")
    assert 'id="evaluation-form"' in client.get(response["Location"]).content.decode()
    refused = client.post(f"/evaluations/new/register/{demo_job.pk}/", {"name": " "}, follow=True).content.decode()
    assert "name:" in refused and ModelVersion.objects.filter(job=demo_job).count() == 1
