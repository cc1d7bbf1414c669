"""A NUL character (%00 / \\u0000) in a URL or a body is a 400 naming where it is, on every
endpoint, never the 500 PostgreSQL's "text fields cannot contain NUL" turned it into
when the row was written. The operations come from the OpenAPI schema, so endpoints added
later are covered without editing this file."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

from studio.models import Project
from tests.hosting.conftest import demo_job, demo_model_artifact, demo_version, model_cache_dir  # noqa: F401

pytestmark = pytest.mark.django_db


def operations() -> list[tuple[str, str, dict]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()
            if method in ("get", "post", "put", "patch", "delete")]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def query_parameters(op: dict) -> list[str]:
    return [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]


def test_every_query_parameter_of_every_get_operation_with_a_nul_is_a_400_naming_it(owner, client_for):
    client = client_for(owner)
    checked, wrong = [], []
    for path, method, op in operations():
        if method != "get":
            continue
        for name in [*query_parameters(op), "search", "unknown"]:
            response = client.get(f"{concrete(path)}?{name}=a%00b")
            checked.append((path, name))
            if response.status_code != 400:
                wrong.append((path, name, response.status_code))
                continue
            error = response.json()["error"]
            assert error["code"] == "invalid"
            assert name in error["fields"], (path, error)
    assert not wrong, f"{len(wrong)} of {len(checked)}: {wrong}"
    lists = {path for path, _ in checked if "{" not in path}
    # Every list endpoint the issue names, and the ones it did not.
    for path in ("/api/v1/jobs/", "/api/v1/datasets/", "/api/v1/flow-definitions/", "/api/v1/tuning-jobs/",
                 "/api/v1/models/", "/api/v1/endpoints/", "/api/v1/human-loops/", "/api/v1/work-teams/",
                 "/api/v1/dataset-versions/", "/api/v1/batch-predictions/", "/api/v1/projects/", "/api/v1/nodes/"):
        assert path in lists
    assert ("/api/v1/jobs/", "project") in checked and ("/api/v1/jobs/", "search") in checked


def test_a_nul_in_a_parameter_name_or_beside_other_parameters_is_a_400(owner, client_for):
    client = client_for(owner)
    response = client.get("/api/v1/jobs/?status=Completed&pro%00ject=acme")
    assert response.status_code == 400
    assert "pro\\x00ject" in response.json()["error"]["fields"]
    response = client.get("/api/v1/datasets/?project=acme&search=x%00")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["search"]


@pytest.mark.parametrize("path", ["/api/v1/endpoints/a%00b/", "/api/v1/human-loops/a%00b/", "/api/v1/nodes/a%00b/",
                                  "/api/v1/endpoints/a%00b/invocations", "/api/v1/projects/a%00b/members/",
                                  "/api/v1/human-loops/a%00b/stop/"])
def test_a_nul_in_a_path_part_is_a_400(owner, client_for, path):
    client = client_for(owner)
    response = client.post(path, {}, format="json") if path.endswith(("invocations", "stop/")) else client.get(path)
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"path": ["Contains a NUL character (%00)."]}


def test_pages_answer_a_plain_400(owner):
    client = Client()
    client.force_login(owner)
    for url in ("/jobs/?q=a%00b", "/datasets/?project=a%00b", "/models/endpoints/a%00b/", "/datasets/versions/1/files/a%00b.csv"):
        response = client.get(url)
        assert response.status_code == 400, url
        assert response["Content-Type"].startswith("text/plain")
        assert "NUL" in response.content.decode()


def test_a_nul_in_a_json_body_field_is_a_400_naming_the_field(owner, client_for):
    client = client_for(owner)
    response = client.post("/api/v1/projects/", {"slug": "nul-test", "name": "a\x00b"}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"name": ["Contains a NUL character (\\u0000), which is not allowed."]}
    response = client.post("/api/v1/jobs/", {"project": "acme", "name": "j", "hyperparameters": {"lr": "0.1\x00"}},
                           format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["hyperparameters.lr"]
    response = client.post("/api/v1/jobs/", {"project": "acme", "name": "j", "tags": ["a", "b\x00"]}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["tags[1]"]  # list items by index, as rules[0].type
    response = client.post("/api/v1/datasets/", {"project": "acme", "name": "d\x00", "source_uri": "file:///x"})
    assert response.status_code == 400  # multipart form fields too
    assert list(response.json()["error"]["fields"]) == ["name"]
    response = client.post("/api/v1/scripts/", {"project": "ac\x00me"})
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["project"]
    assert not Project.objects.filter(slug="nul-test").exists()


def test_a_nul_in_an_invocation_is_a_400_naming_the_instance_field(project, owner, client_for, demo_job):  # noqa: F811
    from hosting import actions as hosting_actions

    version = hosting_actions.register_model(project=project, name="demo", job=demo_job, user=owner)
    hosting_actions.create_endpoint(project=project, name="demo-ep", model_version=version, user=owner)
    response = client_for(owner).post("/api/v1/endpoints/demo-ep/invocations",
                                      {"instances": [{"sepal": "1.0"}, {"sepal": "2\x00"}]}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert list(response.json()["error"]["fields"]) == ["instances[1].sepal"]
