"""Studio pages through Django's test client: sign-in, the reviewer redirect, the
overview's empty states, section pages, the project switcher and the display helpers."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import Node, NodeState, TrainingJob
from studio.actions import set_membership
from studio.templatetags.studio_tags import human_bytes, relative_phrase, reltime, status_badge

SECTION_ROUTES = ("overview", "dataset-list", "dataset-upload", "job-list", "tuning", "models", "nodes", "review-inbox")


def form_post(client: Client, url: str, data: dict | None = None):
    """POST as a browser sends a plain form (urlencoded), not as the test client's multipart."""
    return client.post(url, urlencode(data or {}), content_type="application/x-www-form-urlencoded")


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_every_page_requires_login(db):
    for route in SECTION_ROUTES:
        response = Client().get(reverse(route))
        assert response.status_code == 302, route
        assert response["Location"] == f"{reverse('login')}?next={reverse(route)}", route


def test_sign_in_through_the_login_page_then_sign_out(owner):
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200 and 'name="password"' in page.content.decode()
    signed_in = form_post(client, reverse("login"), {"username": "owner", "password": "pw-owner-123"})
    assert signed_in.status_code == 302 and signed_in["Location"] == reverse("overview")
    overview = client.get(reverse("overview")).content.decode()
    assert f'action="{reverse("logout")}"' in overview
    assert client.get(reverse("logout")).status_code == 405  # a link cannot sign anyone out
    assert form_post(client, reverse("logout")).status_code == 302
    assert client.get(reverse("overview")).status_code == 302


def test_wrong_password_says_so(owner):
    response = form_post(Client(), reverse("login"), {"username": "owner", "password": "nope"})
    assert response.status_code == 200
    assert "correct username and password" in response.content.decode()


def test_reviewer_only_user_is_sent_to_the_inbox(reviewer):
    client = login(reviewer)
    for route in ("overview", "dataset-list", "job-list", "nodes", "tuning", "models", "dataset-upload"):
        response = client.get(reverse(route))
        assert response.status_code == 302, route
        assert response["Location"] == reverse("review-inbox"), route
    inbox = client.get(reverse("review-inbox"))
    assert inbox.status_code == 200
    body = inbox.content.decode()
    assert "Your inbox is empty" in body
    # The navigation shows only what a reviewer can open.
    assert f'href="{reverse("dataset-list")}"' not in body
    assert f'href="{reverse("review-inbox")}"' in body


def test_reviewer_in_one_project_and_scientist_in_another_is_not_redirected(reviewer, other_project):
    set_membership(project=other_project, user=reviewer, role="scientist")
    assert login(reviewer).get(reverse("overview")).status_code == 200


def test_overview_empty_states_say_what_to_do_next(teammate):
    body = login(teammate).get(reverse("overview")).content.decode()
    assert "No datasets yet" in body
    assert f'href="{reverse("dataset-upload")}"' in body
    assert "No nodes yet" in body and "studio worker" in body
    assert "Nothing is training" in body


def test_overview_for_a_viewer_offers_no_upload(viewer):
    body = login(viewer).get(reverse("overview")).content.decode()
    assert "No datasets yet" in body
    assert f'href="{reverse("dataset-upload")}"' not in body


def test_overview_lists_projects_with_roles_and_nodes(owner, other_project):
    set_membership(project=other_project, user=owner, role="viewer")
    Node.objects.create(name="node-a", hostname="h1", queue="q.a", state=NodeState.IDLE)
    body = login(owner).get(reverse("overview")).content.decode()
    assert "Acme" in body and "Rival" in body
    assert 'role--admin' in body and 'role--viewer' in body
    assert "node-a" in body and 'data-status="idle"' in body
    assert 'id="project-switcher"' in body  # two projects → a switcher


def test_project_switcher_narrows_lists_and_is_remembered(owner, project, other_project):
    set_membership(project=other_project, user=owner, role="admin")
    TrainingJob.objects.create(project=project, name="acme-job")
    TrainingJob.objects.create(project=other_project, name="rival-job")
    client = login(owner)
    both = client.get(reverse("job-list")).content.decode()
    assert "acme-job" in both and "rival-job" in both
    narrowed = client.get(reverse("job-list") + "?project=rival").content.decode()
    assert "rival-job" in narrowed and "acme-job" not in narrowed
    assert "acme-job" not in client.get(reverse("job-list")).content.decode()  # remembered in the session
    assert "acme-job" in client.get(reverse("job-list") + "?project=").content.decode()


