"""The node agent with a real `studio worker`, real torchrun processes, Redis and the
test database: jobs that should complete, and what they leave behind."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from datasets.storage import object_uri, store_for
from jobs.models import JobStatus, NodeState
from jobs.scheduling import schedule_jobs
from jobs.transitions import transition
from tests.conftest import wait_for
from tests.jobs.conftest import (
    finished_attempt,
    live_log_lines,
    metric_points,
    run_to_end,
    status_changes,
    stored_text,
    wait_status,
)

pytestmark = pytest.mark.slow

STEP = [{"name": "step", "regex": r"step=(?P<step>\d+) loss=(?P<value>[0-9.]+)"}]
LOSS = [{"name": "loss", "regex": r"loss=([0-9.]+)"}, {"name": "epoch_loss", "regex": r"epoch=(?P<step>\d+) loss=(?P<value>[0-9.]+)"}]


def _members(uri: str) -> dict[str, bytes]:
    with store_for(uri).open_read(uri) as source, tarfile.open(fileobj=io.BytesIO(source.read()), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_sagemaker_script_runs_unchanged_and_completes_with_model(node, make_job, make_version):
    rows = "x,y\n" + "".join(f"{i / 10},{2 * i / 10 + 1}\n" for i in range(20))
    version = make_version({"train.csv": rows})
    job = make_job(script="sagemaker_style.py", inputs={"train": version}, metric_definitions=LOSS,
                   hyperparameters={"epochs": 4, "learning-rate": 0.1}, environment={"MY_SETTING": "on"})

    job = run_to_end(job)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    job.refresh_from_db()
    assert job.model_uri == f"{job.output_uri}/model.tar.gz"
    assert set(_members(job.model_uri)) == {"model.json"}
    seen = json.loads(_members(f"{job.output_uri}/output.tar.gz")["env.json"])
    env, layout = seen["env"], seen["layout"]
    for folder in ("input/config/hyperparameters.json", "input/config/resourceconfig.json", "input/data/train/train.csv",
                   "model", "output", "output/data", "checkpoints", "code/sagemaker_style.py"):
        assert folder in layout, (folder, layout)
    assert json.loads(env["SM_CHANNELS"]) == ["train"]
    assert env["SM_CHANNEL_TRAIN"].endswith("/input/data/train")
    assert json.loads(env["SM_HPS"]) == {"epochs": 4, "learning-rate": 0.1}
    assert env["SM_HP_EPOCHS"] == "4" and env["SM_HP_LEARNING_RATE"] == "0.1"
    assert json.loads(env["SM_HOSTS"]) == [node.name] and env["SM_CURRENT_HOST"] == node.name
    assert env["SM_NUM_GPUS"] == "0" and int(env["SM_NUM_CPUS"]) >= 1
    for name in ("SM_MODEL_DIR", "SM_OUTPUT_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHECKPOINT_DIR", "SM_INPUT_DIR",
                 "SM_INPUT_CONFIG_DIR", "SM_TRAINING_ENV", "SM_USER_ENTRY_POINT"):
        assert env[name], name
    assert json.loads(env["SM_TRAINING_ENV"])["hyperparameters"]["epochs"] == 4
    assert env["TRAINYARD_JOB_ID"] == str(job.pk) and env["TRAINYARD_ATTEMPT"] == "1"
    assert env["TRAINYARD_NODE_NAME"] == node.name and env["TRAINYARD_REDIS_URL"].startswith("redis://")
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "1")
    assert "DATABASE_URL" not in env, "job processes never see the database"
    assert seen["cwd"].endswith("/code")
    assert seen["argv"] == ["--epochs", "4", "--learning-rate", "0.1"]

    losses = sorted((step, value) for rank, name, step, value in metric_points(job.pk) if name == "loss")
    assert [step for step, _ in losses] == [0, 1, 2, 3]
    assert losses[-1][1] < losses[0][1], "the loss went down"
    assert sorted(s for _, name, s, _ in metric_points(job.pk) if name == "epoch_loss") == [0, 1, 2, 3]

    lines = [entry["l"] for entry in live_log_lines(job.pk) if entry["r"] == "0"]
    assert "read 20 rows from" in "\n".join(lines)
    assert "epoch=3 loss=" in stored_text(f"{job.output_uri}/logs/rank-0.log")
    assert status_changes(job) == ["Pending", "Starting", "Training", "Uploading", "Completed"]
    attempt = finished_attempt(job)
    assert (attempt.outcome, attempt.exit_code) == ("completed", 0) and attempt.finished_at
    node.refresh_from_db()
    assert node.state == NodeState.IDLE and node.current_job is None



def test_ddp_with_two_processes_shows_world_size_two_in_both_ranks_logs(node, make_job):
    job = make_job(script="ddp_world.py", distribution="ddp",
                   resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 2})

    job = run_to_end(job)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    for rank in (0, 1):
        text = stored_text(f"{job.output_uri}/logs/rank-{rank}.log")
        assert f"WORLD_SIZE=2 RANK={rank} sum=2 SM_CURRENT_HOST={node.name}" in text, text
    assert _members(job.model_uri) == {"world.txt": b"2"}


def test_stop_mid_training_ends_stopped(node, make_job):
    job = make_job(script="endless.py", metric_definitions=LOSS)
    assert job.pk in schedule_jobs()
    wait_status(job, JobStatus.TRAINING)
    wait_for(lambda: any(name == "loss" for _, name, _, _ in metric_points(job.pk)), message="a first training step")

    assert transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING],
                      stop_reason="StopRequested")

    job = wait_status(job, JobStatus.STOPPED, timeout=30)
    assert job.stop_reason == "StopRequested" and job.failure_reason == ""
    launcher = stored_text(f"{job.output_uri}/logs/launcher-node-0.log")
    assert "stopping (stop): SIGTERM" in launcher
    # A stop is not a crash: torchrun's SignalException traceback is one line of ours.
    assert "Traceback" not in launcher and "the launcher ended on the stop's signal" in launcher, launcher
    assert finished_attempt(job).outcome == "stopped"


def test_max_runtime_ends_stopped_with_max_runtime_exceeded(node, make_job):
    job = make_job(script="endless.py", stopping={"max_runtime_seconds": 4})

    job = run_to_end(job)

    assert job.status == JobStatus.STOPPED
    assert job.stop_reason == "MaxRuntimeExceeded"
    assert job.failure_reason.startswith("MaxRuntimeExceeded: ") and "(4 s)" in job.failure_reason
    assert status_changes(job)[-3:] == ["Training", "Stopping", "Stopped"]
    assert "stopping (runtime): SIGTERM" in stored_text(f"{job.output_uri}/logs/launcher-node-0.log")
    assert_worker_runs_a_good_job(make_job)


def test_a_resubmitted_job_resumes_after_its_last_checkpoint(node, make_job, isolated_storage):
    checkpoint_uri = object_uri(f"checkpoints/resume-{node.pk}")
    first = make_job(script="checkpointing.py", hyperparameters={"steps": 1000, "delay": 0.1},
                     checkpoint={"uri": checkpoint_uri}, metric_definitions=STEP)
    assert first.pk in schedule_jobs()
    wait_for(lambda: _remote_steps(checkpoint_uri) and max(_remote_steps(checkpoint_uri)) >= 5, timeout=60,
             message="a synced checkpoint past step 5")
    transition(first.pk, JobStatus.STOPPING, from_statuses=[JobStatus.TRAINING])
    wait_status(first, JobStatus.STOPPED)
    last_saved = max(_remote_steps(checkpoint_uri))
    assert len(_remote_steps(checkpoint_uri)) <= 2, "rotated checkpoints are deleted remotely too"

    second = make_job(script="checkpointing.py", hyperparameters={"steps": last_saved + 3, "delay": 0},
                      checkpoint={"uri": checkpoint_uri}, metric_definitions=STEP)
    second = run_to_end(second)

    assert second.status == JobStatus.COMPLETED, second.failure_reason
    steps = sorted(step for _, name, step, _ in metric_points(second.pk) if name == "step")
    assert steps == [last_saved + 1, last_saved + 2, last_saved + 3], (last_saved, steps)
    assert f"resumed from checkpoint step {last_saved}" in stored_text(f"{second.output_uri}/logs/rank-0.log")
    assert "restored 2 checkpoint file(s)" in " ".join(second.events.values_list("message", flat=True))


def test_a_teardown_abort_after_rank_0_saved_the_model_completes_and_says_so(node, make_job):
    job = make_job(script="teardown_abort.py",
                   resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 2})

    job = run_to_end(job)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    notes = " ".join(job.events.values_list("message", flat=True))
    assert "teardown abort after training finished: rank 1" in notes
    assert _members(job.model_uri) == {"model.txt": b"trained"}


def _remote_steps(uri: str) -> list[int]:
    return [int(o.relative_path.split("-")[1].split(".")[0]) for o in store_for(uri).list(uri + "/")]


def assert_worker_runs_a_good_job(make_job) -> None:
    job = run_to_end(make_job(script="quick.py"))
    assert job.status == JobStatus.COMPLETED, job.failure_reason


def test_a_built_in_algorithm_on_a_split_dataset_completes(node, make_job, make_version, capsys):
    """tabular-classifier through `-m algorithms.tabular`, reading the split's train and
    validation records; also measures submit → first training step, cold (no warm pool)."""
    rows = "a,b,label\n" + "".join(f"{i % 7},{(i * 3) % 11},{'big' if (i % 7) + (i * 3) % 11 > 8 else 'small'}\n"
                                   for i in range(200))
    version = make_version({"table.csv": rows}, split={"train": 0.8, "validation": 0.2, "seed": 3})
    job = make_job(algorithm="tabular-classifier", inputs={"train": version, "validation": version},
                   hyperparameters={"epochs": 2, "log_every_steps": 1, "batch_size": 32})

    job = run_to_end(job, timeout=120)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    members = _members(job.model_uri)
    assert "model.safetensors" in members
    points = metric_points(job.pk)
    assert points, "the algorithm's SDK points reached the job's stream"
    first_step_at = min(point_time for point_time in _point_times(job.pk))
    training_at = job.events.filter(status=JobStatus.TRAINING).first().at.timestamp()
    with capsys.disabled():
        print(f"\n[bench] submit → first training step (cold): {first_step_at - job.created_at.timestamp():.2f} s "
              f"(submit → processes launched {training_at - job.created_at.timestamp():.2f} s, "
              f"launch → first step {first_step_at - training_at:.2f} s)")
    log_text = stored_text(f"{job.output_uri}/logs/rank-0.log")
    assert f"{version.channel_counts['train']} train rows" in log_text, "the train channel holds the split's train records"
    assert "train_loss=" in log_text


def _point_times(job_id: int) -> list[float]:
    from studio.redis_conn import redis_client
    from trainyard.protocol import METRICS_STREAM, key

    times = []
    for _, fields in redis_client().xrange(key(METRICS_STREAM, job_id)):
        times += [point[3] for point in json.loads(fields[b"p"])]
    return times
