"""Built-in algorithms run the way the runner will run them: a job directory laid out as
docs/SPEC.md §3.4 says, SM_* variables, `python -m torch.distributed.run ... -m algorithms.X`.
Most runs are tiny and in-process (same code path below the launcher); a few go through
torchrun for real, one with two DDP processes.

The helpers here (JobDir, run_in_process, ...) are shared by test_algorithm_kinds.py.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from algorithms import get_algorithm
from tests.conftest import ROOT

# Variables a training process reads; cleared around in-process runs so one test's job
# never leaks into the next (or the developer's shell into a test).
_JOB_VARIABLE = re.compile(r"^(SM_|TRAINYARD_|RANK$|WORLD_SIZE$|LOCAL_RANK$|LOCAL_WORLD_SIZE$|MASTER_)")


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    failure: str | None

    def metric(self, algorithm: str, name: str) -> list[tuple[int, float]]:
        """(step, value) of every printed point, found with the algorithm's own
        metric_definitions regex, so the definitions are tested along the way."""
        spec = get_algorithm(algorithm)
        assert spec is not None
        (definition,) = [item for item in spec.metric_definitions if item["name"] == name]
        points = []
        for line in self.stdout.splitlines():
            found = re.search(definition["regex"], line)
            if found:
                step = re.search(r"(?:^|\s)step=(\d+)", line)
                assert step, f"metric line without a step: {line}"
                points.append((int(step.group(1)), float(found.group(1))))
        return points

    def last(self, algorithm: str, name: str) -> float:
        points = self.metric(algorithm, name)
        assert points, f"no {name} in output:\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        return points[-1][1]


class JobDir:
    """A job directory as docs/SPEC.md §3.4 lays it out; write channel files under channel(name)."""

    def __init__(self, root: Path, hyperparameters: dict | None = None) -> None:
        self.root = root
        self.hyperparameters = dict(hyperparameters or {})
        for folder in ("input/config", "input/data", "model", "output/data", "checkpoints"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    model = property(lambda self: self.root / "model")
    output = property(lambda self: self.root / "output")
    checkpoints = property(lambda self: self.root / "checkpoints")

    def channel(self, name: str) -> Path:
        folder = self.root / "input" / "data" / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def env(self, *, checkpoint_every_steps: int = 0) -> dict[str, str]:
        channels = sorted(path.name for path in (self.root / "input" / "data").iterdir() if path.is_dir())
        # SageMaker hands every hyperparameter over as a string; so do we, to prove coercion.
        hyperparameters = {name: str(value) for name, value in self.hyperparameters.items()}
        (self.root / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
        (self.root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
        env = {
            "SM_MODEL_DIR": str(self.model),
            "SM_OUTPUT_DIR": str(self.output),
            "SM_OUTPUT_DATA_DIR": str(self.output / "data"),
            "SM_CHECKPOINT_DIR": str(self.checkpoints),
            "SM_INPUT_CONFIG_DIR": str(self.root / "input/config"),
            "SM_CHANNELS": json.dumps(channels),
            "SM_HPS": json.dumps(hyperparameters),
            "SM_HOSTS": json.dumps(["algo-1"]),
            "SM_CURRENT_HOST": "algo-1",
            "SM_NUM_CPUS": "2",
            "SM_NUM_GPUS": "0",
            "TRAINYARD_CHECKPOINT_EVERY_STEPS": str(checkpoint_every_steps),
        }
        env.update({f"SM_CHANNEL_{name.upper()}": str(self.channel(name)) for name in channels})
        return env

    def failure(self) -> str | None:
        path = self.output / "failure"
        return path.read_text() if path.exists() else None


@contextlib.contextmanager
def job_environ(values: dict[str, str]):
    saved = dict(os.environ)
    for name in [name for name in os.environ if _JOB_VARIABLE.match(name)]:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_in_process(job: JobDir, module: str, **env_options: int) -> RunResult:
    """main() of the algorithm module in this process: the same code below the launcher,
    minus a second or two of interpreter and torch start-up per run."""
    import importlib

    import torch

    main = importlib.import_module(module).main
    stdout, stderr = io.StringIO(), io.StringIO()
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    returncode = 0
    torch.set_num_threads(1)  # other engineers' tests share these two cores
    try:
        with job_environ(job.env(**env_options)), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main()
            except SystemExit as exc:
                returncode = exc.code if isinstance(exc.code, int) else 1
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return RunResult(returncode, stdout.getvalue(), stderr.getvalue(), job.failure())


def run_torchrun(job: JobDir, module: str, *, processes: int = 1, timeout: float = 180, threads: int | None = 1,
                 **env_options: int) -> RunResult:
    """The launch the runner does: torch.distributed.run in a subprocess, cwd = the repository."""
    env = {name: value for name, value in os.environ.items() if not _JOB_VARIABLE.match(name)}
    env.update(job.env(**env_options))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               "-m", module]
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return RunResult(completed.returncode, completed.stdout, completed.stderr, job.failure())


def assert_ok(result: RunResult) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert result.failure is None


# --- data ------------------------------------------------------------------------------------
def write_small_tabular(folder: Path, name: str, rows: int, seed: int) -> list[dict]:
    """The demo table's recipe (3 classes around seeded centres, a region column) at a size
    that trains in a blink."""
    from datasets.demo import TABULAR_CLASSES, TABULAR_FEATURES, TABULAR_REGIONS, tabular_arrays

    centers = np.random.default_rng(7).normal(0.0, 1.0, size=(len(TABULAR_CLASSES), TABULAR_FEATURES)) * 1.5
    features, region, labels = tabular_arrays(rows, np.random.default_rng(seed), centers)
    header = [f"feature_{i:02d}" for i in range(1, TABULAR_FEATURES + 1)] + ["region", "label"]
    records = [dict(zip(header, [f"{value:.4f}" for value in row] + [TABULAR_REGIONS[reg], TABULAR_CLASSES[lab]], strict=True))
               for row, reg, lab in zip(features, region, labels, strict=True)]
    with open(folder / name, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=header)
        writer.writeheader()
        writer.writerows(records)
    return records


def tabular_job(root: Path, **hyperparameters) -> tuple[JobDir, list[dict]]:
    job = JobDir(root, {"epochs": 3, "batch_size": 32, "log_every_steps": 5, **hyperparameters})
    write_small_tabular(job.channel("train"), "train.csv", 480, seed=1)
    validation = write_small_tabular(job.channel("validation"), "validation.csv", 120, seed=2)
    return job, validation


def weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def assert_same_weights(first: Path, second: Path) -> None:
    import torch

    a, b = weights(first), weights(second)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


# --- tabular, through the real launcher ----------------------------------------------------
def test_tabular_job_writes_model_metrics_and_predicts(tmp_path):
    from algorithms.predict import load_predictor

    job, validation = tabular_job(tmp_path)
    result = run_torchrun(job, "algorithms.tabular")
    assert_ok(result)
    assert "rank 0/1 on host algo-1" in result.stdout and "WORLD_SIZE=1" in result.stdout
    assert "found in sys.modules" not in result.stderr  # -m does not import the module twice
    # 480 train rows (a validation channel exists, so none held out) / 32 → 15 steps per epoch.
    train_loss = result.metric("tabular-classifier", "train_loss")
    assert [step for step, _ in train_loss][:3] == [5, 10, 15]
    assert [value for _, value in result.metric("tabular-classifier", "epoch")] == [1, 2, 3]
    assert result.last("tabular-classifier", "validation_accuracy") >= 0.85
    assert {path.name for path in job.model.iterdir()} == {"model.safetensors", "config.json", "labels.json"}
    config = json.loads((job.model / "config.json").read_text())
    assert config["algorithm"] == "tabular-classifier"
    assert config["hyperparameters"]["epochs"] == 3  # "3" arrived as a string and was coerced
    assert config["input"]["label_column"] == "label"
    assert config["input"]["categorical"] == [{"name": "region", "vocabulary": ["east", "north", "south", "west"]}]
    assert len(config["input"]["numeric"]) == 10 and {"mean", "std"} <= config["input"]["numeric"][0].keys()
    assert json.loads((job.model / "labels.json").read_text()) == {"0": "alpine", "1": "coastal", "2": "desert"}
    assert [path.name for path in sorted(job.checkpoints.iterdir())] == ["checkpoint-000000030.pt", "checkpoint-000000045.pt"]

    predictor = load_predictor(job.model)
    predictions = predictor.predict([{key: value for key, value in row.items() if key != "label"} for row in validation])
    accuracy = np.mean([p["label"] == row["label"] for p, row in zip(predictions, validation, strict=True)])
    assert accuracy == pytest.approx(result.last("tabular-classifier", "validation_accuracy"), abs=1e-6)
    first = predictions[0]
    assert set(first["probabilities"]) == {"alpine", "coastal", "desert"}
    assert sum(first["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    assert first["confidence"] == max(first["probabilities"].values())
    assert first["probabilities"][first["label"]] == first["confidence"]
    # Numbers as numbers, a missing column and an unseen category still predict.
    assert predictor.predict([{"feature_01": 1.5, "region": "atlantis"}])[0]["label"] in {"alpine", "coastal", "desert"}


def test_ddp_with_two_processes_both_ranks_see_world_size_2(tmp_path):
    job, _ = tabular_job(tmp_path, epochs=2)
    result = run_torchrun(job, "algorithms.tabular", processes=2)
    assert_ok(result)
    for rank in (0, 1):
        assert re.search(rf"^rank {rank}/2 on host .* WORLD_SIZE=2 ", result.stdout, re.M), result.stdout
    # Each rank trains on half of each epoch: 480 rows / 2 ranks / 32 → 8 steps per epoch.
    assert "8 steps per epoch" in result.stdout
    # Every rank reports; validation figures are summed over ranks, so they agree.
    accuracy = result.metric("tabular-classifier", "validation_accuracy")
    assert len(accuracy) == 4 and accuracy[2][1] == accuracy[3][1]
    assert (job.model / "model.safetensors").exists()
    assert len(list(job.checkpoints.glob("checkpoint-*.pt"))) == 2
    assert result.stdout.count("wrote ") == 1  # model/ from rank 0 only


# --- determinism and resuming, in-process ----------------------------------------------------
def test_same_seed_gives_same_model_and_another_seed_does_not(tmp_path):
    runs = []
    for name, seed in (("a", 42), ("b", 42), ("c", 7)):
        job, _ = tabular_job(tmp_path / name, epochs=2, seed=seed)
        result = run_in_process(job, "algorithms.tabular")
        assert_ok(result)
        runs.append((job, result))
    (a, result_a), (b, result_b), (c, _) = runs
    assert_same_weights(a.model, b.model)
    assert result_a.metric("tabular-classifier", "validation_loss") == result_b.metric("tabular-classifier", "validation_loss")
    with pytest.raises(AssertionError):
        assert_same_weights(a.model, c.model)


def test_resume_from_a_mid_epoch_checkpoint_matches_an_uninterrupted_run(tmp_path):
    """Dropout is on, so the RNG state must travel with the checkpoint too."""
    settings = {"epochs": 3, "dropout": 0.3}
    whole, _ = tabular_job(tmp_path / "whole", **settings)
    assert_ok(run_in_process(whole, "algorithms.tabular", checkpoint_every_steps=7))

    # Interrupted at step 23 (mid epoch 2): checkpoints at 7, 14, 21 and the stop at 23.
    cut, _ = tabular_job(tmp_path / "cut", **settings, max_steps=23)
    first = run_in_process(cut, "algorithms.tabular", checkpoint_every_steps=7)
    assert_ok(first)
    assert [path.name for path in sorted(cut.checkpoints.iterdir())] == ["checkpoint-000000021.pt", "checkpoint-000000023.pt"]

    # Same job again, no step limit, same checkpoint folder: picks up after step 23.
    cut.hyperparameters.pop("max_steps")
    resumed = run_in_process(cut, "algorithms.tabular", checkpoint_every_steps=7)
    assert_ok(resumed)
    assert "resumed from checkpoint step 23" in resumed.stdout
    assert resumed.metric("tabular-classifier", "train_loss")[0][0] == 25  # first report after the checkpoint
    assert_same_weights(whole.model, cut.model)


def test_resume_skips_an_unreadable_newest_checkpoint(tmp_path):
    job, _ = tabular_job(tmp_path, epochs=2)
    assert_ok(run_in_process(job, "algorithms.tabular"))
    newest = sorted(job.checkpoints.iterdir())[-1]
    newest.write_bytes(b"cut short by a sync")
    result = run_in_process(job, "algorithms.tabular")
    assert_ok(result)
    assert "resumed from checkpoint step 15" in result.stdout
    assert "unreadable" in result.stderr


def test_metrics_also_reach_the_sdk(tmp_path):
    from trainyard.metrics import get_logger

    job, _ = tabular_job(tmp_path, epochs=1)
    assert_ok(run_in_process(job, "algorithms.tabular"))
    names = {point[0] for point in get_logger().recent()}
    assert {"train_loss", "validation_loss", "validation_accuracy", "epoch"} <= names


# --- failures a person can act on ------------------------------------------------------------
def test_missing_label_column_fails_with_a_clear_reason(tmp_path):
    job, _ = tabular_job(tmp_path, label_column="species")
    result = run_in_process(job, "algorithms.tabular")
    assert result.returncode == 2
    columns = ", ".join([f"feature_{i:02d}" for i in range(1, 11)] + ["region", "label"])
    assert result.failure == f"label column 'species' not found in train.csv; columns are {columns}\n"
    assert "label column 'species' not found" in result.stderr


@pytest.mark.parametrize(("prepare", "expected"), [
    (lambda job: job.hyperparameters.update(epochs="abc"), "invalid hyperparameters: epochs: expected an integer, got 'abc'"),
    (lambda job: job.hyperparameters.update(learning_rate="5"), "learning_rate: must be ≤ 1"),
    (lambda job: (job.channel("train") / "train.csv").write_text("a,b\n1,2\n3,4\n"),
     "no label column in train.csv: set the hyperparameter label_column to one of a, b"),
    (lambda job: (job.channel("train") / "train.csv").write_text("x,label\n1,a\n2\n"), "train.csv line 3: 1 fields, the header has 2"),
    (lambda job: (job.channel("train") / "train.csv").write_text("x,label\n1,a\n2,a\n"),
     "train.csv has only 'a': a classifier needs at least two classes"),
    (lambda job: (job.channel("train") / "train.csv").rename(job.channel("train") / "train.parquet"),
     "no .csv, .tsv, .jsonl, .ndjson files in channel 'train'; it holds train.parquet"),
])
def test_bad_input_fails_with_its_reason(tmp_path, prepare, expected):
    job, _ = tabular_job(tmp_path)
    prepare(job)
    result = run_in_process(job, "algorithms.tabular")
    assert result.returncode == 2
    assert result.failure is not None and expected in result.failure, result.failure


def test_missing_train_channel_fails(tmp_path):
    job = JobDir(tmp_path)
    result = run_in_process(job, "algorithms.tabular")
    assert result.returncode == 2
    assert result.failure == "no 'train' channel: this algorithm needs 'train' input data\n"


# --- the acceptance figure -------------------------------------------------------------------
@pytest.mark.slow
def test_tabular_reaches_90_percent_on_the_demo_data_within_a_minute(tmp_path):
    from datasets.demo import write_tabular

    job = JobDir(tmp_path / "job")
    files = write_tabular(tmp_path)
    files["train.csv"].rename(job.channel("train") / "train.csv")
    files["validation.csv"].rename(job.channel("validation") / "validation.csv")
    started = time.monotonic()
    result = run_torchrun(job, "algorithms.tabular", threads=None)  # default hyperparameters
    elapsed = time.monotonic() - started
    assert_ok(result)
    accuracy = result.last("tabular-classifier", "validation_accuracy")
    print(f"demo-tabular: validation_accuracy={accuracy:.4f} in {elapsed:.1f}s (launch included)")
    assert accuracy >= 0.90
    assert elapsed < 60
