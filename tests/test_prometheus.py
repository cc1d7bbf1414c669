"""GET /metrics: Prometheus's text format that prometheus_client's own parser reads, whose
figures are the API's on the same rows (jobs by status, nodes by state, the queue, the
review backlog), the flushers' own figures after a real flush, and the guard (token,
networks)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from jobs.metrics import metrics_redis
from jobs.metrics.ingest import FLUSHER_STATS, Flusher
from jobs.models import JobRule, JobStatus, Node, NodeState, RuleState, SystemMetric, TrainingJob
from review.models import LoopStatus
from tests import factories
from tests.review.test_stats import make_flow, make_loop, make_reviewer, make_team
from trainyard.protocol import ACTIVE_METRIC_JOBS, METRICS_STREAM, key

pytestmark = pytest.mark.django_db


def scrape(client: Client | None = None, **extra) -> dict[str, dict[tuple, float]]:
    """{family name: {labels as sorted (name, value) pairs: value}}; asserts every family
    is documented and of a known type."""
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    families: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        assert family.name.startswith("trainyard_") and family.documentation, family.name
        assert family.type in ("gauge", "counter"), family.name
        families[family.name] = {tuple(sorted(sample.labels.items())): sample.value for sample in family.samples}
    return families


def value(families: dict, name: str, **labels: str) -> float | None:
    return families.get(name, {}).get(tuple(sorted(labels.items())))


def make_node(name: str, **fields) -> Node:
    values = {"hostname": f"{name}.lan", "queue": f"node.{name}", "instance_type": "cpu", "cpus": 8,
              "last_heartbeat": timezone.now()}
    values.update(fields)
    return Node.objects.create(name=name, **values)


def make_job(project, name: str, status: str, instance_type: str | None = "cpu", **fields) -> TrainingJob:
    resources = {"instance_type": instance_type, "instance_count": 1} if instance_type else {}
    return factories.make_job(project, name=name, status=status, resources=resources, **fields)


@pytest.fixture
def cluster(project, other_project, owner, outsider):
    """Nodes in every state, jobs of two projects in several statuses, rules in each state,
    a review flow with a backlog. Returns what the tests look up."""
    now = timezone.now()
    mine = make_job(project, "mine", JobStatus.TRAINING)
    theirs = make_job(other_project, "theirs", JobStatus.TRAINING, "gpu")
    make_job(project, "waiting-1", JobStatus.PENDING, created_at=now - timedelta(seconds=300))
    make_job(project, "waiting-2", JobStatus.PENDING, instance_type=None, created_at=now - timedelta(seconds=30))
    make_job(other_project, "waiting-gpu", JobStatus.PENDING, "gpu", created_at=now - timedelta(seconds=120))
    make_job(project, "done", JobStatus.COMPLETED)
    make_job(project, "broke", JobStatus.FAILED, "gpu")
    make_job(project, "kept", JobStatus.COMPLETED, archived_at=now)  # archived: lists leave it out
    stopped_by_rule = make_job(project, "nan", JobStatus.STOPPED)

    make_node("cpu-1", state=NodeState.IDLE)
    make_node("cpu-2", state=NodeState.BUSY, current_job=mine)
    make_node("gpu-1", instance_type="gpu", gpus=4, state=NodeState.BUSY, current_job=theirs)
    make_node("gpu-2", instance_type="gpu", gpus=2, state=NodeState.WARM, warm_pool="p1", warm_project=project,
              warm_until=now + timedelta(minutes=5))
    make_node("cpu-silent", state=NodeState.IDLE, last_heartbeat=now - timedelta(minutes=10))  # reads lost
    make_node("cpu-old", state=NodeState.STOPPED, last_heartbeat=now - timedelta(days=1))
    SystemMetric.objects.create(job=theirs, node_name="gpu-1", time=now - timedelta(seconds=3), cpu_percent=55.5,
                                memory_bytes=1, gpu_percent=87.25)
    SystemMetric.objects.create(job=theirs, node_name="gpu-1", time=now - timedelta(seconds=20), cpu_percent=10.0,
                                memory_bytes=1, gpu_percent=10.0)
    SystemMetric.objects.create(job=mine, node_name="cpu-2", time=now - timedelta(minutes=3), cpu_percent=99.0,
                                memory_bytes=1)  # too old: cpu-2 has no current figure

    JobRule.objects.create(job=mine, name="non_finite", type="non_finite", state=RuleState.ALARM)
    JobRule.objects.create(job=mine, name="stalled", type="stalled", state=RuleState.OK)
    JobRule.objects.create(job=mine, name="muted", type="overfit", state=RuleState.ALARM, enabled=False)
    JobRule.objects.create(job=theirs, name="gpu", type="low_gpu_utilization", state=RuleState.INSUFFICIENT_DATA)
    JobRule.objects.create(job=stopped_by_rule, name="non_finite", type="non_finite", state=RuleState.ALARM)

    team = make_team(project, "labellers", [make_reviewer(project, "rev")])
    flow = make_flow(team, "animals")
    oldest = make_loop(flow, created_ago=timedelta(minutes=40))
    make_loop(flow, created_ago=timedelta(minutes=5), holds=1)
    make_loop(flow, created_ago=timedelta(minutes=1))
    make_loop(flow, status=LoopStatus.COMPLETED, created_ago=timedelta(hours=2), took=timedelta(minutes=3), answers=2)
    return {"flow": flow, "oldest_loop": oldest, "theirs": theirs}


def test_metrics_parse_and_every_family_is_there(cluster):
    families = scrape()
    assert {"trainyard_nodes", "trainyard_gpus", "trainyard_node_cpu_utilization_percent",
            "trainyard_node_gpu_utilization_percent", "trainyard_jobs", "trainyard_queue_depth",
            "trainyard_queue_oldest_pending_seconds", "trainyard_review_backlog", "trainyard_review_open_slots",
            "trainyard_review_oldest_loop_age_seconds", "trainyard_rule_alarms_firing", "trainyard_rules",
            "trainyard_flushers", "trainyard_metric_points_written", "trainyard_flusher_lag_seconds"} <= set(families)


def test_jobs_by_status_match_the_jobs_api(cluster, owner, outsider, client_for):
    families = scrape()
    for status in JobStatus.values:
        # The two projects are disjoint: their members' lists together are every job.
        listed = sum(client_for(user).get(f"/api/v1/jobs/?status={status}").json()["count"] for user in (owner, outsider))
        scraped = sum(v for labels, v in families["trainyard_jobs"].items() if dict(labels)["status"] == status)
        assert scraped == listed, status
    assert value(families, "trainyard_jobs", status="Pending", instance_type="cpu") == 2  # no instance type: cpu
    assert value(families, "trainyard_jobs", status="Failed", instance_type="gpu") == 1
    assert value(families, "trainyard_jobs", status="Completed", instance_type="cpu") == 1  # the archived one left out


def test_nodes_and_the_queue_match_the_nodes_api(cluster, owner, client_for):
    families = scrape()
    api = client_for(owner)
    for instance_type in ("cpu", "gpu"):
        for state in NodeState.values:
            body = api.get(f"/api/v1/nodes/?state={state}&instance_type={instance_type}&page_size=100").json()
            labels = {"state": state, "instance_type": instance_type}
            assert value(families, "trainyard_nodes", **labels) == body["count"], labels
            assert value(families, "trainyard_gpus", **labels) == sum(node["gpus"] for node in body["results"]), labels
    assert value(families, "trainyard_nodes", state="lost", instance_type="cpu") == 1  # silent before the sweep
    summaries = {s["instance_type"]: s for s in api.get("/api/v1/nodes/").json()["instance_types"]}
    for instance_type, summary in summaries.items():
        assert value(families, "trainyard_queue_depth", instance_type=instance_type) == summary["pending_jobs"]
        running = sum(value(families, "trainyard_jobs", status=s, instance_type=instance_type) or 0
                      for s in ("Starting", "Training", "Uploading", "Stopping"))
        assert running == summary["running_jobs"]
    assert value(families, "trainyard_queue_depth", instance_type="cpu") == 2
    assert 300 <= value(families, "trainyard_queue_oldest_pending_seconds", instance_type="cpu") < 330
    assert 120 <= value(families, "trainyard_queue_oldest_pending_seconds", instance_type="gpu") < 150


def test_utilisation_comes_from_the_latest_sample_of_the_nodes_job(cluster):
    families = scrape()
    assert families["trainyard_node_cpu_utilization_percent"] == {(("node", "gpu-1"),): 55.5}
    assert families["trainyard_node_gpu_utilization_percent"] == {(("gpu", "all"), ("node", "gpu-1")): 87.25}


def test_an_idle_or_warm_node_shows_what_its_own_heartbeat_measured(cluster):
    from jobs.nodes import NodeUsage, heartbeat

    usage = NodeUsage()
    sum(i * i for i in range(200_000))  # some CPU to measure
    cpu, gpu = usage.read()
    assert cpu is not None and 0.0 <= cpu <= 100.0 and gpu is None  # no GPU driver here
    heartbeat("cpu-1", (cpu, gpu))
    heartbeat("gpu-2", (12.5, 40.0))
    heartbeat("gpu-1", (1.0, 2.0))  # busy: its job's sample speaks for it
    heartbeat("cpu-silent", (5.0, None))  # a heartbeat revives it: idle again, with its figure
    Node.objects.filter(name="cpu-2").update(cpu_percent=70.0, utilisation_at=timezone.now() - timedelta(minutes=2))
    families = scrape()
    assert families["trainyard_node_cpu_utilization_percent"] == {
        (("node", "cpu-1"),): cpu, (("node", "cpu-silent"),): 5.0, (("node", "gpu-1"),): 55.5, (("node", "gpu-2"),): 12.5}
    assert families["trainyard_node_gpu_utilization_percent"] == {
        (("gpu", "all"), ("node", "gpu-1")): 87.25, (("gpu", "all"), ("node", "gpu-2")): 40.0}
    # The Nodes page's charts sample the same figures.
    from jobs.cluster import sample_cluster

    nodes = sample_cluster().nodes
    assert nodes["cpu-1"]["cpu_percent"] == cpu and nodes["gpu-2"]["gpu_percent"] == 40.0
    assert nodes["cpu-2"]["cpu_percent"] is None  # its job's sample and its own figure are too old


def test_the_review_backlog_matches_the_flow_stats_api(cluster, owner, client_for):
    families = scrape()
    flow = cluster["flow"]
    backlog = client_for(owner).get(f"/api/v1/flow-definitions/{flow.pk}/stats/").json()["backlog"]
    assert value(families, "trainyard_review_backlog", project="acme") == backlog["loops"] == 3
    assert value(families, "trainyard_review_open_slots", project="acme") == backlog["open_slots"]
    age = (timezone.now() - cluster["oldest_loop"].created_at).total_seconds()
    assert value(families, "trainyard_review_oldest_loop_age_seconds", project="acme") == pytest.approx(age, abs=30)
    assert value(families, "trainyard_review_backlog", project="rival") is None  # no flow there


def test_alarms_firing_count_enabled_rules_of_unfinished_jobs(cluster, owner, outsider, client_for):
    families = scrape()
    assert families["trainyard_rule_alarms_firing"] == {(("project", "acme"), ("rule_type", "non_finite")): 1.0}
    # The Alarms API lists the finished job's rule too (its history); /metrics leaves it out.
    listed: dict[tuple, float] = {}
    for user in (owner, outsider):
        for alarm in client_for(user).get("/api/v1/alarms/?page_size=100").json()["results"]:
            if alarm["job"]["status"] not in ("Completed", "Stopped", "Failed"):
                labels = (("project", alarm["job"]["project"]), ("rule_type", alarm["type"]))
                listed[labels] = listed.get(labels, 0) + 1
    assert families["trainyard_rule_alarms_firing"] == listed
    assert {dict(labels)["state"]: v for labels, v in families["trainyard_rules"].items()} == {
        "OK": 1, "ALARM": 1, "INSUFFICIENT_DATA": 1}


def test_a_scrape_costs_a_handful_of_queries_however_many_rows(cluster, project, django_assert_max_num_queries):
    for n in range(30):
        make_job(project, f"more-{n}", JobStatus.PENDING)
        make_node(f"extra-{n}", state=NodeState.IDLE)
    with django_assert_max_num_queries(10):
        assert scrape()["trainyard_queue_depth"][(("instance_type", "cpu"),)] == 32


def test_an_empty_studio_still_answers(db):
    families = scrape()
    assert families["trainyard_rules"] == {(("state", s),): 0.0 for s in RuleState.values}
    assert families["trainyard_jobs"] == {} and families["trainyard_nodes"] == {}


@pytest.mark.django_db(transaction=True)
def test_a_real_http_scrape_parses(live_server, project):
    """What `curl http://studio/metrics` gets, over a socket (from loopback: allowed)."""
    make_job(project, "over-http", JobStatus.PENDING)
    with urllib.request.urlopen(f"{live_server.url}/metrics", timeout=30) as response:
        assert response.status == 200 and response.headers["Content-Type"] == CONTENT_TYPE_LATEST
        text = response.read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("trainyard_queue_depth", (("instance_type", "cpu"),))] == 1
    assert samples[("trainyard_jobs", (("instance_type", "cpu"), ("status", "Pending")))] == 1


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian's prometheus package; .ci/run installs it)")
def test_promtool_finds_nothing_to_fix_in_a_scrape(cluster, clean_stats):
    """Prometheus's own linter on what a scrape gets, every family present (the flusher's
    counters too): names, units, _total on counters, help text."""
    clean_stats.hset(FLUSHER_STATS, "flusher-a", json.dumps({"written": 10, "dropped": 1, "cycle_at": time.time(),
                                                              "lag": 0.5}))
    text = Client().get("/metrics").content
    assert b"trainyard_metric_points_written_total" in text and b"trainyard_node_gpu_utilization_percent" in text
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert checked.returncode == 0 and not checked.stdout.strip(), (checked.stdout + checked.stderr).decode()


ALERTS = Path(__file__).resolve().parents[1] / "docs" / "prometheus" / "trainyard-alerts.yml"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian's prometheus package; .ci/run installs it)")
def test_the_shipped_alert_rules_pass_promtools_checks_and_their_own_tests(cluster, clean_stats):
    """docs/prometheus/trainyard-alerts.yml: valid rules, whose unit tests (each alert fires
    after its `for` on the series that should fire it) pass, and which name only series a
    scrape really has."""
    for command in (["check", "rules", ALERTS.name], ["test", "rules", "trainyard-alerts.test.yml"]):
        checked = subprocess.run([PROMTOOL, *command], cwd=ALERTS.parent, capture_output=True, timeout=120)
        assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    clean_stats.hset(FLUSHER_STATS, "flusher-a", json.dumps({"written": 1, "dropped": 0, "cycle_at": time.time(),
                                                              "lag": 0.0}))
    scraped = {line.split("{")[0].split(" ")[0] for line in Client().get("/metrics").content.decode().splitlines()
               if line and not line.startswith("#")}
    named = {name for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
             for name in re.findall(r"\btrainyard_[a-z_]+", rule["expr"])}
    assert named and named <= scraped, named - scraped


PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian's prometheus package; .ci/run installs it)")
@pytest.mark.django_db(transaction=True)
@override_settings(STUDIO_METRICS_TOKEN="scrape-token-for-the-test", STUDIO_METRICS_ALLOWED_NETWORKS=[])
def test_a_real_prometheus_scrapes_the_studio_and_its_query_gives_the_apis_figure(live_server, project, owner,
                                                                                  client_for, tmp_path):
    """Prometheus itself, told to scrape the studio every second with the shipped alerting
    rules loaded and the README's scrape config (the token, no network allowed without it):
    its target is up, one without the token is down, a PromQL query of the queue depth gives
    what the API's jobs list counts, and a job rule in ALARM fires TrainyardRuleAlarmsFiring."""
    for number in range(3):
        make_job(project, f"queued-{number}", JobStatus.PENDING)
    running = make_job(project, "nan", JobStatus.TRAINING)
    JobRule.objects.create(job=running, name="non_finite", type="non_finite", state=RuleState.ALARM)
    pending = client_for(owner).get("/api/v1/jobs/?status=Pending").json()["count"]
    host = live_server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{ALERTS}']\n"
        "scrape_configs:\n"
        f"  - {{job_name: trainyard, metrics_path: /metrics, authorization: {{credentials: scrape-token-for-the-test}},"
        f" static_configs: [{{targets: ['{host}']}}]}}\n"
        f"  - {{job_name: anonymous, metrics_path: /metrics, static_configs: [{{targets: ['{host}']}}]}}\n")
    port = _free_port()
    log = tmp_path / "prometheus.log"

    def query(promql: str) -> list:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)["data"]["result"]
        except OSError:
            return []  # not listening yet

    with log.open("wb") as output:
        server = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60

            def first(promql: str) -> float:
                """The query's value once Prometheus has one (each target is first scraped
                at its own offset within the interval)."""
                while not (result := query(promql)):
                    assert server.poll() is None and time.monotonic() < deadline, (promql, log.read_text()[-2000:])
                    time.sleep(0.5)
                return float(result[0]["value"][1])

            assert first('trainyard_queue_depth{instance_type="cpu"}') == pending == 3
            assert first('up{job="trainyard"}') == 1
            assert first('up{job="anonymous"}') == 0  # no token, no allowed network: 401
            assert first('sum(trainyard_jobs{status="Pending"})') == pending
            assert first('ALERTS{alertname="TrainyardRuleAlarmsFiring", alertstate="firing"}') == 1
            assert not query('ALERTS{alertname="TrainyardDown"}')
        finally:
            server.terminate()
            server.wait(timeout=30)


