"""The evaluations API on the demo tabular model: a report whose figures are the
library's, calibration that endpoints then serve, a threshold proposal applied to a flow
and recorded where the issue says, and every bad input refused with nothing written."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from datasets.actions import VersionOptions, register_local_files
from datasets.validation_run import run_validation
from evaluations.models import Evaluation
from evaluations.run import read_scores, run_evaluation
from hosting.actions import create_endpoint
from hosting.models import ModelVersion
from review.export import export_flow
from review.models import FlowDefinition, HumanLoop
from tests.evaluations.conftest import evaluate, make_flow
from tests.hosting.conftest import features, held_rows


def _csv_version(project, owner, tmp_path, name: str, rows: list[dict]):
    path = tmp_path / f"{name}.csv"
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    version, _ = register_local_files(project=project, name=name, description="", user=owner, files={"data.csv": path},
                                      options=VersionOptions(format="csv"))
    assert run_validation(version.pk) == "ready"
    version.refresh_from_db()
    return version


def test_an_evaluation_runs_to_a_report_with_the_libraries_figures(owner, client_for, project, model_version,
                                                                    demo_version, demo_model_artifact):
    client = client_for(owner)
    response = client.post("/api/v1/evaluations/", {"project": project.slug, "model_version": model_version.pk,
                                                    "dataset_version": demo_version.pk, "target_error": 0.1},
                           format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "Pending" and body["records_total"] == 600
    assert run_evaluation(body["id"]) == "Completed"

    detail = client.get(f"/api/v1/evaluations/{body['id']}/").json()
    assert detail["status"] == "Completed", detail["failure_reason"]
    report = detail["report"]
    assert report["n"] == 600
    # The same figures scikit-learn gives on the stored scores (predicted by the model's own predictor).
    evaluation = Evaluation.objects.get(pk=body["id"])
    scores = read_scores(evaluation)
    predicted = scores.logits.argmax(axis=1)
    assert report["accuracy"] == pytest.approx(accuracy_score(scores.targets, predicted), abs=1e-12)
    assert report["macro_f1"] == pytest.approx(f1_score(scores.targets, predicted, average="macro"), abs=1e-12)
    truth = [row["label"] for row in held_rows(demo_model_artifact)]
    assert [evaluation.labels[t] for t in scores.targets] == truth
    assert report["accuracy"] > 0.8  # the demo model is good; a broken reader would be near 1/3
    assert np.asarray(report["confusion_matrix"]).sum() == 600
    assert len(report["per_class"]) == 3 and report["calibration"]["bins"]["width"]
    low, high = report["intervals"]["accuracy"]
    assert low <= report["accuracy"] <= high

    calibration = detail["calibration"]
    assert calibration["calibration_items"] + calibration["test_items"] == 600
    assert calibration["temperature"] > 0 and math.isfinite(calibration["temperature"])
    assert calibration["after"]["nll"] <= calibration["before"]["nll"] + 0.02  # fitted on the other half
    assert calibration["after"]["accuracy"] == calibration["before"]["accuracy"]  # argmax unchanged
    proposal = detail["proposal"]
    assert proposal["target_error"] == 0.1 and proposal["n"] == calibration["calibration_items"]
    assert proposal["risk"]["risk_upper"] <= 0.1
    assert set(proposal["measured"]) >= {"risk", "fixed_0.8"}
    assert detail["headline"]["accuracy"] == report["accuracy"]

    listed = client.get(f"/api/v1/evaluations/?project={project.slug}&model_version={model_version.pk}").json()
    assert [row["id"] for row in listed["results"]] == [body["id"]]
    assert "report" not in listed["results"][0]


def test_calibration_is_served_by_the_endpoint_and_a_threshold_applied_to_a_flow_is_recorded(
        owner, client_for, project, completed_evaluation, model_version, demo_model_artifact):
    client = client_for(owner)
    flow = make_flow(project, owner, confidence_below=0.8)
    create_endpoint(project=project, name="biomes-calibrated", model_version=model_version, flow_definition=flow.pk,
                    user=owner)
    rows = [features(row) for row in held_rows(demo_model_artifact)[:20]]
    raw = client.post("/api/v1/endpoints/biomes-calibrated/invocations", {"instances": rows}, format="json").json()
    assert raw["calibrated"] is False

    response = client.post(f"/api/v1/model-versions/{model_version.pk}/calibration/",
                           {"evaluation": completed_evaluation.pk}, format="json")
    assert response.status_code == 200, response.json()
    temperature = completed_evaluation.calibration["temperature"]
    assert response.json()["calibration"]["temperature"] == temperature
    served = client.post("/api/v1/endpoints/biomes-calibrated/invocations", {"instances": rows}, format="json").json()
    assert served["calibrated"] is True and served["temperature"] == temperature
    assert served["calibration"]["evaluation"] == completed_evaluation.pk
    # Same labels; the confidences are the softmax of the logits over T.
    assert [p["label"] for p in served["predictions"]] == [p["label"] for p in raw["predictions"]]
    from hosting.serving import predictor_for

    logits = predictor_for(ModelVersion.objects.get(pk=model_version.pk)).logits(rows).double()
    expected = (logits / temperature).softmax(-1).max(-1).values.tolist()
    assert [p["confidence"] for p in served["predictions"]] == pytest.approx(expected, abs=1e-9)

    # A batch prediction over the version's data serves the same calibrated numbers, line by line.
    from hosting.actions import submit_batch_prediction
    from hosting.batch import run_batch_prediction
    from tests.hosting.test_batch import read_lines

    batch = submit_batch_prediction(project=project, model_version=ModelVersion.objects.get(pk=model_version.pk),
                                    dataset_version=completed_evaluation.dataset_version, user=owner)
    assert run_batch_prediction(batch.pk) == "Completed"
    batch.refresh_from_db()
    lines = read_lines(batch.output_uri)
    assert lines[0]["calibrated"] is True and lines[0]["temperature"] == temperature

    activation = client.post(f"/api/v1/flow-definitions/{flow.pk}/activation/",
                             {"evaluation": completed_evaluation.pk, "choice": "risk"}, format="json")
    assert activation.status_code == 200, activation.json()
    result = activation.json()
    flow.refresh_from_db()
    threshold = result["threshold"]
    assert flow.activation["confidence_below"] == threshold != 0.8
    assert flow.calibration["evaluation"] == completed_evaluation.pk
    assert flow.calibration["temperature"] == temperature and flow.calibration["target_error"] == 0.1
    assert flow.calibration["threshold"] == threshold and result["warnings"] == []
    assert result["flow"]["calibration"]["threshold"] == threshold

    # Loops start below the new threshold, on calibrated confidences; an export records the routing.
    served = client.post("/api/v1/endpoints/biomes-calibrated/invocations", {"instances": rows}, format="json").json()
    below = [p for p in served["predictions"] if p["confidence"] < threshold]
    assert len(served["human_loops"]) == len(below)
    if served["human_loops"]:
        loop = HumanLoop.objects.get(name=served["human_loops"][0])
        loop.status, loop.consolidated_label = "Completed", loop.prediction["label"]
        loop.save()
        version = export_flow(FlowDefinition.objects.get(pk=flow.pk), owner, dataset_name="reviewed", mode="reviewed_only")
        assert version.provenance["calibration"]["threshold"] == threshold
        assert version.provenance["calibration"]["evaluation"] == completed_evaluation.pk


def test_a_new_proposal_with_costs_gives_a_cost_threshold(owner, client_for, project, completed_evaluation):
    client = client_for(owner)
    response = client.post(f"/api/v1/evaluations/{completed_evaluation.pk}/proposal/",
                           {"target_error": 0.08, "review_cost": 1.0, "error_cost": 20.0}, format="json")
    assert response.status_code == 200, response.json()
    proposal = response.json()
    costs = [row["cost"] for row in proposal["candidates"]]
    assert proposal["cost"]["cost"] == pytest.approx(min(costs))
    assert Evaluation.objects.get(pk=completed_evaluation.pk).proposal["target_error"] == 0.08
    bad = client.post(f"/api/v1/evaluations/{completed_evaluation.pk}/proposal/", {"target_error": 0.7}, format="json")
    assert bad.status_code == 400 and "target_error" in bad.json()["error"]["fields"]
    half = client.post(f"/api/v1/evaluations/{completed_evaluation.pk}/proposal/", {"review_cost": 1, "error_cost": None},
                       format="json")
    assert half.status_code == 400 and "error_cost" in half.json()["error"]["fields"]


@pytest.mark.parametrize("body, field", [
    ({"target_error": 0}, "target_error"),
    ({"target_error": 0.51}, "target_error"),
    ({"target_error": "lots"}, "target_error"),
    ({"delta": 1}, "delta"),
    ({"calibration_fraction": 1.0}, "calibration_fraction"),
    ({"target_error": 0.005}, "calibration_fraction"),  # 300 calibration items cannot bound 0.5 %
    ({"channel": "holdout"}, "channel"),
    ({"channel": "test"}, "channel"),  # the version has no test channel
    ({"flow_definition": 99999}, "flow_definition"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_requests_are_400_naming_the_field_and_write_nothing(owner, client_for, project, model_version, demo_version,
                                                                 body, field):
    client = client_for(owner)
    response = client.post("/api/v1/evaluations/", {"project": project.slug, "model_version": model_version.pk,
                                                    "dataset_version": demo_version.pk, **body}, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"], response.json()
    assert not Evaluation.objects.exists()


def test_data_of_another_project_or_with_no_label_in_common_is_refused(owner, outsider, client_for, project,
                                                                       other_project, model_version, tmp_path):
    theirs = _csv_version(other_project, outsider, tmp_path, "theirs", [{"label": "alpine", "x": "1"}] * 3)
    client = client_for(owner)
    response = client.post("/api/v1/evaluations/", {"project": project.slug, "model_version": model_version.pk,
                                                    "dataset_version": theirs.pk}, format="json")
    assert response.status_code == 400 and "dataset_version" in response.json()["error"]["fields"]
    fruit = _csv_version(project, owner, tmp_path, "fruit", [{"label": name, "x": "1"} for name in ("apple", "pear")] * 200)
    response = client.post("/api/v1/evaluations/", {"project": project.slug, "model_version": model_version.pk,
                                                    "dataset_version": fruit.pk}, format="json")
    assert response.status_code == 400
    message = response.json()["error"]["fields"]["dataset_version"][0]
    assert "no label in common" in message and "apple" in message and "alpine" in message
    assert not Evaluation.objects.exists()


def test_data_without_the_label_column_or_with_unknown_labels_fails_with_a_reason_naming_both(
        owner, project, model_version, demo_model_artifact, tmp_path):
    rows = held_rows(demo_model_artifact)
    unlabelled = _csv_version(project, owner, tmp_path, "unlabelled", [features(row) for row in rows])
    failed = evaluate(project, owner, model_version, unlabelled, target_error=0.2)
    assert failed.status == "Failed"
    assert "no column 'label'" in failed.failure_reason and "biomes v1" in failed.failure_reason
    assert failed.report == {} and failed.artifacts == {}

    mixed = [dict(row) for row in rows]
    for row in mixed[:7]:
        row["label"] = "tundra"
    unknown = _csv_version(project, owner, tmp_path, "unknown-labels", mixed)
    failed = evaluate(project, owner, model_version, unknown, target_error=0.2)
    assert failed.status == "Failed"
    assert "'tundra' (7)" in failed.failure_reason and "alpine" in failed.failure_reason


def test_outsiders_and_viewers(owner, viewer, outsider, client_for, project, completed_evaluation, model_version):
    assert client_for(outsider).get(f"/api/v1/evaluations/{completed_evaluation.pk}/").status_code == 404
    assert client_for(viewer).get(f"/api/v1/evaluations/{completed_evaluation.pk}/").status_code == 200
    response = client_for(viewer).post(f"/api/v1/model-versions/{model_version.pk}/calibration/",
                                       {"evaluation": completed_evaluation.pk}, format="json")
    assert response.status_code in (403, 404)
    assert ModelVersion.objects.get(pk=model_version.pk).calibration == {}
    assert client_for(outsider).get(f"/api/v1/evaluations/?project={project.slug}").status_code in (403, 404)


def test_deleting_an_evaluation_removes_its_scores(owner, client_for, completed_evaluation):
    from datasets.storage import store_for

    uri = completed_evaluation.artifacts["scores"]
    assert store_for(uri).exists(uri)
    response = client_for(owner).delete(f"/api/v1/evaluations/{completed_evaluation.pk}/")
    assert response.status_code == 204
    assert not Evaluation.objects.filter(pk=completed_evaluation.pk).exists()


def test_data_an_evaluation_read_is_kept_and_a_model_versions_delete_takes_its_evaluations(
        owner, client_for, project, completed_evaluation, model_version, demo_version):
    from datasets.storage import store_for
    from studio.deletion import PendingDeletion

    client = client_for(owner)
    blocked = client.delete(f"/api/v1/dataset-versions/{demo_version.pk}/")
    assert blocked.status_code == 409
    assert f"evaluation '{completed_evaluation.pk}" in blocked.json()["error"]["message"]
    uri = completed_evaluation.artifacts["scores"]
    gone = client.delete(f"/api/v1/models/{model_version.model_id}/versions/{model_version.version}/")
    assert gone.status_code == 204, gone.json()
    assert not Evaluation.objects.exists()
    assert any(uri in pending.uris for pending in PendingDeletion.objects.all()) or not store_for(uri).exists(uri)


@pytest.mark.parametrize("path", [
    "/api/v1/evaluations/?model_version=99999999999999999999999",
    "/api/v1/evaluations/?model=-1",
    "/api/v1/evaluations/compare/?a=1&b=99999999999999999999999",
    "/api/v1/human-loops/?flow_definition=99999999999999999999999",
    "/api/v1/jobs/?dataset=99999999999999999999999",
])
def test_an_id_past_what_a_key_can_hold_is_a_400_naming_it(owner, client_for, path):
    response = client_for(owner).get(path)
    assert response.status_code == 400, response.content
    name = path.split("?")[1].split("&")[-1].split("=")[0]
    assert name in response.json()["error"]["fields"]
