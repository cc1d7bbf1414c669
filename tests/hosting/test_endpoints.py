"""Endpoints: create, invoke (one row, many rows, the wrong shape), the predictor loaded
once per process, the atomic version switch under load, human loops by confidence, and
who may do what."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter

import pytest
from django.conf import settings
from django.db import connections
from rest_framework.test import APIClient

from hosting import actions, serving
from hosting.models import Endpoint
from review.models import HumanLoop
from studio import actions as studio_actions
from tests.hosting.conftest import features, held_rows, make_flow


@pytest.fixture
def model_version(owner, demo_job):
    return actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)


@pytest.fixture
def endpoint(owner, model_version):
    return actions.create_endpoint(project=model_version.model.project, name="biomes-live",
                                   model_version=model_version, user=owner)


def invoke(client: APIClient, instances, name="biomes-live"):
    return client.post(f"/api/v1/endpoints/{name}/invocations", {"instances": instances}, format="json")


def test_create_by_model_name_and_invoke_one_row(owner, client_for, model_version, demo_model_artifact):
    client = client_for(owner)
    response = client.post("/api/v1/endpoints/", {"project": "acme", "name": "biomes-live", "model": "biomes"},
                           format="json")
    assert response.status_code == 201, response.content
    assert response.json()["model_version"]["version"] == 1
    row = held_rows(demo_model_artifact)[0]
    result = invoke(client, [features(row)])
    assert result.status_code == 200, result.content
    (prediction,) = result.json()["predictions"]
    assert prediction["label"] in ("alpine", "coastal", "desert")
    assert prediction["confidence"] == max(prediction["probabilities"].values())
    assert sum(prediction["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    assert result.json()["human_loops"] == []


def test_many_rows_predict_like_the_predictor_and_accept_lists_in_column_order(owner, client_for, endpoint,
                                                                                demo_model_artifact):
    from algorithms.predict import load_predictor

    rows = [features(row) for row in held_rows(demo_model_artifact)[:200]]
    body = invoke(client_for(owner), rows).json()
    expected = load_predictor(demo_model_artifact["model_dir"]).predict(rows)
    assert [p["label"] for p in body["predictions"]] == [p["label"] for p in expected]
    truth = [row["label"] for row in held_rows(demo_model_artifact)[:200]]
    accuracy = sum(p["label"] == t for p, t in zip(body["predictions"], truth, strict=True)) / len(truth)
    assert accuracy > 0.75  # a real model, not noise
    columns = endpoint.model_version.input_schema["columns"]
    as_lists = invoke(client_for(owner), [[row[c] for c in columns] for row in rows[:5]]).json()
    # The same rows, so the same labels; a batch of 5 and one of 200 may take different BLAS
    # kernels, so probabilities agree to rounding, not to the last bit.
    for listed, named in zip(as_lists["predictions"], body["predictions"][:5], strict=True):
        assert listed["label"] == named["label"]
        assert listed["probabilities"] == pytest.approx(named["probabilities"], rel=1e-6)


@pytest.mark.parametrize(("instances", "message"), [
    ("not a list", "instances: expected a list"),
    ([], "instances: the list is empty"),
    (["text"], "instances[0]: expected an object of feature values"),
    ("MISSING", "instances[2]: missing feature 'feature_03'"),
    ("BADNUMBER", "instances[1]: feature 'feature_01' must be a number, got 'abc'"),
    ([[1, 2, 3]], "instances[0]: a list instance holds 11 values in column order"),
    ([{"feature_01": {"x": 1}}], "instances[0]: feature 'feature_01' must be a number or a string"),
])
def test_wrong_shape_instances_are_400_naming_instances(owner, client_for, endpoint, demo_model_artifact,
                                                        instances, message):
    good = [features(row) for row in held_rows(demo_model_artifact)[:3]]
    if instances == "MISSING":
        del good[2]["feature_03"]
        instances = good
    elif instances == "BADNUMBER":
        good[1]["feature_01"] = "abc"
        instances = good
    elif instances and isinstance(instances[0], dict):
        instances = [{**good[0], **instances[0]}]
    response = invoke(client_for(owner), instances)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "instances" in error["fields"]
    assert error["message"].startswith(message), error["message"]


def test_too_many_instances_and_a_missing_body_are_400(owner, client_for, endpoint, demo_model_artifact):
    client = client_for(owner)
    response = invoke(client, [{}] * (serving.MAX_INSTANCES + 1))
    assert response.status_code == 400 and "at most 10000 per request" in response.json()["error"]["message"]
    # 10,000 real rows are over Django's 2.5 MB form limit, and still fine here.
    rows = [features(row) for row in held_rows(demo_model_artifact)] * 17
    assert len(json.dumps({"instances": rows[:serving.MAX_INSTANCES]})) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    many = invoke(client, rows[:serving.MAX_INSTANCES])
    assert many.status_code == 200 and len(many.json()["predictions"]) == serving.MAX_INSTANCES
    response = client.post("/api/v1/endpoints/biomes-live/invocations", "{nope", content_type="application/json")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = client.post("/api/v1/endpoints/biomes-live/invocations", {"rows": []}, format="json")
    assert response.status_code == 400 and "instances" in response.json()["error"]["fields"]


def test_endpoint_names_are_checked_and_unique(owner, client_for, model_version, endpoint):
    client = client_for(owner)
    for bad in ("has space", "-lead", "x" * 64, "<script>"):
        response = client.post("/api/v1/endpoints/", {"project": "acme", "name": bad, "model": "biomes"}, format="json")
        assert response.status_code == 400 and "name" in response.json()["error"]["fields"]
    taken = client.post("/api/v1/endpoints/", {"project": "acme", "name": "biomes-live", "model": "biomes"}, format="json")
    assert taken.status_code == 409
    unknown = client.post("/api/v1/endpoints/", {"project": "acme", "name": "e2", "model": "nope"}, format="json")
    assert unknown.status_code == 400 and "model" in unknown.json()["error"]["fields"]
    no_version = client.post("/api/v1/endpoints/", {"project": "acme", "name": "e2", "model": "biomes",
                                                    "model_version": 7}, format="json")
    assert no_version.status_code == 400 and "model_version" in no_version.json()["error"]["fields"]


@pytest.mark.django_db(transaction=True)
def test_the_model_is_loaded_once_per_process_even_by_concurrent_first_requests(owner, endpoint, demo_model_artifact):
    from hosting.invocation import invoke as invoke_endpoint

    row = features(held_rows(demo_model_artifact)[0])
    endpoint = Endpoint.objects.select_related("model_version", "flow_definition").get(pk=endpoint.pk)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def first_request() -> None:
        barrier.wait()
        try:
            invoke_endpoint(endpoint, [row])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's connection, so the test database can be dropped

    threads = [threading.Thread(target=first_request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert serving.load_count == 1
    for _ in range(5):
        invoke_endpoint(endpoint, [row])
    assert serving.load_count == 1


@pytest.mark.django_db(transaction=True)
def test_switching_versions_under_concurrent_invocations_fails_no_request(owner, client_for, endpoint, demo_job,
                                                                          demo_model_artifact):
    second = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    first = endpoint.model_version
    row = features(held_rows(demo_model_artifact)[0])
    stop = threading.Event()
    failures: list[str] = []
    served: Counter[int] = Counter()

    def caller() -> None:
        client = client_for(owner)
        try:
            while not stop.is_set():
                response = invoke(client, [row])
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.content[:200]!r}")
                else:
                    served[response.json()["model_version"]] += 1
        finally:
            connections.close_all()

    callers = [threading.Thread(target=caller) for _ in range(4)]
    for thread in callers:
        thread.start()
    try:
        for switch in range(30):
            actions.update_endpoint(Endpoint.objects.get(pk=endpoint.pk), model_version=second if switch % 2 == 0 else first)
            threading.Event().wait(0.02)
    finally:
        stop.set()
        for thread in callers:
            thread.join()
    assert failures == []
    assert served[1] > 0 and served[2] > 0, served


def test_patch_switches_version_and_flow_and_delete_removes(owner, client_for, endpoint, demo_job):
    client = client_for(owner)
    actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    patched = client.patch("/api/v1/endpoints/biomes-live/", {"model_version": 2}, format="json").json()
    assert patched["model_version"]["version"] == 2
    flow = make_flow(demo_job.project, owner)
    assert client.patch("/api/v1/endpoints/biomes-live/", {"flow_definition": flow.pk},
                        format="json").json()["flow_definition"] == flow.pk
    assert client.patch("/api/v1/endpoints/biomes-live/", {"flow_definition": None},
                        format="json").json()["flow_definition"] is None
    bad = client.patch("/api/v1/endpoints/biomes-live/", {"flow_definition": 999999}, format="json")
    assert bad.status_code == 400 and "flow_definition" in bad.json()["error"]["fields"]
    assert client.delete("/api/v1/endpoints/biomes-live/").status_code == 204
    assert client.get("/api/v1/endpoints/biomes-live/").status_code == 404


def test_demo_model_with_a_flow_starts_loops_only_under_the_threshold(owner, client_for, endpoint, project,
                                                                      demo_model_artifact):
    """confidence_below 0.8, no sampling: exactly the predictions under 0.8 go to people."""
    flow = make_flow(project, owner, confidence_below=0.8, sample_percent=0)
    actions.update_endpoint(endpoint, flow_definition=flow)
    rows = [features(row) for row in held_rows(demo_model_artifact)]
    body = invoke(client_for(owner), rows).json()
    confidences = [p["confidence"] for p in body["predictions"]]
    unsure = [i for i, c in enumerate(confidences) if c < 0.8]
    assert 0 < len(unsure) < len(rows)  # the demo model is unsure of some rows, not all
    assert len(body["human_loops"]) == len(unsure)
    loops = list(HumanLoop.objects.filter(name__in=body["human_loops"]))
    assert {loop.activation_reason for loop in loops} == {"confidence_below"}
    assert sorted(loop.confidence for loop in loops) == pytest.approx(sorted(confidences[i] for i in unsure))
    assert all(loop.confidence < 0.8 for loop in loops)
    loop = loops[0]
    assert loop.source == {"endpoint": "biomes-live", "model_version": endpoint.model_version_id}
    assert loop.model_version_id == endpoint.model_version_id
    assert set(loop.input_content["row"]) == set(endpoint.model_version.input_schema["columns"])
    assert loop.prediction["label"] in ("alpine", "coastal", "desert")


def test_sampled_share_of_confident_predictions_goes_to_people_too(owner, client_for, endpoint, project,
                                                                   demo_model_artifact):
    """sample_percent 20: every unsure prediction plus about a fifth of the rest (seeded)."""
    flow = make_flow(project, owner, confidence_below=0.8, sample_percent=20)
    actions.update_endpoint(endpoint, flow_definition=flow)
    rows = [features(row) for row in held_rows(demo_model_artifact)] * 4  # 2,400 predictions
    random.seed(20240607)
    body = invoke(client_for(owner), rows).json()
    unsure = sum(p["confidence"] < 0.8 for p in body["predictions"])
    confident = len(rows) - unsure
    reasons = Counter(HumanLoop.objects.filter(name__in=body["human_loops"]).values_list("activation_reason", flat=True))
    assert reasons["confidence_below"] == unsure
    share = reasons["sampled"] / confident
    # Binomial(confident, 0.2): five standard deviations either side.
    spread = 5 * (0.2 * 0.8 / confident) ** 0.5
    assert 0.2 - spread < share < 0.2 + spread, (share, confident)


def test_readers_invoke_while_reviewers_and_outsiders_get_404(owner, viewer, reviewer, outsider, client_for, endpoint,
                                                              demo_model_artifact):
    row = features(held_rows(demo_model_artifact)[0])
    assert invoke(client_for(viewer), [row]).status_code == 200
    assert client_for(viewer).delete("/api/v1/endpoints/biomes-live/").status_code == 403
    for user in (reviewer, outsider):
        client = client_for(user)
        assert invoke(client, [row]).status_code == 404
        assert client.get("/api/v1/endpoints/biomes-live/").status_code == 404
        assert client.patch("/api/v1/endpoints/biomes-live/", {"model_version": 1}, format="json").status_code == 404
        assert client.get("/api/v1/endpoints/").json()["results"] == []
    assert invoke(APIClient(), [row]).status_code in (401, 403)
    superuser = studio_actions.ensure_user("root", password="pw-root-123")
    superuser.is_superuser = True
    superuser.save()
    assert invoke(client_for(superuser), [row]).status_code == 200


def test_invocation_token_checks_match_the_api_wide_ones(owner, endpoint, demo_model_artifact):
    """The hot path authenticates with its own lean query: a wrong secret, an expired
    token, an inactive user and a malformed header are all refused (401)."""
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from studio.models import ApiToken

    row = features(held_rows(demo_model_artifact)[0])
    token, raw = studio_actions.issue_token(owner, name="t")

    def call(header: str):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        return invoke(client, [row])

    assert call(f"Bearer {raw}").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None
    assert call(f"Bearer {raw[:-2]}xx").status_code == 401
    assert call("Bearer ty_nokey_secret").status_code == 401
    assert call(f"Bearer {raw} extra").status_code == 401
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert call(f"Bearer {raw}").status_code == 401
    ApiToken.objects.filter(pk=token.pk).update(expires_at=None)
    owner.is_active = False
    owner.save()
    assert call(f"Bearer {raw}").status_code == 401
    owner.is_active = True
    owner.save()
    # A signed-in browser needs the CSRF token (the try-it form sends it).
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    response = browser.post("/api/v1/endpoints/biomes-live/invocations", {"instances": [row]},
                            content_type="application/json")
    assert response.status_code == 403