# --- the flushers' own figures ---------------------------------------------------------------
@pytest.fixture
def clean_stats():
    client = metrics_redis()
    client.delete(FLUSHER_STATS)
    yield client
    client.delete(FLUSHER_STATS)


def test_flusher_stats_appear_after_a_flush_with_its_lag(clean_stats, project):
    job = make_job(project, "logging", JobStatus.TRAINING)
    stream = key(METRICS_STREAM, job.pk)
    clean_stats.delete(stream)
    # An entry written 10 s ago (its id's ms): the flusher that reads it is 10 s behind.
    written_at_ms = int((time.time() - 10) * 1000)
    points = [["loss", step, 1.0 / (step + 1), written_at_ms / 1000] for step in range(250)]
    clean_stats.xadd(stream, {"r": "0", "p": json.dumps(points)}, id=f"{written_at_ms}-0")
    clean_stats.sadd(ACTIVE_METRIC_JOBS, job.pk)
    try:
        flusher = Flusher(discover_running=False, consumer="flusher-a")
        assert flusher.flush_once(block_ms=0) == 250
        row = json.loads(clean_stats.hget(FLUSHER_STATS, "flusher-a"))
        assert row["written"] == 250 and row["dropped"] == 0
        assert 9.5 <= row["lag"] < 30 and time.time() - row["cycle_at"] < 5
        flusher.flush_once(block_ms=0)  # within the second: not published again
        assert json.loads(clean_stats.hget(FLUSHER_STATS, "flusher-a")) == row

        # A second live flusher is summed; one silent for two minutes is ignored.
        clean_stats.hset(FLUSHER_STATS, mapping={
            "flusher-b": json.dumps({"written": 1000, "dropped": 3, "cycle_at": time.time(), "lag": 0.5}),
            "flusher-gone": json.dumps({"written": 10**6, "dropped": 0, "cycle_at": time.time() - 120, "lag": 99}),
        })
        families = scrape()
        assert value(families, "trainyard_metric_points_written") == 1250
        assert value(families, "trainyard_metric_points_dropped") == 3
        assert value(families, "trainyard_flushers") == 2
        assert 9.5 <= value(families, "trainyard_flusher_lag_seconds") < 30
        assert time.time() - value(families, "trainyard_flusher_last_cycle_timestamp_seconds") < 5

        # With every flusher stopped, the last cycle's time still says since when.
        clean_stats.hdel(FLUSHER_STATS, "flusher-a", "flusher-b")
        stopped = scrape()
        assert value(stopped, "trainyard_flushers") == 0 and value(stopped, "trainyard_metric_points_written") == 0
        assert value(stopped, "trainyard_flusher_last_cycle_timestamp_seconds") == pytest.approx(time.time() - 120, abs=5)

        flusher._last_stats = 0.0  # due again (stats are published at most once a second)
        flusher.flush_once(block_ms=0)  # caught up now
        assert json.loads(clean_stats.hget(FLUSHER_STATS, "flusher-a"))["lag"] == 0
    finally:
        clean_stats.delete(stream)
        clean_stats.srem(ACTIVE_METRIC_JOBS, job.pk)


