"""A built-in algorithm submitted the way users submit it (the API's action), run by a real
node worker with real torch processes, its metrics flushed to the database."""

from __future__ import annotations

import io
import tarfile

import pytest

from datasets.actions import VersionOptions, register_local_files
from datasets.demo import write_tabular
from datasets.storage import store_for
from datasets.validation_run import run_validation
from jobs.actions import submit_job
from jobs.metrics.ingest import flush_once
from jobs.models import JobStatus, MetricPoint
from tests.jobs.conftest import run_to_end, stored_text

pytestmark = pytest.mark.slow


def test_tabular_job_on_demo_data_completes_with_model_and_accuracy_over_90(node, project, owner, tmp_path):
    files = write_tabular(tmp_path)
    version, _ = register_local_files(project=project, name="demo-tabular", description="", user=owner, files=files,
                                      options=VersionOptions())
    assert run_validation(version.pk) == "ready"
    job = submit_job(project=project, user=owner, data={
        "name": "demo", "algorithm": "tabular-classifier", "hyperparameters": {},
        "inputs": {"train": version.pk}, "resources": {"instance_type": "cpu"},
    })
    assert job.hyperparameters["label_column"] == "label"

    job = run_to_end(job, timeout=180)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert [e.status for e in job.events.order_by("at", "pk")][:1] == ["Pending"]
    assert {"Starting", "Training", "Uploading", "Completed"} <= set(job.events.values_list("status", flat=True))
    with store_for(job.model_uri).open_read(job.model_uri) as source, \
            tarfile.open(fileobj=io.BytesIO(source.read()), mode="r:gz") as archive:
        names = archive.getnames()
    assert {"model.safetensors", "config.json", "labels.json"} <= {name.removeprefix("./") for name in names}
    while flush_once(block_ms=100):
        pass
    job.refresh_from_db()
    accuracy = job.final_metrics["validation_accuracy"]
    assert accuracy >= 0.90, job.final_metrics
    stored = MetricPoint.objects.filter(job=job, name="validation_accuracy", rank=0).order_by("-step").first()
    assert stored is not None and stored.value == pytest.approx(accuracy)
    assert "validation_accuracy=" in stored_text(f"{job.output_uri}/logs/rank-0.log")


def test_built_in_algorithms_read_stream_mode_channels(node, make_job, make_version):
    """`stream` mode stages no copy: the algorithms read the records from the object store
    through the channel's manifest, a split version giving each channel only its records."""
    rows = "a,b,label\n" + "".join(f"{i % 7},{(i * 3) % 11},{'big' if (i % 7) + (i * 3) % 11 > 8 else 'small'}\n"
                                   for i in range(200))
    table = make_version({"table.csv": rows}, split={"train": 0.75, "validation": 0.25, "seed": 5})
    job = make_job(algorithm="tabular-classifier", inputs={"train": (table, "stream"), "validation": (table, "stream")},
                   hyperparameters={"epochs": 1, "batch_size": 32})
    job = run_to_end(job, timeout=120)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    log_text = stored_text(f"{job.output_uri}/logs/rank-0.log")
    assert f"{table.channel_counts['train']} train rows" in log_text

    from io import BytesIO

    from PIL import Image

    def png(colour: tuple[int, int, int]) -> bytes:
        out = BytesIO()
        Image.new("RGB", (8, 8), colour).save(out, format="PNG")
        return out.getvalue()

    images = make_version({f"{label}/{i}.png": png(colour) for label, colour in (("red", (255, 0, 0)), ("blue", (0, 0, 255)))
                           for i in range(6)})
    job = make_job(algorithm="image-classifier", inputs={"train": (images, "stream")},
                   hyperparameters={"epochs": 1, "image_size": 8})
    job = run_to_end(job, timeout=120)
    assert job.status == JobStatus.COMPLETED, job.failure_reason


def test_a_pipeline_char_lm_job_completes_and_reports_its_partition(node, project, owner, make_version):
    text = "".join(f"the quick brown fox {i % 7} jumps over the lazy dog.\n" for i in range(300))
    version = make_version({"train.txt": text}, name="fox-text")
    job = submit_job(project=project, user=owner, data={
        "name": "pipe", "algorithm": "char-lm", "inputs": {"train": version.pk}, "distribution": "pipeline",
        "hyperparameters": {"layers": 2, "embedding_dim": 32, "heads": 2, "context_length": 16, "batch_size": 16,
                            "max_steps": 12, "log_every_steps": 4, "dropout": 0.0},
        "pipeline": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "partition": "auto"},
        "resources": {"instance_type": "cpu"},
    })
    assert job.processes_per_node == 2

    job = run_to_end(job, timeout=240)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    partition = job.details["partition"]
    assert partition["stages"] == 2 and partition["mode"] == "auto" and partition["schedule"] == "1f1b"
    assert len(partition["stage_layers"]) == 2 and partition["stage_layers"][0][0] == 0
    assert partition["stage_layers"][-1][1] == len(partition["layers"]) - 1 == 3
    assert all(isinstance(ms, (int, float)) for ms in partition["measured_ms"]), "measured at the end of training"
    log = stored_text(f"{job.output_uri}/logs/rank-0.log")
    assert "train_loss=" in log


def test_an_fsdp_char_lm_job_completes_and_says_what_ran(node, project, owner, make_version):
    text = "".join(f"pack my box with five dozen liquor jugs {i % 5}.\n" for i in range(200))
    version = make_version({"train.txt": text}, name="jugs-text")
    job = submit_job(project=project, user=owner, data={
        "name": "sharded", "algorithm": "char-lm", "inputs": {"train": version.pk}, "distribution": "fsdp",
        "hyperparameters": {"layers": 1, "embedding_dim": 32, "heads": 2, "context_length": 16, "batch_size": 16,
                            "max_steps": 6, "log_every_steps": 3},
        "resources": {"instance_type": "cpu", "processes_per_node": 2},
    })

    job = run_to_end(job, timeout=240)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    fsdp = job.details["fsdp"]
    assert fsdp["backend"] == "gloo"
    assert "fallbacks" in fsdp
