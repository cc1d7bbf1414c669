"""A completed human loop's output JSON, downloaded through the API and linked from the
flow's page: streamed from the object store, readers only, 409 until the
output is written, a presigned redirect where the store is S3."""

from __future__ import annotations

import json
import uuid

import pytest
import requests
from django.test import Client

from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot
from review.models import HumanLoop
from review.output import loop_output
from review.tasks import write_output_task

pytestmark = pytest.mark.django_db


def complete(loop: HumanLoop, user) -> HumanLoop:
    held = claim_next_slot(user, loop.flow_definition)
    assert held is not None and held.loop_id == loop.pk
    answer_slot(held.pk, user, {"label": "cat"})
    write_output_task(loop.pk)  # what the control worker runs once the loop completes
    return HumanLoop.objects.get(pk=loop.pk)


def test_a_completed_loops_output_downloads_for_a_viewer(make_flow, make_loops, reviewer, viewer, owner, client_for):
    flow = make_flow()
    first, waiting = make_loops(flow, 2, content=lambda i: {"text": f"<b>item</b> {i}"})
    done = complete(first, reviewer)
    client = client_for(viewer)
    detail = client.get(f"/api/v1/human-loops/{done.name}/").json()
    assert detail["output_url"] == f"/api/v1/human-loops/{done.name}/output"
    response = client.get(detail["output_url"])
    assert response.status_code == 200, response.content
    assert response["Content-Disposition"] == f'attachment; filename="{done.name}-output.json"'
    body = json.loads(b"".join(response.streaming_content))
    assert body["humanLoopName"] == done.name and body["consolidatedAnswer"]["label"] == "cat"
    assert body == json.loads(json.dumps(loop_output(done)))

    pending = client.get(f"/api/v1/human-loops/{waiting.name}/output")
    assert pending.status_code == 409 and pending.json()["error"]["code"] == "not_ready"
    assert client.get(f"/api/v1/human-loops/{waiting.name}/").json()["output_url"] is None

    page = Client()
    page.force_login(owner)
    html = page.get(f"/review/flows/{flow.pk}/").content.decode()
    assert f'href="/api/v1/human-loops/{done.name}/output"' in html
    assert f'href="/api/v1/human-loops/{waiting.name}/output"' not in html


def test_outsiders_and_reviewers_cannot_download_a_loops_output(make_flow, make_loops, reviewer, outsider,
                                                                client_for):
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    done = complete(loop, reviewer)
    for user in (outsider, reviewer):  # the reviewer answered it, but reads no project data
        response = client_for(user).get(f"/api/v1/human-loops/{done.name}/output")
        assert response.status_code == 404, user.username
    assert client_for(outsider).get("/api/v1/human-loops/no-such-loop/output").status_code == 404


def test_on_s3_the_output_is_a_presigned_redirect(make_flow, make_loops, reviewer, owner, client_for, s3, settings):
    bucket = f"bucket-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    settings.STUDIO_OBJECT_STORE = f"s3://{bucket}/studio"
    flow = make_flow()
    [loop] = make_loops(flow, 1)
    done = complete(loop, reviewer)
    assert done.output_uri.startswith(f"s3://{bucket}/studio/review/")
    response = client_for(owner).get(f"/api/v1/human-loops/{done.name}/output")
    assert response.status_code == 302
    fetched = requests.get(response["Location"], timeout=10)
    assert fetched.status_code == 200 and fetched.json()["humanLoopName"] == done.name
