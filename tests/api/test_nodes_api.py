"""GET /api/v1/nodes/ and /api/v1/nodes/<name>/: who may list nodes, what a node says about
another project's job or warm pool (nothing but "busy"/"warm"), the per-instance-type
summary, and nodes that stopped heartbeating before the sweep noticed."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import JobStatus, Node, NodeState, TrainingJob
from studio import actions
from tests import factories

LIST = "/api/v1/nodes/"


def make_node(name: str, **fields) -> Node:
    values = {"hostname": f"{name}.lan", "queue": f"node.{name}", "instance_type": "cpu", "cpus": 8,
              "memory_bytes": 16 * 2**30, "last_heartbeat": timezone.now()}
    values.update(fields)
    return Node.objects.create(name=name, **values)


def make_job(project, name: str = "run", status: str = JobStatus.TRAINING, instance_type: str | None = "cpu") -> TrainingJob:
    resources = {"instance_type": instance_type, "instance_count": 1} if instance_type else {}
    return factories.make_job(project, name=name, status=status, resources=resources)


def by_name(body: dict) -> dict[str, dict]:
    return {node["name"]: node for node in body["results"]}


def test_anonymous_gets_a_401_envelope(db):
    response = APIClient().get(LIST)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert APIClient().get(LIST + "node-a/").status_code == 401


def test_a_user_of_no_project_is_refused(db, client_for):
    loner = actions.ensure_user("loner", password="pw-loner-123")
    response = client_for(loner).get(LIST)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert "member" in response.json()["error"]["message"]


def test_a_member_sees_their_job_on_a_node_and_an_outsider_only_that_it_is_busy(owner, outsider, reviewer, project,
                                                                                 client_for):
    job = make_job(project, name="secret-experiment")
    make_node("gpu-1", instance_type="gpu", gpus=4, state=NodeState.BUSY, current_job=job, version="1.4", pid=321)

    mine = by_name(client_for(owner).get(LIST).json())["gpu-1"]
    assert mine["job"] == {"id": job.pk, "name": "secret-experiment", "project": "acme", "busy": True}
    assert (mine["state"], mine["gpus"], mine["instance_type"], mine["queue"], mine["pid"]) == ("busy", 4, "gpu", "node.gpu-1", 321)
    assert mine["warm"] is None and 0 <= mine["seconds_since_heartbeat"] < 5

    for stranger in (outsider, reviewer):  # another project's admin; a reviewer cannot read jobs
        response = client_for(stranger).get(LIST)
        assert response.status_code == 200
        theirs = by_name(response.json())["gpu-1"]
        assert theirs["job"] == {"id": None, "busy": True}
        assert "secret-experiment" not in response.content.decode()
        assert client_for(stranger).get(LIST + "gpu-1/").json()["job"] == {"id": None, "busy": True}


def test_a_warm_node_names_its_pool_project_and_job_only_to_members(owner, outsider, project, client_for):
    finished = make_job(project, name="warm-maker", status=JobStatus.COMPLETED)
    until = timezone.now() + timedelta(seconds=300)
    make_node("cpu-w", state=NodeState.WARM, warm_pool="pool-7f3a", warm_project=project, warm_instance_count=2,
              warm_until=until, warm_from_job=finished)

    warm = client_for(owner).get(LIST + "cpu-w/").json()["warm"]
    assert warm["pool"] == "pool-7f3a" and warm["project"] == "acme" and warm["from_job"] == finished.pk
    assert warm["instance_count"] == 2 and 290 <= warm["expires_in_seconds"] <= 300
    assert warm["until"].startswith(until.strftime("%Y-%m-%dT%H:%M"))

    hidden = client_for(outsider).get(LIST + "cpu-w/").json()
    assert hidden["state"] == "warm"
    assert hidden["warm"]["project"] is None and hidden["warm"]["from_job"] is None
    assert hidden["warm"]["pool"] == "pool-7f3a"


def test_a_silent_node_reads_lost_before_the_sweep_marks_it(owner, client_for, settings):
    settings.STUDIO_NODE_LOST_SECONDS = 30
    now = timezone.now()
    make_node("fresh", state=NodeState.IDLE, last_heartbeat=now)
    make_node("silent", state=NodeState.BUSY, last_heartbeat=now - timedelta(seconds=45))
    make_node("gone", state=NodeState.STOPPED, last_heartbeat=now - timedelta(hours=1))
    client = client_for(owner)

    states = {name: node["state"] for name, node in by_name(client.get(LIST).json()).items()}
    assert states == {"fresh": "idle", "silent": "lost", "gone": "stopped"}
    assert client.get(LIST + "silent/").json()["seconds_since_heartbeat"] >= 45
    assert Node.objects.get(name="silent").state == NodeState.BUSY  # reading changes nothing
    assert [n["name"] for n in client.get(LIST + "?state=lost").json()["results"]] == ["silent"]
    assert [n["name"] for n in client.get(LIST + "?state=busy").json()["results"]] == []
    bad = client.get(LIST + "?state=asleep")
    assert bad.status_code == 400 and "state" in bad.json()["error"]["fields"]


def test_the_summary_counts_nodes_by_state_and_unfinished_jobs_per_instance_type(owner, project, other_project, client_for,
                                                                                  settings):
    settings.STUDIO_NODE_LOST_SECONDS = 30
    now = timezone.now()
    busy_job = make_job(project, status=JobStatus.TRAINING)
    make_node("cpu-1", state=NodeState.IDLE)
    make_node("cpu-2", state=NodeState.BUSY, current_job=busy_job)
    make_node("cpu-3", state=NodeState.WARM, warm_pool="p1", warm_project=project, warm_until=now + timedelta(minutes=5))
    make_node("cpu-4", state=NodeState.IDLE, last_heartbeat=now - timedelta(minutes=2))  # lost by heartbeat
    make_node("cpu-5", state=NodeState.LOST, last_heartbeat=now - timedelta(minutes=9))
    make_node("cpu-6", state=NodeState.STOPPED)
    make_node("gpu-1", instance_type="gpu", gpus=8, state=NodeState.IDLE)
    for status in (JobStatus.PENDING, JobStatus.PENDING, JobStatus.STARTING, JobStatus.COMPLETED):
        make_job(other_project, status=status)  # other projects' jobs count (numbers only)
    make_job(project, status=JobStatus.PENDING, instance_type=None)  # no instance type: the "cpu" default
    make_job(project, status=JobStatus.PENDING, instance_type="tpu")  # a queue no node serves
    make_job(project, status=JobStatus.STOPPING, instance_type="gpu")

    body = client_for(owner).get(LIST + "?page_size=2").json()

    assert body["count"] == 7 and len(body["results"]) == 2 and body["next"]
    summary = {row["instance_type"]: row for row in body["instance_types"]}
    assert summary["cpu"] == {"instance_type": "cpu", "nodes": 5, "idle": 1, "busy": 1, "warm": 1, "lost": 2, "stopped": 1,
                              "pending_jobs": 3, "running_jobs": 2}
    assert summary["gpu"] == {"instance_type": "gpu", "nodes": 1, "idle": 1, "busy": 0, "warm": 0, "lost": 0, "stopped": 0,
                              "pending_jobs": 0, "running_jobs": 1}
    assert summary["tpu"]["nodes"] == 0 and summary["tpu"]["pending_jobs"] == 1
    assert [row["instance_type"] for row in body["instance_types"]] == ["cpu", "gpu", "tpu"]
    only_gpu = client_for(owner).get(LIST + "?instance_type=gpu").json()
    assert [n["name"] for n in only_gpu["results"]] == ["gpu-1"]
    assert len(only_gpu["instance_types"]) == 3  # the summary ignores filters


def test_an_unknown_node_is_a_404_envelope(owner, client_for):
    response = client_for(owner).get(LIST + "nope/")
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "not_found", "message": "No node named 'nope'.", "fields": {}}


def test_the_list_costs_the_same_queries_for_many_nodes(owner, project, client_for, django_assert_max_num_queries):
    client = client_for(owner)
    for index in range(30):
        job = make_job(project, name=f"job-{index}")
        make_node(f"n-{index:02d}", state=NodeState.BUSY if index % 2 else NodeState.WARM, current_job=job,
                  warm_pool="p", warm_project=project, warm_from_job=job)
    # token lookup + membership check + readable projects + count + page + two summary queries
    with django_assert_max_num_queries(9):
        body = client.get(LIST).json()
    assert len(body["results"]) == 30


def test_the_schema_documents_the_nodes_endpoints(db):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "/api/v1/nodes/" in schema["paths"] and "/api/v1/nodes/{name}/" in schema["paths"]
    listed = schema["components"]["schemas"]["NodeList"]["properties"]
    assert {"results", "instance_types", "count"} <= set(listed)