def test_project_switcher_ignores_projects_of_others(owner, other_project):
    TrainingJob.objects.create(project=other_project, name="rival-job")
    client = login(owner)
    body = client.get(reverse("job-list") + "?project=rival").content.decode()
    assert "rival-job" not in body
    assert client.session.get("studio_project") is None


def test_jobs_page_empty_state_and_rows(teammate, project):
    client = login(teammate)
    empty = client.get(reverse("job-list")).content.decode()
    assert "No training jobs yet" in empty and reverse("dataset-list") in empty
    TrainingJob.objects.create(project=project, name="resnet-1", status="Training")
    TrainingJob.objects.create(project=project, name="broken", status="Failed", failure_reason="CUDA out of memory")
    body = client.get(reverse("job-list")).content.decode()
    assert "resnet-1" in body and "badge--violet" in body
    assert "badge--red" in body and "CUDA out of memory" in body


def test_nodes_page_lists_nodes_with_states_and_the_worker_command(teammate):
    now = timezone.now()
    Node.objects.create(name="gpu-1", hostname="box", queue="q1", instance_type="gpu", gpus=2, state=NodeState.BUSY,
                        last_heartbeat=now)
    Node.objects.create(name="cpu-9", hostname="box", queue="q2", state=NodeState.IDLE,
                        last_heartbeat=now - timedelta(minutes=5))
    body = login(teammate).get(reverse("nodes")).content.decode()
    assert "gpu-1" in body and 'data-status="busy"' in body
    assert "cpu-9" in body and "no heartbeat for" in body  # silent but not yet swept
    assert "python manage.py studio worker" in body


def test_nodes_page_empty_state(teammate):
    body = login(teammate).get(reverse("nodes")).content.decode()
    assert "No nodes yet" in body and "studio worker --queue cpu" in body


def test_pages_load_htmx_and_no_cdn(teammate):
    body = login(teammate).get(reverse("overview")).content.decode()
    assert "/static/django_htmx/htmx" in body
    assert re.search(r"/static/css/studio\.[0-9a-f]{12}\.css", body)  # hashed: cached for good
    assert "https://" not in body and "http://" not in body.replace('xmlns="http://www.w3.org', "")
    assert "plotly" not in body  # only pages with charts load it


def test_static_assets_are_served(teammate):
    client = login(teammate)
    for path in ("/static/css/studio.css", "/static/js/tables.js", "/static/vendor/plotly/plotly.min.js"):
        response = client.get(path)
        assert response.status_code == 200, path


# --- display helpers ------------------------------------------------------------------------
def test_reltime_gives_a_phrase_with_the_exact_time_on_hover():
    moment = timezone.now() - timedelta(minutes=3, seconds=10)
    html = str(reltime(moment))
    assert ">3 min ago</time>" in html
    assert f'datetime="{moment.isoformat()}"' in html
    assert 'title="' + timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") in html
    assert reltime(None) == "—"


@pytest.mark.parametrize(("seconds", "phrase"), [
    (2, "just now"), (42, "42 s ago"), (3600 * 5 + 10, "5 h ago"), (86400, "1 day ago"), (86400 * 3, "3 days ago"), (-120, "in 2 min"),
])
def test_relative_phrases(seconds, phrase):
    now = timezone.now()
    assert relative_phrase(now - timedelta(seconds=seconds), now) == phrase


@pytest.mark.parametrize(("status", "colour"), [
    ("Pending", "grey"), ("Starting", "blue"), ("Training", "violet"), ("Uploading", "teal"), ("Completed", "green"),
    ("Stopping", "amber"), ("Stopped", "amber"), ("Failed", "red"), ("validating", "blue"), ("ready", "green"),
    ("invalid", "red"), ("InProgress", "blue"), ("Expired", "grey"),
])
def test_status_colours_mean_the_same_everywhere(status, colour):
    assert f"badge--{colour}" in str(status_badge(status))


def test_status_badge_escapes_unknown_values():
    html = str(status_badge("<b>odd</b>"))
    assert "<b>" not in html and "badge--grey" in html


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(2 * 1024**3) == "2.0 GiB"
    assert human_bytes(5 * 1024**5) == "5120.0 TiB"
    assert human_bytes(None) == "—"
