"""trainyard.env and trainyard.checkpoints: the SDK pieces a training process uses to read
its job directory and to save and find checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainyard import checkpoints
from trainyard.env import TrainingEnvironment


def test_environment_reads_sagemaker_torch_and_trainyard_variables(tmp_path):
    env = TrainingEnvironment.from_env({
        "SM_MODEL_DIR": "/job/model",
        "SM_OUTPUT_DIR": "/job/output",
        "SM_CHECKPOINT_DIR": "/job/checkpoints",
        "SM_CHANNELS": json.dumps(["train", "validation"]),
        "SM_CHANNEL_TRAIN": "/job/input/data/train",
        "SM_CHANNEL_VALIDATION": "/job/input/data/validation",
        "SM_CHANNEL_EXTRA": "/job/input/data/extra",
        "SM_HPS": json.dumps({"epochs": "3", "label_column": "y"}),
        "SM_HOSTS": json.dumps(["algo-1", "algo-2"]),
        "SM_CURRENT_HOST": "algo-2",
        "SM_NUM_GPUS": "0",
        "SM_NUM_CPUS": "8",
        "SM_FRAMEWORK_PARAMS": "{}",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "TRAINYARD_JOB_ID": "17",
        "TRAINYARD_ATTEMPT": "2",
        "TRAINYARD_CHECKPOINT_EVERY_STEPS": "50",
    })
    assert env.model_dir == Path("/job/model") and env.output_dir == Path("/job/output")
    assert env.output_data_dir == Path("/job/output/data")  # SageMaker's layout when unset
    assert env.checkpoint_dir == Path("/job/checkpoints")
    assert env.channels == {"extra": Path("/job/input/data/extra"), "train": Path("/job/input/data/train"),
                            "validation": Path("/job/input/data/validation")}
    assert env.hyperparameters == {"epochs": "3", "label_column": "y"}
    assert (env.hosts, env.current_host, env.num_gpus, env.num_cpus) == (["algo-1", "algo-2"], "algo-2", 0, 8)
    assert (env.rank, env.world_size, env.local_rank, env.is_main_process) == (3, 4, 1, False)
    assert (env.job_id, env.attempt, env.checkpoint_every_steps) == ("17", 2, 50)
    assert env.failure_file == Path("/job/output/failure")
    assert env.extra == {"SM_FRAMEWORK_PARAMS": "{}"}


def test_environment_defaults_are_sagemakers_and_a_single_process():
    env = TrainingEnvironment.from_env({})
    assert env.model_dir == Path("/opt/ml/model") and env.checkpoint_dir == Path("/opt/ml/checkpoints")
    assert (env.rank, env.world_size, env.channels, env.hyperparameters) == (0, 1, {}, {})
    assert env.is_main_process and env.checkpoint_every_steps == 0


def test_hyperparameters_fall_back_to_the_job_directory_file(tmp_path):
    (tmp_path / "hyperparameters.json").write_text('{"epochs": "2"}')
    assert TrainingEnvironment.from_env({"SM_INPUT_CONFIG_DIR": str(tmp_path)}).hyperparameters == {"epochs": "2"}


@pytest.mark.parametrize(("environ", "message"), [
    ({"SM_HPS": "{epochs: 2"}, "SM_HPS is not valid JSON"),
    ({"SM_HPS": "[1]"}, "SM_HPS must be a JSON object"),
    ({"WORLD_SIZE": "two"}, "environment variable WORLD_SIZE must be an integer, got 'two'"),
])
def test_a_broken_environment_says_which_variable(environ, message):
    with pytest.raises(ValueError, match=message):
        TrainingEnvironment.from_env(environ)


def test_checkpoints_are_atomic_ordered_and_only_the_newest_two_kept(tmp_path):
    assert checkpoints.latest_checkpoint(tmp_path / "missing") is None
    for step in (5, 10, 100, 20):
        checkpoints.save_checkpoint({"step": step, "weights": [step]}, step, tmp_path)
    # A partial file of a writer that died mid-save is never taken for a checkpoint.
    (tmp_path / ".checkpoint-000000999.pt.tmp-123").write_bytes(b"half")
    assert [path.name for _, path in checkpoints.list_checkpoints(tmp_path)] == [
        "checkpoint-000000020.pt", "checkpoint-000000100.pt"]
    step, path = checkpoints.latest_checkpoint(tmp_path)
    assert step == 100 and checkpoints.load_checkpoint(path) == {"step": 100, "weights": [100]}
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name and "999" not in name]


def test_loading_refuses_pickled_code(tmp_path):
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "checkpoint-000000001.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(Exception, match="[Ww]eights only"):
        checkpoints.load_checkpoint(path)
