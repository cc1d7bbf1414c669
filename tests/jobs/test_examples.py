"""The examples in examples/ run as jobs, each unchanged under distribution none, ddp (2
processes) and its own form (fsdp, or a pipeline of 2 stages): the same script, resubmitted
with each distribution. The pipelined custom model computes what one process computes
(microbatching does not change the maths), so its losses match the single-process run of
the same seed, step by step.
"""

from __future__ import annotations

import pytest

from datasets.storage import default_store, object_uri, store_for
from jobs.actions import submit_job
from jobs.metrics.ingest import flush_once
from jobs.models import JobStatus, MetricPoint, TrainingJob
from tests.conftest import ROOT
from tests.jobs.conftest import run_to_end

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
# Small enough for 2 CPU cores; the examples' defaults are what a person would run.
HYPERPARAMETERS = {
    "ddp_classifier": {"epochs": 1, "batch_size": 64},
    "fsdp_transformer": {"steps": 8, "checkpoint_every": 4, "width": 32, "layers": 1},
    "pipeline_custom": {"steps": 8, "batch_size": 32},
}
OWN_FORM = {"ddp_classifier": "ddp", "fsdp_transformer": "fsdp", "pipeline_custom": "pipeline"}


def submit_example(project, owner, example: str, distribution: str) -> TrainingJob:
    uri = object_uri(f"scripts/{project.slug}/examples/{example}/train.py")
    default_store().put_file(EXAMPLES / example / "train.py", uri)
    data = {"project": project.slug, "name": f"{example.replace('_', '-')}-{distribution}",
            "script": {"uri": uri, "entry_point": "train.py"}, "hyperparameters": HYPERPARAMETERS[example],
            "distribution": distribution,
            "resources": {"instance_type": "cpu", "processes_per_node": 1 if distribution == "none" else 2}}
    if distribution == "pipeline":
        data["pipeline"] = {"stages": 2, "microbatches": 4, "partition": "auto"}
    return submit_job(project=project, user=owner, data=data)


def losses(job: TrainingJob) -> dict[int, float]:
    while flush_once(block_ms=100):
        pass
    return dict(MetricPoint.objects.filter(job=job, name="train_loss", rank=0).order_by("step")
                .values_list("step", "value"))


def log_of(job: TrainingJob) -> str:
    uri = f"{job.output_uri}/logs/rank-0.log"
    with store_for(uri).open_read(uri) as source:
        return source.read().decode(errors="replace")


@pytest.mark.parametrize("example", sorted(OWN_FORM))
def test_an_example_runs_unchanged_as_one_process_ddp_and_its_own_form(node, project, owner, example):
    finished = {}
    for distribution in dict.fromkeys(["none", "ddp", OWN_FORM[example]]):
        job = run_to_end(submit_example(project, owner, example, distribution), timeout=300)
        assert job.status == JobStatus.COMPLETED, (distribution, job.failure_reason, log_of(job)[-3000:])
        assert job.model_uri, "the script saved the whole model on rank 0"
        finished[distribution] = job
        assert losses(job), f"{distribution}: no train_loss points"
    reports = finished[OWN_FORM[example]].details or {}
    assert reports.get("parallel", {}).get("kind") == OWN_FORM[example], reports
    if OWN_FORM[example] == "pipeline":
        partition = reports["partition"]
        assert len(partition["stage_layers"]) == 2 and partition["mode"] == "auto", partition
        assert partition["measured_ms"] and partition["balance_predicted"], partition
        assert "pipeline stage 0/2: blocks 0.." in log_of(finished["pipeline"]), "rank 0 held the first stage"
        # Microbatching does not change the maths: every step's loss is one process's.
        expected, got = losses(finished["none"]), losses(finished["pipeline"])
        assert sorted(expected) == sorted(got) == list(range(1, HYPERPARAMETERS[example]["steps"] + 1))
        for step in expected:
            assert got[step] == pytest.approx(expected[step], rel=1e-4), (step, expected[step], got[step])
    if OWN_FORM[example] == "fsdp":
        assert reports["fsdp"]["api"] == "fully_shard" and reports["fsdp"]["backend"] == "gloo", reports["fsdp"]
