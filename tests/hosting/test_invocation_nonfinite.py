"""Found by using the studio: an invocation body holding NaN, Infinity or a number
too large for a float (1e400) was accepted by Python's json module; with a review flow attached
the human loop's JSON column refused it (a 500), without one the answer was not valid JSON.
JSON has no such numbers: the body is a 400 that says why."""

from __future__ import annotations

import json

import pytest

from tests.hosting.conftest import features, held_rows
from tests.hosting.test_endpoints import endpoint, model_version  # noqa: F401 - fixtures


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_number_in_the_body_is_a_400(owner, client_for, endpoint, demo_model_artifact,  # noqa: F811
                                                literal):
    row = features(held_rows(demo_model_artifact)[0])
    numeric = endpoint.model_version.input_schema["numeric"][0]
    body = json.dumps({"instances": [{**row, numeric: 0.5}]}).replace("0.5", literal, 1)
    assert literal in body
    response = client_for(owner).post("/api/v1/endpoints/biomes-live/invocations", body,
                                      content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert "finite" in error["message"]


def test_finite_numbers_still_predict(owner, client_for, endpoint, demo_model_artifact):  # noqa: F811
    row = features(held_rows(demo_model_artifact)[0])
    response = client_for(owner).post("/api/v1/endpoints/biomes-live/invocations",
                                      json.dumps({"instances": [row]}), content_type="application/json")
    assert response.status_code == 200, response.content
    json.loads(response.content, parse_constant=lambda name: pytest.fail(f"{name} in the answer"))


@pytest.mark.parametrize("text", ["nan", "inf", "-Infinity"])
def test_non_finite_text_in_a_numeric_feature_is_a_400(owner, client_for, endpoint, demo_model_artifact,  # noqa: F811
                                                       text):
    row = features(held_rows(demo_model_artifact)[0])
    numeric = endpoint.model_version.input_schema["numeric"][0]
    response = client_for(owner).post("/api/v1/endpoints/biomes-live/invocations",
                                      json.dumps({"instances": [{**row, numeric: text}]}),
                                      content_type="application/json")
    assert response.status_code == 400, response.content
    assert f"feature '{numeric}' must be a number" in response.json()["error"]["message"]
