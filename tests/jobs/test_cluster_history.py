"""The cluster over time: sample_cluster (and its beat task) records the queue and each node's
state and utilisation and forgets old samples; history() downsamples a window; GET
/api/v1/cluster/history/ serves it (job names only to their project's readers, a 400 naming
each bad parameter); the Nodes page holds the charts, with plotly from the studio itself."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.cluster import history, sample_cluster
from jobs.models import ClusterSample, JobStatus, Node, NodeState, SystemMetric, TrainingJob
from jobs.tasks import sample_cluster_task
from studio import actions
from studio.models import Role
from tests import factories
from tests.e2e.conftest import (
    PASSWORD,
    SCREENSHOTS,
    browser_page,  # noqa: F401 - the fixture, for the browser test below
)
from tests.e2e.test_job_pages import sign_in
from tests.factories import make_member

pytestmark = pytest.mark.django_db
URL = "/api/v1/cluster/history/"


def make_node(name: str, **fields) -> Node:
    values = {"hostname": f"{name}.lan", "queue": f"node.{name}", "instance_type": "cpu", "last_heartbeat": timezone.now()}
    values.update(fields)
    return Node.objects.create(name=name, **values)


def make_job(project, name: str, status: str = JobStatus.TRAINING, **fields) -> TrainingJob:
    return factories.make_job(project, name=name, status=status, resources={"instance_type": "cpu"}, **fields)


def iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- sampling ----------------------------------------------------------------------------------
def test_a_sample_records_the_queue_and_each_nodes_state_and_use(project):
    now = timezone.now()
    job = make_job(project, "busy-run")
    make_job(project, "waiting", JobStatus.PENDING, created_at=now - timedelta(seconds=90))
    make_job(project, "waiting-too", JobStatus.PENDING, created_at=now - timedelta(seconds=10))
    make_node("gpu-1", instance_type="gpu", gpus=2, state=NodeState.BUSY, current_job=job)
    make_node("cpu-1", state=NodeState.IDLE)
    make_node("cpu-silent", state=NodeState.BUSY, last_heartbeat=now - timedelta(minutes=5))
    make_node("cpu-gone", state=NodeState.STOPPED)
    SystemMetric.objects.create(job=job, node_name="gpu-1", time=now - timedelta(seconds=2), cpu_percent=42.5,
                                memory_bytes=1, gpu_percent=91.0)
    SystemMetric.objects.create(job=job, node_name="gpu-1", time=now - timedelta(seconds=7), cpu_percent=1.0,
                                memory_bytes=1, gpu_percent=1.0)

    sample = sample_cluster(now)

    sample.refresh_from_db()
    assert sample.queue_depth == 2 and sample.oldest_pending_seconds == pytest.approx(90, abs=1)
    assert sample.nodes == {
        "gpu-1": {"state": "busy", "cpu_percent": 42.5, "gpu_percent": 91.0, "job": job.pk},
        "cpu-1": {"state": "idle", "cpu_percent": None, "gpu_percent": None, "job": None},
        "cpu-silent": {"state": "lost", "cpu_percent": None, "gpu_percent": None, "job": None},
    }


def test_old_samples_are_forgotten_and_the_beat_task_samples(settings):
    settings.STUDIO_CLUSTER_SAMPLE_DAYS = 7
    now = timezone.now()
    old = ClusterSample.objects.create(at=now - timedelta(days=7, minutes=1))
    recent = ClusterSample.objects.create(at=now - timedelta(days=6))
    pk = sample_cluster_task.apply().get()
    assert ClusterSample.objects.filter(pk=pk, queue_depth=0, oldest_pending_seconds=None).exists()
    assert not ClusterSample.objects.filter(pk=old.pk).exists()
    assert ClusterSample.objects.filter(pk=recent.pk).exists()


# --- history -----------------------------------------------------------------------------------
def fill(start: datetime, count: int, every: timedelta, nodes=lambda i: {}) -> None:
    ClusterSample.objects.bulk_create([
        ClusterSample(at=start + i * every, queue_depth=i % 7, oldest_pending_seconds=float(i) if i % 7 else None,
                      nodes=nodes(i)) for i in range(count)])


def test_history_gives_every_sample_when_few_and_buckets_when_many():
    start = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    fill(start, 100, timedelta(minutes=1),
         lambda i: {"n1": {"state": "busy", "cpu_percent": float(i), "gpu_percent": None, "job": 5}})
    raw = history(start, start + timedelta(minutes=100), max_points=500)
    assert raw.samples == 100 and raw.bucket_seconds is None and len(raw.points) == 100
    assert raw.points[3] == {"at": start + timedelta(minutes=3), "queue_depth": 3, "oldest_pending_seconds": 3.0}

    cut = history(start, start + timedelta(minutes=100), max_points=10)
    assert cut.samples == 100 and cut.bucket_seconds == 600 and len(cut.points) == 10
    first = cut.points[0]  # samples 0..9: the last one's time, the highest depth and wait
    assert first == {"at": start + timedelta(minutes=9), "queue_depth": 6, "oldest_pending_seconds": 9.0}
    node = cut.nodes["n1"][0]
    assert node["cpu_percent"] == pytest.approx(4.5) and node["gpu_percent"] is None  # the mean of 0..9
    assert (node["state"], node["job"]) == ("busy", 5)


def test_history_leaves_a_gap_where_no_sample_was_taken():
    start = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    fill(start, 10, timedelta(minutes=1))
    fill(start + timedelta(minutes=50), 10, timedelta(minutes=1))
    found = history(start, start + timedelta(minutes=60), max_points=12)
    assert found.samples == 20 and len(found.points) == 4  # 5-minute buckets: 2 before, 2 after


# --- the endpoint ------------------------------------------------------------------------------
@pytest.fixture
def samples(project, other_project):
    mine = make_job(project, "mine")
    theirs = make_job(other_project, "top-secret-run")
    now = timezone.now()
    for age in (600, 300, 30):
        ClusterSample.objects.create(at=now - timedelta(seconds=age), queue_depth=2, oldest_pending_seconds=12.5, nodes={
            "cpu-1": {"state": "busy", "cpu_percent": 50.0, "gpu_percent": None, "job": mine.pk},
            "gpu-1": {"state": "busy", "cpu_percent": 20.0, "gpu_percent": 75.0, "job": theirs.pk},
            "cpu-2": {"state": "idle", "cpu_percent": None, "gpu_percent": None, "job": None}})
    ClusterSample.objects.create(at=now - timedelta(hours=3), queue_depth=9)  # outside the default hour
    return {"mine": mine, "theirs": theirs}


def nodes_of(body: dict) -> dict[str, list[dict]]:
    return {node["name"]: node["points"] for node in body["nodes"]}


def test_members_see_every_node_but_only_their_own_jobs_names(samples, owner, outsider, client_for,
                                                              django_assert_max_num_queries):
    api = client_for(owner)
    with django_assert_max_num_queries(8):
        response = api.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["samples"] == 3 and body["bucket_seconds"] is None
    assert [p["queue_depth"] for p in body["points"]] == [2, 2, 2]
    nodes = nodes_of(body)
    assert list(nodes) == ["cpu-1", "cpu-2", "gpu-1"]
    assert nodes["cpu-1"][0]["job"] == {"id": samples["mine"].pk, "name": "mine", "project": "acme"}
    assert nodes["gpu-1"][0] == {"at": nodes["gpu-1"][0]["at"], "state": "busy", "cpu_percent": 20.0, "gpu_percent": 75.0,
                                 "job": None, "busy": True}
    assert "top-secret-run" not in response.content.decode()
    assert nodes["cpu-2"][0]["busy"] is False and nodes["cpu-2"][0]["job"] is None

    theirs = client_for(outsider).get(URL).json()
    assert nodes_of(theirs)["gpu-1"][0]["job"]["name"] == "top-secret-run"
    assert nodes_of(theirs)["cpu-1"][0]["job"] is None


def test_the_window_and_points_are_read_from_the_query(samples, owner, client_for):
    api = client_for(owner)
    now = timezone.now()
    wide = api.get(URL, {"since": iso(now - timedelta(hours=4)), "until": iso(now)}).json()
    assert wide["samples"] == 4 and max(p["queue_depth"] for p in wide["points"]) == 9
    few = api.get(URL, {"since": iso(now - timedelta(hours=4)), "points": "2"}).json()
    assert len(few["points"]) == 2 and few["bucket_seconds"] == pytest.approx(7200, rel=0.01)
    # An unencoded "+01:00" arrives as " 01:00": still read as the offset it was.
    since = (now - timedelta(minutes=8)).astimezone(timezone.get_fixed_timezone(60)).replace(microsecond=0)
    spaced = api.get(f"{URL}?since={since.isoformat().replace('+', ' ')}").json()
    assert spaced["samples"] == 2


@pytest.mark.parametrize(("query", "field"), [
    ("since=yesterday", "since"), ("until=2026-13-45T00:00:00Z", "until"), ("points=1", "points"),
    ("points=many", "points"), ("points=100000", "points"),
    ("since=2026-12-01T10:00:00Z&until=2026-12-01T09:00:00Z", "since"),
])
def test_bad_parameters_are_a_400_naming_the_field(samples, owner, client_for, query, field):
    response = client_for(owner).get(f"{URL}?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error["fields"]) == [field] and error["message"].startswith(field)


def test_strangers_are_refused(db, client_for):
    assert APIClient().get(URL).status_code == 401
    loner = actions.ensure_user("loner", password="pw-loner-123")
    assert client_for(loner).get(URL).status_code == 403


def test_the_schema_documents_the_history_and_its_errors(db):
    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/json").json()
    op = schema["paths"]["/api/v1/cluster/history/"]["get"]
    assert {p["name"] for p in op["parameters"]} == {"since", "until", "points"}
    assert {"200", "400", "401", "403"} <= set(op["responses"])
    assert op["tags"] == ["cluster"]


# --- the page ----------------------------------------------------------------------------------
def page_of(user) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("nodes"))
    assert response.status_code == 200
    return response.content.decode()


def test_the_nodes_page_holds_the_charts_and_loads_plotly_from_the_studio(samples, owner):
    body = page_of(owner)
    section = re.search(r'<section class="panel" id="cluster-history" data-url="([^"]+)"', body)
    assert section and section.group(1) == URL
    for chart in ("chart-cpu", "chart-gpu", "chart-queue"):
        assert f'id="{chart}"' in body
    assert re.search(r'id="cluster-empty"[^>]* hidden', body) and not re.search(r'id="cluster-charts"[^>]* hidden', body)
    assert re.search(r'<script src="/static/vendor/plotly/plotly\.min(\.[0-9a-f]{12})?\.js" defer>', body)
    assert re.search(r'<script src="/static/js/nodes(\.[0-9a-f]{12})?\.js" defer>', body)
    assert "https://" not in body and "http://" not in body.replace('xmlns="http://www.w3.org', "")


def test_without_samples_the_page_says_so_instead_of_empty_charts(owner):
    body = page_of(owner)
    assert re.search(r'id="cluster-charts"[^>]* hidden', body)
    empty = re.search(r'<p class="empty small muted" id="cluster-empty">(.*?)</p>', body, re.S)
    assert empty and "No samples in this window yet" in empty.group(1)


# --- the page in a browser ---------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_charts_draw_in_a_browser_and_the_empty_line_shows_without_samples(live_server, project, other_project,
                                                                               browser_page):  # noqa: F811
    make_member(project, "sam", Role.SCIENTIST, password=PASSWORD)
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + "/nodes/")
    assert page.locator("#cluster-empty").is_visible() and not page.locator("#cluster-charts").is_visible()

    mine, theirs = make_job(project, "mine"), make_job(other_project, "top-secret-run")
    now = timezone.now()
    ClusterSample.objects.bulk_create([ClusterSample(
        at=now - timedelta(seconds=15 * i), queue_depth=i % 4, oldest_pending_seconds=float(i), nodes={
            "cpu-1": {"state": "busy", "cpu_percent": 40.0 + i, "gpu_percent": None, "job": mine.pk},
            "gpu-1": {"state": "busy", "cpu_percent": 20.0, "gpu_percent": 90.0 - i, "job": theirs.pk}})
        for i in range(40)])
    page.goto(live_server.url + "/nodes/")
    page.wait_for_selector("#chart-queue .main-svg")
    page.wait_for_selector("#chart-gpu .main-svg")
    traces = page.evaluate("""() => ["chart-cpu", "chart-gpu", "chart-queue"].map(id => {
        const div = document.getElementById(id);
        return (div.data || []).map(t => [t.name, t.y.filter(v => v !== null).length]);
    })""")
    assert traces == [[["cpu-1", 40], ["gpu-1", 40]], [["gpu-1", 40]], [["pending jobs", 40]]]
    assert "top-secret-run" not in page.evaluate("() => JSON.stringify(document.getElementById('chart-gpu').data)")
    page.screenshot(path=str(SCREENSHOTS / "nodes_cluster_charts.png"), full_page=True)
    assert page.console_errors == []