# --- who may scrape ------------------------------------------------------------------------------
@override_settings(STUDIO_METRICS_TOKEN="", STUDIO_METRICS_ALLOWED_NETWORKS=["10.0.0.0/8", "fd00::/8"])
def test_networks_decide_when_no_token_is_set():
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="fd00::5").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="::ffff:10.9.9.9").get("/metrics").status_code == 200  # dual-stack listener
    denied = Client(REMOTE_ADDR="192.168.1.9").get("/metrics")
    assert denied.status_code == 403 and "STUDIO_METRICS_ALLOWED_NETWORKS" in denied.content.decode()
    # A proxy header is not trusted: only the connection's own address counts.
    assert Client(REMOTE_ADDR="192.168.1.9").get("/metrics", HTTP_X_FORWARDED_FOR="10.1.2.3").status_code == 403
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403  # loopback not listed here


@override_settings(STUDIO_METRICS_TOKEN="s3cret-scrape-token", STUDIO_METRICS_ALLOWED_NETWORKS=["127.0.0.1/32"])
def test_a_token_lets_in_any_address_and_a_wrong_or_missing_one_is_a_401():
    outside = Client(REMOTE_ADDR="203.0.113.7")
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 200
    assert outside.get("/metrics", HTTP_AUTHORIZATION="bearer s3cret-scrape-token").status_code == 200
    for header in ("Bearer wrong", "Bearer s3cret-scrape-token-and-more", "Basic czNjcmV0", "s3cret-scrape-token"):
        response = outside.get("/metrics", HTTP_AUTHORIZATION=header)
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"].startswith("Bearer")
    assert outside.get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200  # the network still counts


def test_loopback_is_allowed_by_default_and_only_get_is_served(db):
    assert Client().get("/metrics").status_code == 200  # the test client is 127.0.0.1
    assert Client().post("/metrics").status_code == 405


def test_metrics_is_not_in_the_api_schema(db):
    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert not any(path.startswith("/metrics") for path in schema["paths"])
