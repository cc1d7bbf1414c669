"""Nodes: registration, heartbeats, the lost-node sweep, and a real worker process."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.models import Node, NodeState
from jobs.nodes import (
    HeartbeatThread,
    MachineResources,
    count_gpus,
    heartbeat,
    mark_lost_nodes,
    mark_stopped,
    node_queue,
    register_node,
)
from jobs.tasks import mark_lost_nodes_task
from tests.conftest import ROOT, wait_for, worker_env

RESOURCES = MachineResources(cpus=4, memory_bytes=8 * 2**30, gpus=0)


def _age(name: str, seconds: float) -> None:
    """Time travel: pretend the node's last heartbeat was `seconds` ago."""
    Node.objects.filter(name=name).update(last_heartbeat=timezone.now() - timedelta(seconds=seconds))


def _overdue() -> float:
    return settings.STUDIO_NODE_LOST_SECONDS + 5


@pytest.mark.django_db
def test_register_creates_an_idle_node_on_its_own_queue():
    node = register_node(name="gpu-box", instance_type="gpu", hostname="box", pid=4242, resources=RESOURCES)

    assert node.state == NodeState.IDLE
    node.refresh_from_db()
    assert (node.queue, node.instance_type, node.hostname, node.pid) == ("node.gpu-box", "gpu", "box", 4242)
    assert (node.cpus, node.memory_bytes, node.gpus) == (4, 8 * 2**30, 0)
    assert node_queue("gpu-box") == "node.gpu-box"


@pytest.mark.django_db
def test_registering_again_reuses_the_row_and_resets_it():
    first = register_node(name="n1", pid=1, resources=RESOURCES)
    _age("n1", _overdue())
    assert mark_lost_nodes() == 1

    again = register_node(name="n1", pid=2, resources=RESOURCES)

    assert again.pk == first.pk
    again.refresh_from_db()
    assert again.state == NodeState.IDLE and again.pid == 2
    assert again.seconds_since_heartbeat() < 5
    assert Node.objects.count() == 1


@pytest.mark.django_db
def test_heartbeat_moves_last_heartbeat_forward():
    register_node(name="n1", resources=RESOURCES)
    _age("n1", 20)

    heartbeat("n1")

    assert Node.objects.get(name="n1").seconds_since_heartbeat() < 5


@pytest.mark.django_db
def test_mark_lost_marks_only_overdue_running_nodes():
    for name in ("fresh", "stale", "stale-stopped"):
        register_node(name=name, resources=RESOURCES)
    _age("stale", _overdue())
    _age("stale-stopped", _overdue())
    mark_stopped("stale-stopped")

    assert mark_lost_nodes() == 1

    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"fresh": NodeState.IDLE, "stale": NodeState.LOST, "stale-stopped": NodeState.STOPPED}
    assert mark_lost_nodes() == 0, "a lost node is not counted twice"


@pytest.mark.django_db
def test_a_busy_node_that_stops_heartbeating_is_lost():
    register_node(name="n1", resources=RESOURCES)
    Node.objects.filter(name="n1").update(state=NodeState.BUSY)
    _age("n1", _overdue())

    assert mark_lost_nodes_task() == 1

    assert Node.objects.get(name="n1").state == NodeState.LOST


@pytest.mark.django_db
def test_a_lost_node_that_heartbeats_again_is_idle_again():
    register_node(name="n1", resources=RESOURCES)
    _age("n1", _overdue())
    mark_lost_nodes()

    heartbeat("n1")

    node = Node.objects.get(name="n1")
    assert node.state == NodeState.IDLE
    assert node.seconds_since_heartbeat() < 5
    assert Node.objects.live().filter(name="n1").exists()


@pytest.mark.django_db
def test_heartbeat_keeps_the_state_the_scheduler_set():
    register_node(name="n1", resources=RESOURCES)
    Node.objects.filter(name="n1").update(state=NodeState.BUSY)

    heartbeat("n1")

    assert Node.objects.get(name="n1").state == NodeState.BUSY


@pytest.mark.django_db
def test_a_stopped_node_is_not_revived_by_a_late_heartbeat():
    register_node(name="n1", resources=RESOURCES)
    assert mark_stopped("n1") is True
    _age("n1", 100)

    heartbeat("n1")

    node = Node.objects.get(name="n1")
    assert node.state == NodeState.STOPPED
    assert node.seconds_since_heartbeat() > 90
    assert mark_stopped("n1") is False


def test_count_gpus_never_raises():
    # Without an NVIDIA driver nvmlInit raises NVMLError_LibraryNotFound; that must read as 0.
    assert count_gpus() >= 0


@pytest.mark.django_db(transaction=True)
def test_heartbeat_thread_beats_until_stopped():
    register_node(name="n1", resources=RESOURCES)
    _age("n1", 60)
    thread = HeartbeatThread("n1", interval=0.05)
    thread.start()
    try:
        wait_for(lambda: Node.objects.get(name="n1").seconds_since_heartbeat() < 5, timeout=10, message="a heartbeat")
    finally:
        thread.stop()
    assert not thread.is_alive()


@pytest.mark.slow
def test_a_real_worker_registers_heartbeats_and_marks_itself_stopped_on_sigterm(transactional_db, isolated_storage,
                                                                                    tmp_path):
    name = f"test-node-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    env = {**worker_env(isolated_storage), "STUDIO_NODE_HEARTBEAT_SECONDS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "studio", "worker", "--queue", "cpu", "--name", name],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        node = wait_for(lambda: Node.objects.filter(name=name).first(), timeout=60, message=f"node {name} to register")
        assert node.pid == proc.pid
        assert node.queue == f"node.{name}"
        assert node.cpus >= 1 and node.memory_bytes > 0
        registered_at = node.last_heartbeat
        wait_for(lambda: Node.objects.get(name=name).last_heartbeat > registered_at, timeout=30,
                 message="a heartbeat after registration")
        wait_for(lambda: b"ready." in log.read_bytes(), timeout=60, message="the Celery worker to be ready")
        assert f"node.{name}".encode() in log.read_bytes(), "the worker consumes its own queue"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    node = Node.objects.get(name=name)
    assert node.state == NodeState.STOPPED, log.read_text()
