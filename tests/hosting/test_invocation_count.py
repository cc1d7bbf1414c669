"""The invocation counter the endpoint page shows: reading an endpoint
writes this process's pending counts first, and a read with nothing pending does not
delay the next invocation's own write (which another process's page may be waiting for)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from hosting import actions, invocation
from hosting.models import Endpoint
from tests.hosting.conftest import features, held_rows


@pytest.fixture(autouse=True)
def own_pending_counts(monkeypatch):
    """Counts pending from another test (whose rows were rolled back) stay out of this one."""
    monkeypatch.setattr(invocation, "_pending_counts", Counter())


@pytest.fixture
def endpoint(owner, demo_job):
    version = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    return actions.create_endpoint(project=demo_job.project, name="biomes-count", model_version=version, user=owner)


def invoke(client, endpoint, row) -> None:
    response = client.post(f"/api/v1/endpoints/{endpoint.name}/invocations", {"instances": [row]}, format="json")
    assert response.status_code == 200, response.content


def test_reading_the_endpoint_includes_counts_still_pending(owner, client_for, endpoint, demo_model_artifact,
                                                            monkeypatch):
    client = client_for(owner)
    row = features(held_rows(demo_model_artifact)[0])
    monkeypatch.setattr(invocation, "_last_flush", time.monotonic() - 10)  # a flush is due
    invoke(client, endpoint, row)  # so its count is written at once
    assert Endpoint.objects.get(pk=endpoint.pk).invocations == 1
    monkeypatch.setattr(invocation, "_last_flush", time.monotonic())  # just flushed: the next counts wait
    invoke(client, endpoint, row)
    invoke(client, endpoint, row)
    assert Endpoint.objects.get(pk=endpoint.pk).invocations == 1  # summed in memory for now
    assert client.get(f"/api/v1/endpoints/{endpoint.name}/").json()["invocations"] == 3


def test_a_read_with_nothing_pending_does_not_hold_back_the_next_count(owner, client_for, endpoint,
                                                                       demo_model_artifact, monkeypatch):
    client = client_for(owner)
    row = features(held_rows(demo_model_artifact)[0])
    invoke(client, endpoint, row)  # the model loaded
    invocation.flush_invocation_counts()  # its count written, whenever that was due
    monkeypatch.setattr(invocation, "_last_flush", time.monotonic() - 10)
    assert client.get(f"/api/v1/endpoints/{endpoint.name}/").json()["invocations"] == 1
    invoke(client, endpoint, row)
    # Written by the invocation itself: a page served by another process sees it.
    assert Endpoint.objects.get(pk=endpoint.pk).invocations == 2
