"""The nodes page: each node's state (idle, busy with its job, warm with its pool, lost
before the sweep), the Queues summary, and nothing about other projects' jobs."""

from __future__ import annotations

import re
from datetime import timedelta

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import JobStatus, Node, NodeState, TrainingJob

XSS = "<script>alert('pwned')</script>"


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_node(name: str, **fields) -> Node:
    values = {"hostname": "box", "queue": f"node.{name}", "last_heartbeat": timezone.now()}
    values.update(fields)
    return Node.objects.create(name=name, **values)


def row_of(body: str, node: str) -> str:
    match = re.search(rf'<tr data-node="{re.escape(node)}">.*?</tr>', body, re.S)
    assert match, f"no row for {node}"
    return match.group(0)


def queue_counts(body: str, instance_type: str) -> dict[str, int]:
    match = re.search(rf'<tr data-queue="{instance_type}">(.*?)</tr>', body, re.S)
    assert match, f"no queue row for {instance_type}"
    return {name: int(value) for name, value in re.findall(r'data-count="(\w+)">(\d+)<', match.group(1))}


def test_a_busy_node_links_its_job_for_members_only(owner, outsider, project):
    job = TrainingJob.objects.create(project=project, name="secret-experiment", status=JobStatus.TRAINING)
    make_node("gpu-1", instance_type="gpu", gpus=2, state=NodeState.BUSY, current_job=job)

    mine = row_of(login(owner).get(reverse("nodes")).content.decode(), "gpu-1")
    assert 'data-status="busy"' in mine
    assert f'href="{reverse("job-detail", args=[job.pk])}">secret-experiment</a>' in mine

    body = login(outsider).get(reverse("nodes")).content.decode()
    assert 'data-status="busy"' in row_of(body, "gpu-1") and "a job of another project" in row_of(body, "gpu-1")
    assert "secret-experiment" not in body and reverse("job-detail", args=[job.pk]) not in body


def test_a_warm_node_shows_its_pool_project_and_expiry(owner, outsider, project):
    maker = TrainingJob.objects.create(project=project, name="warm-maker", status=JobStatus.COMPLETED)
    make_node("cpu-w", state=NodeState.WARM, warm_pool="pool-7f3a", warm_project=project, warm_instance_count=2,
              warm_until=timezone.now() + timedelta(minutes=4, seconds=30), warm_from_job=maker)

    row = row_of(login(owner).get(reverse("nodes")).content.decode(), "cpu-w")
    assert 'data-status="warm"' in row and "pool-7f3a" in row and "(2 nodes)" in row
    assert "for Acme" in row and "warm-maker" in row
    assert re.search(r"expires <time class=\"reltime\" datetime=\"[^\"]+\" title=\"[^\"]+\">in 4 min</time>", row)

    hidden = row_of(login(outsider).get(reverse("nodes")).content.decode(), "cpu-w")
    assert "for another project" in hidden and "Acme" not in hidden and "warm-maker" not in hidden


def test_an_expired_pool_says_it_is_being_released(owner):
    make_node("cpu-old", state=NodeState.WARM, warm_pool="pool-1", warm_until=timezone.now() - timedelta(seconds=20))
    row = row_of(login(owner).get(reverse("nodes")).content.decode(), "cpu-old")
    assert "expired" in row and "being released" in row


def test_a_silent_node_shows_lost_before_the_sweep(owner, settings):
    settings.STUDIO_NODE_LOST_SECONDS = 30
    make_node("cpu-9", state=NodeState.BUSY, last_heartbeat=timezone.now() - timedelta(seconds=90))
    make_node("cpu-x", state=NodeState.LOST, last_heartbeat=timezone.now() - timedelta(minutes=10))
    body = login(owner).get(reverse("nodes")).content.decode()
    silent = row_of(body, "cpu-9")
    assert 'data-status="lost"' in silent and "no heartbeat for 9" in silent and "was busy" in silent
    swept = row_of(body, "cpu-x")
    assert 'data-status="lost"' in swept and "no heartbeat for" not in swept


def test_queues_count_nodes_by_state_and_pending_jobs_per_instance_type(owner, project, other_project, settings):
    settings.STUDIO_NODE_LOST_SECONDS = 30
    now = timezone.now()
    make_node("cpu-1", state=NodeState.IDLE)
    make_node("cpu-2", state=NodeState.IDLE)
    make_node("cpu-3", state=NodeState.WARM, warm_pool="p")
    make_node("cpu-4", state=NodeState.IDLE, last_heartbeat=now - timedelta(minutes=3))
    make_node("gpu-1", instance_type="gpu", state=NodeState.BUSY)
    for target, status in (("cpu", JobStatus.PENDING), ("cpu", JobStatus.TRAINING), ("gpu", JobStatus.PENDING),
                           ("gpu", JobStatus.PENDING), ("tpu", JobStatus.PENDING)):
        TrainingJob.objects.create(project=other_project, name="j", status=status, resources={"instance_type": target})

    body = login(owner).get(reverse("nodes")).content.decode()

    assert queue_counts(body, "cpu") == {"idle": 2, "busy": 0, "warm": 1, "lost": 1, "pending": 1, "running": 1}
    assert queue_counts(body, "gpu") == {"idle": 0, "busy": 1, "warm": 0, "lost": 0, "pending": 2, "running": 0}
    assert queue_counts(body, "tpu")["pending"] == 1
    assert "No node serves <span class=\"mono\">tpu</span>: its 1 pending job waits" in body
    assert "--queue tpu" in body


def test_pending_jobs_without_nodes_show_the_queues_and_the_empty_state(teammate, project):
    TrainingJob.objects.create(project=project, name="j", status=JobStatus.PENDING, resources={"instance_type": "gpu"})
    body = login(teammate).get(reverse("nodes")).content.decode()
    assert queue_counts(body, "gpu")["pending"] == 1
    assert "No nodes yet" in body


def test_node_text_is_escaped(owner, project):
    job = TrainingJob.objects.create(project=project, name=XSS, status=JobStatus.TRAINING)
    make_node(XSS, hostname=XSS, version=XSS, instance_type="x<b>y", state=NodeState.BUSY, current_job=job)
    make_node("warm-xss", state=NodeState.WARM, warm_pool=XSS)
    body = login(owner).get(reverse("nodes")).content.decode()
    assert "<script>alert" not in body and "x<b>y" not in body
    assert "&lt;script&gt;alert" in body


def test_the_page_costs_the_same_queries_for_many_nodes(owner, project, django_assert_max_num_queries):
    client = login(owner)
    client.get(reverse("nodes"))  # the session and the user load once
    for index in range(25):
        job = TrainingJob.objects.create(project=project, name=f"job-{index}", status=JobStatus.TRAINING)
        make_node(f"n-{index:02d}", state=NodeState.BUSY if index % 2 else NodeState.WARM, current_job=job if index % 2 else None,
                  warm_pool="p", warm_project=project, warm_from_job=job)
    with django_assert_max_num_queries(12):
        response = client.get(reverse("nodes"))
    assert response.content.decode().count("<tr data-node=") == 25
