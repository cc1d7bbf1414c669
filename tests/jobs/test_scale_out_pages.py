"""The job form and job page for scale out: FSDP and pipeline choices, pipeline settings
and priority (posted to the API, pre-filled on a clone), and on the job page the priority,
warm or cold start, the attempts, and the partition and FSDP reports of the processes."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.reports import fsdp_report, partition_report

XSS = "<script>alert('pwned')</script>"

PARTITION = {
    "mode": "auto", "stages": 2, "schedule": "1f1b", "microbatches": 4,
    "layers": ["embed", "block0", "block1", "block2", "block3", "head"],
    "stage_layers": [[0, 2], [3, 5]],
    "predicted_ms": [12.5, 10.25], "measured_ms": [13.0, 11.5],
    "balance_predicted": 0.91, "balance_measured": 0.94,
    "memory_mb": [310.0, 295.5], "memory_cap_mb": 300,
    "notes": ["head is heavier than a block: stage 1 holds one fewer block"],
}


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def pipeline_job(project, **fields) -> TrainingJob:
    values = {"name": "lm", "algorithm": "charlm", "status": JobStatus.TRAINING, "distribution": "pipeline",
              "resources": {"instance_type": "cpu", "instance_count": 1, "processes_per_node": 2},
              "pipeline": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "partition": [3, 3], "memory_cap_mb": 300},
              "started_at": timezone.now()}
    values.update(fields)
    return TrainingJob.objects.create(project=project, **values)


def section(body: str, element_id: str) -> str:
    match = re.search(rf'<(section|fieldset|div|table|aside)[^>]*id="{element_id}".*?</\1>', body, re.S)
    assert match, f"no #{element_id}"
    return match.group(0)


# --- the form ----------------------------------------------------------------------------------
def test_the_form_offers_fsdp_and_pipeline_with_pipeline_settings_and_priority(teammate):
    body = login(teammate).get(reverse("job-create")).content.decode()
    distribution = re.search(r'<select name="distribution".*?</select>', body, re.S).group(0)
    assert '<option value="fsdp">Sharded data parallel (FSDP)</option>' in distribution
    assert '<option value="pipeline">Pipeline model parallel</option>' in distribution
    pipeline = section(body, "pipeline-fields")
    assert pipeline.startswith('<fieldset class="subsection" id="pipeline-fields" hidden>')
    for path in ("pipeline.stages", "pipeline.microbatches", "pipeline.schedule", "pipeline.partition",
                 "pipeline.memory_cap_mb", "pipeline"):
        assert f'data-field="{path}"' in pipeline, path  # where the API's errors for that path appear
    assert '<option value="1f1b">' in pipeline and '<option value="manual">' in pipeline
    assert 'name="pipeline_partition_counts"' in pipeline
    assert 'data-field="priority"' in body and 'name="priority" value="0" min="-100" max="100"' in body
    help_texts = json.loads(re.search(r'<script id="job-form-data" type="application/json">(.*?)</script>', body,
                                      re.S).group(1))["distribution_help"]
    assert set(help_texts) == {"none", "ddp", "fsdp", "pipeline"}


def test_a_clone_prefills_pipeline_settings_priority_and_retries(owner, project):
    job = pipeline_job(project, priority=7, retries=2, keep_alive_seconds=120)
    body = login(owner).get(reverse("job-create") + f"?clone={job.pk}").content.decode()
    assert re.search(r'id="id_distribution".*?<option value="pipeline" selected>', body, re.S)
    assert 'name="pipeline_stages" value="2"' in body and 'name="pipeline_microbatches" value="4"' in body
    assert re.search(r'id="id_pipeline_schedule".*?<option value="1f1b" selected>', body, re.S)
    assert re.search(r'id="id_pipeline_partition".*?<option value="manual" selected>', body, re.S)
    assert 'name="pipeline_partition_counts" value="3, 3"' in body
    assert 'name="pipeline_memory_cap_mb" value="300"' in body
    assert 'name="priority" value="7"' in body and 'name="retries" value="2"' in body
    assert 'name="keep_alive_seconds" value="120"' in body


def test_a_clone_of_an_even_partition_keeps_the_mode(owner, project):
    job = pipeline_job(project, pipeline={"stages": 3, "microbatches": 8, "schedule": "gpipe", "partition": "even"})
    body = login(owner).get(reverse("job-create") + f"?clone={job.pk}").content.decode()
    assert re.search(r'id="id_pipeline_partition".*?<option value="even" selected>', body, re.S)
    assert 'name="pipeline_stages" value="3"' in body


# --- the job page ------------------------------------------------------------------------------
def test_the_page_shows_priority_warm_start_and_retries_used(owner, project):
    job = pipeline_job(project, priority=-5, warm_pool="pool-7f3a", retries=2, attempt=2)
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    side = section(body, "job-side")
    assert "<dt>Priority</dt><dd>-5" in side
    assert 'started warm from pool <span class="mono">pool-7f3a</span>' in side
    assert "1 of 2 retries used" in side
    assert '2 stages · 4 microbatches · 1f1b · partition <span class="mono">3, 3</span> · cap 300 MB' in side

    cold = pipeline_job(project, warm_pool="")
    assert "cold start" in section(login(owner).get(reverse("job-detail", args=[cold.pk])).content.decode(), "job-side")
    waiting = pipeline_job(project, status=JobStatus.PENDING, started_at=None)
    assert "not started" in login(owner).get(reverse("job-detail", args=[waiting.pk])).content.decode()


def test_the_attempts_table_shows_each_launch_with_its_node_outcome_and_warm_start(owner, project):
    job = pipeline_job(project, retries=1, attempt=2, status=JobStatus.COMPLETED, finished_at=timezone.now())
    lost_node = Node.objects.create(name="cpu-a", hostname="a", queue="node.cpu-a", state=NodeState.LOST)
    warm_node = Node.objects.create(name="cpu-b", hostname="b", queue="node.cpu-b", state=NodeState.WARM)
    start = timezone.now() - timedelta(minutes=10)
    JobAttempt.objects.create(job=job, attempt=1, node_rank=0, node=lost_node, started_at=start, outcome="lost", exit_code=-9,
                              finished_at=start + timedelta(minutes=2))
    JobAttempt.objects.create(job=job, attempt=2, node_rank=0, node=warm_node, started_at=start + timedelta(minutes=3),
                              finished_at=start + timedelta(minutes=8), outcome="completed", exit_code=0, warm_start=True)
    JobAttempt.objects.create(job=job, attempt=2, node_rank=1, node=None, started_at=start + timedelta(minutes=3),
                              outcome="running")

    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    table = section(body, "attempts-table")
    rows = re.findall(r'<tr data-attempt="(\d+)" data-node-rank="(\d+)">(.*?)</tr>', table, re.S)
    assert [(a, r) for a, r, _ in rows] == [("1", "0"), ("2", "0"), ("2", "1")]
    first, second, third = (cells for _, _, cells in rows)
    assert "cpu-a" in first and 'data-status="lost"' in first and 'title="killed by SIGKILL">-9<' in first and "cold" in first
    assert "cpu-b" in second and 'data-status="completed"' in second and 'data-status="warm"' in second
    assert "—" in third and 'data-status="running"' in third
    assert "1 of 1 retry used" in section(body, "attempts-panel")


def test_the_partition_panel_lists_stages_with_times_memory_and_balance(owner, project):
    job = pipeline_job(project, status=JobStatus.COMPLETED, finished_at=timezone.now(), details={"partition": PARTITION})
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    panel = section(body, "partition-panel")
    assert "2 stages · 6 layers" in panel and "1f1b" in panel and "4 microbatches" in panel
    assert re.search(r"Balance, predicted</dt><dd[^>]*>0\.91<", panel) and re.search(r"Balance, measured</dt><dd[^>]*>0\.94<", panel)
    assert "300 MB per stage" in panel
    stage0 = re.search(r'<tr data-stage="0".*?</tr>', panel, re.S).group(0)
    stage1 = re.search(r'<tr data-stage="1".*?</tr>', panel, re.S).group(0)
    assert "0–2" in stage0 and "embed, block0, block1" in stage0 and "12.5" in stage0 and "13" in stage0
    assert "310" in stage0 and 'text-red" title="Over the memory cap"' in stage0  # 310 MB > the 300 MB cap
    assert "slowest" in stage0 and "slowest" not in stage1  # by measured time
    assert "3–5" in stage1 and "block2, block3, head" in stage1 and "10.25" in stage1 and "11.5" in stage1
    assert "head is heavier than a block" in panel
    assert 'id="job-partition" data-live-region' in body  # re-read from the server when the status changes


def test_the_partition_panel_shows_each_stage_s_measured_peak_memory(owner, project):
    measured = {**PARTITION, "memory_per_rank_mb": [381.5, 402.0, 390.0, 401.0]}  # 2 replicas of 2 stages
    job = pipeline_job(project, status=JobStatus.COMPLETED, finished_at=timezone.now(), details={"partition": measured})
    panel = section(login(owner).get(reverse("job-detail", args=[job.pk])).content.decode(), "partition-panel")
    stage0 = re.search(r'<tr data-stage="0".*?</tr>', panel, re.S).group(0)
    stage1 = re.search(r'<tr data-stage="1".*?</tr>', panel, re.S).group(0)
    assert "peak 381.5" in stage0 and "peak 402" in stage1  # replica 0's ranks: one per stage
    unmeasured = section(login(owner).get(reverse("job-detail", args=[pipeline_job(
        project, details={"partition": PARTITION}).pk])).content.decode(), "partition-panel")
    assert "peak " not in re.sub(r"<th.*?</th>", "", unmeasured, flags=re.S)


def test_a_partition_without_measurements_says_they_come_after_training(owner, project):
    predicted_only = {**PARTITION, "measured_ms": None, "balance_measured": None}
    job = pipeline_job(project, details={"partition": predicted_only})
    panel = section(login(owner).get(reverse("job-detail", args=[job.pk])).content.decode(), "partition-panel")
    assert "after training" in panel
    stage0 = re.search(r'<tr data-stage="0".*?</tr>', panel, re.S).group(0)
    assert "slowest" in stage0  # by predicted time when nothing was measured


def test_a_pipeline_job_without_a_report_yet_says_so_and_other_jobs_show_no_panel(owner, project):
    job = pipeline_job(project)
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    assert "appears here once the training processes report it" in section(body, "partition-panel")
    plain = TrainingJob.objects.create(project=project, name="plain", algorithm="tabular-classifier")
    other = login(owner).get(reverse("job-detail", args=[plain.pk])).content.decode()
    assert 'id="partition-panel"' not in other and 'id="fsdp-panel"' not in other
    assert 'id="attempts-panel"' not in other  # no launch yet


def test_the_fsdp_panel_shows_sharding_backend_and_fallbacks(owner, project):
    fsdp = {"sharding": "FULL_SHARD", "backend": "gloo", "fallbacks": ["gloo has no reduce_scatter: all_reduce used"],
            "world_size": 2}
    job = pipeline_job(project, distribution="fsdp", pipeline={}, details={"fsdp": fsdp})
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    panel = section(body, "fsdp-panel")
    assert "FULL_SHARD" in panel and "gloo" in panel and "all_reduce used" in panel
    assert "world_size" in panel and ">2<" in panel
    assert 'id="pipeline-settings"' not in body


def test_reports_from_the_processes_are_escaped(owner, project):
    details = {"partition": {**PARTITION, "layers": [XSS] * 6, "notes": [XSS], "mode": XSS},
               "fsdp": {"sharding": XSS, "fallbacks": [XSS]}}
    job = pipeline_job(project, details=details, warm_pool=XSS)
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    assert "<script>alert" not in body
    assert body.count("&lt;script&gt;alert") >= 5


def test_a_malformed_report_shows_what_it_can(owner, project):
    details = {"partition": {"stages": "two", "layers": "not a list", "stage_layers": [[3, 1], "x", [0, 1]],
                             "predicted_ms": [1, "slow", None], "measured_ms": None, "memory_mb": [True],
                             "balance_predicted": "good", "notes": "one note"},
               "fsdp": ["not", "a", "dict"]}
    job = pipeline_job(project, details=details)
    response = login(owner).get(reverse("job-detail", args=[job.pk]))
    assert response.status_code == 200
    panel = section(response.content.decode(), "partition-panel")
    assert panel.count("<tr data-stage=") == 3
    assert 'id="fsdp-panel"' not in response.content.decode()


def test_partition_report_reads_names_ranges_and_bars():
    report = partition_report({"partition": PARTITION})
    assert report is not None and report.stages == 2 and report.layer_total == 6 and report.measured
    assert [(row.first_layer, row.last_layer, row.layer_count) for row in report.rows] == [(0, 2, 3), (3, 5, 3)]
    assert [row.predicted_bar for row in report.rows] == [100, 82]
    assert [row.over_cap for row in report.rows] == [True, False]
    many = partition_report({"partition": {"stages": 1, "layers": [f"l{i}" for i in range(9)], "stage_layers": [[0, 8]]}})
    assert many.rows[0].names_shown == ["l0", "l1", "l2", "l3"] and many.rows[0].names_hidden == 5
    assert not many.rows[0].slowest  # one stage has no slowest
    assert partition_report({}) is None and partition_report(None) is None and fsdp_report({"fsdp": "x"}) is None
