"""The runner's pure pieces, without a worker: the launch command (single node, multi-node,
GPU), the job environment, output capture, verdicts, staging and checkpoint sync."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from datasets.storage import default_store, object_uri, store_for
from jobs.runner.artifacts import CheckpointSync, fetch_script
from jobs.runner.process import guard
from jobs.runner.process.capture import LAUNCHER_RANK, OutputCapture, compile_metric_rules, split_prefix
from jobs.runner.process.jobdir import JobDir, LaunchFacts, build_environment, write_config
from jobs.runner.process.launch import LaunchSpec, build_command, describe_exit, launch_environment, parse_root_cause
from jobs.runner.process.outcome import Observed, judge
from jobs.runner.staging import DataCache, StagingError, VersionFacts, plan_channel, stage_channel
from studio.redis_conn import redis_client
from tests.factories import validated_version_facts

PY = "/venv/bin/python"


# --- launch -------------------------------------------------------------------------------------
def test_single_node_launch_is_standalone(tmp_path):
    spec = LaunchSpec(job_id=7, attempt=2, python=PY, spool_dir=tmp_path, module="algorithms.tabular", nproc_per_node=2)

    assert build_command(spec) == [
        PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--standalone",
        "--max_restarts", "0", "--role", "trainer", "--tee", "3", "--log_dir", str(tmp_path),
        "--module", "--", "algorithms.tabular"]
    assert launch_environment(spec) == {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
                                        "TRAINYARD_DIST_BACKEND": "gloo"}


def test_multi_node_launch_uses_a_static_rendezvous_hosted_by_node_0(tmp_path):
    leader = LaunchSpec(job_id=7, attempt=2, python=PY, spool_dir=tmp_path, script="train.py", args=["--epochs", "3"],
                        nnodes=3, node_rank=0, nproc_per_node=1, rendezvous_endpoint="10.0.0.5:29400")
    follower = LaunchSpec(job_id=7, attempt=2, python=PY, spool_dir=tmp_path, script="train.py", nnodes=3, node_rank=2,
                          nproc_per_node=1, rendezvous_endpoint="10.0.0.5:29400")

    command = build_command(leader)
    assert command[3:7] == ["--nnodes", "3", "--nproc_per_node", "1"]
    assert "--standalone" not in command
    rendezvous = command[command.index("--node_rank"):command.index("--max_restarts")]
    assert rendezvous == ["--node_rank", "0", "--rdzv_backend", "static", "--rdzv_endpoint", "10.0.0.5:29400",
                          "--rdzv_id", "job-7-2"]
    assert command[-3:] == ["train.py", "--epochs", "3"]
    assert build_command(follower)[build_command(follower).index("--node_rank") + 1] == "2"
    with pytest.raises(ValueError, match="rendezvous endpoint"):
        LaunchSpec(job_id=7, attempt=2, python=PY, spool_dir=tmp_path, script="t.py", nnodes=2)


def test_gpu_launch_runs_one_process_per_gpu_with_nccl(tmp_path):
    spec = LaunchSpec(job_id=1, attempt=1, python=PY, spool_dir=tmp_path, module="algorithms.charlm", gpus=4)

    command = build_command(spec)

    assert command[command.index("--nproc_per_node") + 1] == "4"
    env = launch_environment(spec)
    assert env["TRAINYARD_DIST_BACKEND"] == "nccl"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    explicit = LaunchSpec(job_id=1, attempt=1, python=PY, spool_dir=tmp_path, module="m", gpus=4, nproc_per_node=2)
    assert explicit.processes == 2


ROOT_CAUSE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_08:53:25
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 30864)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_08:53:25
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 30865)
  error_file: <N/A>
============================================================""".splitlines()


def test_the_launchers_root_cause_names_the_first_failed_rank():
    failure = parse_root_cause(ROOT_CAUSE)
    assert failure is not None and (failure.rank, failure.exit_code) == (3, -9)
    assert parse_root_cause(["E1130 api.py:1002] failed (exitcode: 3) local_rank: 1 (pid: 5) of binary: python"]).exit_code == 3
    assert parse_root_cause(["nothing here"]) is None
    assert (describe_exit(-9), describe_exit(2)) == ("killed by SIGKILL", "exit code 2")


# --- the job directory and environment ------------------------------------------------------------
def _facts(**overrides) -> LaunchFacts:
    values = dict(job_id=5, job_name="iris", attempt=1, node_rank=1, hosts=["node-a", "node-b"],
                  hyperparameters={"epochs": 3, "lr": 0.1, "name": "x", "flag": True},
                  channels={"train": "file", "validation": "stream"}, entry_point="train.py", num_gpus=0, num_cpus=8,
                  redis_url="redis://r:6379/0", checkpoint_every_steps=50, environment={"MY_FLAG": "1"})
    values.update(overrides)
    return LaunchFacts(**values)


def test_environment_follows_sagemaker_and_keeps_the_workers_secrets(tmp_path):
    job_dir = JobDir(tmp_path / "job")
    base = {"PATH": "/bin", "DATABASE_URL": "postgres://secret", "STUDIO_SECRET_KEY": "s", "AWS_ACCESS_KEY_ID": "k"}

    env = build_environment(job_dir, _facts(), base)

    assert env["SM_CHANNELS"] == '["train", "validation"]'
    assert env["SM_CHANNEL_TRAIN"] == str(job_dir.root / "input/data/train")
    assert env["SM_HP_EPOCHS"] == "3" and env["SM_HP_FLAG"] == "true" and env["SM_HP_NAME"] == "x"
    assert json.loads(env["SM_HPS"]) == {"epochs": 3, "lr": 0.1, "name": "x", "flag": True}
    assert (env["SM_HOSTS"], env["SM_CURRENT_HOST"]) == ('["node-a", "node-b"]', "node-b")
    assert (env["SM_NUM_GPUS"], env["SM_NUM_CPUS"]) == ("0", "8")
    assert env["SM_CHECKPOINT_DIR"] == str(job_dir.root / "checkpoints")
    assert json.loads(env["SM_TRAINING_ENV"])["is_master"] is False
    assert (env["TRAINYARD_JOB_ID"], env["TRAINYARD_CHECKPOINT_EVERY_STEPS"], env["MY_FLAG"]) == ("5", "50", "1")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(job_dir.code_dir)
    assert env["PATH"] == "/bin" and env["AWS_ACCESS_KEY_ID"] == "k"
    assert "DATABASE_URL" not in env and "STUDIO_SECRET_KEY" not in env


def test_config_files_hold_strings_like_sagemaker(tmp_path):
    job_dir = JobDir(tmp_path)
    write_config(job_dir, _facts())

    assert json.loads((job_dir.config_dir / "hyperparameters.json").read_text()) == {
        "epochs": "3", "lr": "0.1", "name": "x", "flag": "true"}
    assert json.loads((job_dir.config_dir / "resourceconfig.json").read_text()) == {
        "current_host": "node-b", "hosts": ["node-a", "node-b"], "network_interface_name": "lo"}


# --- capture ---------------------------------------------------------------------------------------
def test_line_prefixes_name_the_rank():
    assert split_prefix("[rank3]:loss=0.5") == (3, "loss=0.5")
    assert split_prefix("[trainer1]:hello") == (1, "hello")
    assert split_prefix("W1130 torchrun says") == (LAUNCHER_RANK, "W1130 torchrun says")


def test_metric_rules_take_a_step_group_or_count_matches(tmp_path):
    rules, problems = compile_metric_rules([
        {"name": "loss", "regex": r"loss=([0-9.]+)"},
        {"name": "acc", "regex": r"step (?P<step>\d+) acc (?P<value>[0-9.]+)"},
        {"name": "bad", "regex": r"oops(("}, {"name": "nogroup", "regex": r"loss"},
        {"name": "val_loss", "regex": r"val loss=(\S+)"}])
    published: list[tuple] = []

    class Recorder:
        def put_line(self, *args) -> None:
            pass

        def put_point(self, rank, name, step, value, at) -> None:
            published.append((rank, name, step, value))

    capture = OutputCapture(logs_dir=tmp_path, max_bytes=10_000, rules=rules, publisher=Recorder())  # type: ignore[arg-type]
    for line in ("[rank0]:loss=0.5", "[rank1]:loss=0.7", "[rank0]:loss=0.25", "[rank0]:step 40 acc 0.9",
                 "[rank0]:loss=nan", "launcher loss=9", "[rank1]:step=120 loss=0.1",
                 "[rank0]:step=20 val loss=inf", "[rank0]:val loss=NaN", "[rank0]:val loss=-Infinity",
                 "[rank0]:val loss=n/a"):
        capture.feed(line, "out", time.time())
    capture.close()

    assert [p.split("'")[1] for p in problems] == ["bad", "nogroup"]
    # A printed non-finite value is a point like the SDK's (the rule non_finite stops on it);
    # what float() cannot read is no point.
    val = [(rank, step, repr(value)) for rank, name, step, value in published if name == "val_loss"]
    assert val == [(0, 20, "inf"), (0, 1, "nan"), (0, 2, "-inf")]
    assert [p for p in published if p[1] != "val_loss"] == [
        (0, "loss", 0, 0.5), (1, "loss", 0, 0.7), (0, "loss", 1, 0.25), (0, "acc", 40, 0.9), (1, "loss", 120, 0.1)]


@pytest.mark.parametrize("pattern", [r"train_loss=([0-9.]+)", r"(?i)LOSS=(\S+)", r"step (?P<step>\d+) loss (?P<value>\S+)",
                                     r"a|bc", r"x{2}yy(\d)", r"(?x) val \s loss = (\S+)", r"(?i:val) loss=(\S+)",
                                     r"^\[epoch (\d+)\]", r"loss\b=(\d)", r"é=(\d)"])
def test_the_required_literal_never_changes_what_matches(pattern):
    import re

    from jobs.patterns import compile_pattern

    compiled = compile_pattern(pattern)
    texts = ["train_loss=0.5", "Loss=3", "step 4 loss 0.1", "step 4 Loss 0.1", "bc", "a", "xxyy1", "yy1", "val loss=2",
             "VAL loss=2", "val Loss=2", "[epoch 3]", " [epoch 3]", "loss=1", "lossy=1", "é=1", "e=1", ""]
    for text in texts:
        expected = re.search(pattern, text)
        got = compiled.search(text)
        assert (got is None) == (expected is None), (pattern, text, compiled.required)
        if got is not None:
            assert got.groups() == expected.groups()


def test_a_regex_that_backtracks_without_end_is_dropped_and_never_freezes_the_agent(tmp_path):
    # (a|aa)+$ on 60 a's and a '!' backtracks for ages under Python's re, holding the GIL: the
    # node agent (heartbeats, every job's logs) would freeze. Here each try is cut off, the
    # regex is dropped after METRIC_TIMEOUTS_ALLOWED lines with a note, the others go on.
    from jobs.runner.process.capture import METRIC_TIMEOUTS_ALLOWED

    rules, problems = compile_metric_rules([{"name": "evil", "regex": r"(a|aa)+$()"},
                                            {"name": "loss", "regex": r"loss=([0-9.]+)"}])
    assert problems == []
    capture = OutputCapture(logs_dir=tmp_path, max_bytes=100_000, rules=rules, publisher=None)
    ticks = [0]
    done = threading.Event()

    def feed() -> None:
        for step in range(METRIC_TIMEOUTS_ALLOWED + 2):
            capture.feed(f"[rank0]:step={step} loss=0.{step + 1} " + "a" * 60 + "!", "out", time.time())
        done.set()

    def count() -> None:  # another thread of the agent: it must keep running meanwhile
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=count, daemon=True)]
    for thread in threads:
        thread.start()
    assert done.wait(30), "the capture is stuck in a regex"
    capture.close()
    assert ticks[0] > 0
    assert [rule.name for rule in capture.rules] == ["loss"]
    launcher = (tmp_path / "launcher.log").read_text()
    assert "metric 'evil'" in launcher and "ran out of time" in launcher, launcher
    # The loss definition read every line.
    assert capture.ranks[0].metric_counts["loss"] == METRIC_TIMEOUTS_ALLOWED + 2


def test_a_rank_log_is_cut_at_the_cap_with_a_note_and_keeps_its_last_lines(tmp_path):
    capture = OutputCapture(logs_dir=tmp_path, max_bytes=1000, rules=[], publisher=None)
    for index in range(500):
        capture.feed(f"[rank1]:line {index:04d} " + "x" * 40, "out", time.time())
    capture.feed("[rank1]:Traceback: the end", "err", time.time())
    capture.feed("torchrun: a launcher line", "err", time.time())
    capture.close()

    text = (tmp_path / "rank-1.log").read_text()
    head, _, tail = text.partition("[trainyard] log cut: further output of rank 1 dropped\n")
    assert len(head) <= 1000 and head.startswith("line 0000")
    assert "[trainyard] log resumed:" in tail and tail.rstrip().endswith("Traceback: the end")
    assert capture.stderr_tail(1) == ["Traceback: the end"]
    assert (tmp_path / "launcher.log").read_text() == "torchrun: a launcher line\n"
    assert list(capture.launcher_tail) == ["torchrun: a launcher line"]


SIGNAL_TRACEBACK = ["Traceback (most recent call last):", '  File "/torch/distributed/run.py", line 1036, in <module>',
                    "    main()", '  File "/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler',
                    "    raise SignalException(f\"Process {os.getpid()} got signal: {sigval}\", sigval=sigval)",
                    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15"]


def test_the_launchers_traceback_on_the_stops_sigterm_is_one_line_and_any_other_is_kept(tmp_path):
    """A stop is not a crash: once the agent says it is stopping, torchrun's traceback that
    ends in SignalException becomes one line; before that, or of another exception, or cut
    short by the pipe's end, every line is logged as it came. Ranks' lines pass untouched."""
    capture = OutputCapture(logs_dir=tmp_path, max_bytes=100_000, rules=[], publisher=None)
    for line in SIGNAL_TRACEBACK:  # not stopping: a SIGTERM from elsewhere is worth its traceback
        capture.feed(line, "err", time.time())
    capture.expect_stop()
    capture.feed("W1203 api.py:752] Received Signals.SIGTERM death signal, shutting down workers", "err", time.time())
    for line in SIGNAL_TRACEBACK[:3]:
        capture.feed(line, "err", time.time())
    capture.feed("[rank0]:a rank's line meanwhile", "out", time.time())
    for line in SIGNAL_TRACEBACK[3:]:
        capture.feed(line, "err", time.time())
    other = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: not a stop"]
    for line in other:
        capture.feed(line, "err", time.time())
    capture.feed(SIGNAL_TRACEBACK[0], "err", time.time())
    capture.feed(SIGNAL_TRACEBACK[1], "err", time.time())
    capture.close()  # the pipe ended mid-traceback: logged as it came

    launcher = (tmp_path / "launcher.log").read_text().splitlines()
    assert launcher == [*SIGNAL_TRACEBACK,
                        "W1203 api.py:752] Received Signals.SIGTERM death signal, shutting down workers",
                        "[trainyard] the launcher ended on the stop's signal (Process 4242 got signal: 15); "
                        "its traceback is left out",
                        *other, *SIGNAL_TRACEBACK[:2]]
    assert (tmp_path / "rank-0.log").read_text() == "a rank's line meanwhile\n"


def test_a_job_that_prints_without_pause_never_blocks_on_its_pipe(tmp_path):
    """The reader keeps reading past the cap; a writer of 20 MB finishes promptly."""
    capture = OutputCapture(logs_dir=tmp_path, max_bytes=10_000, rules=[], publisher=None)
    writer = subprocess.Popen([sys.executable, "-c", "import sys\nfor i in range(200000): sys.stdout.write('[rank0]:' + 'y'*90 + '\\n')"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    capture.start(writer.stdout, writer.stderr)  # type: ignore[arg-type]

    assert writer.wait(30) == 0
    assert capture.join(30)
    capture.close()
    assert capture.lines == 200_000
    assert (tmp_path / "rank-0.log").stat().st_size < 10_000 + 60_000


# --- verdicts ---------------------------------------------------------------------------------------
def _observed(tmp_path: Path, **overrides) -> Observed:
    tails = overrides.pop("tails", {})
    values = dict(returncode=1, guard_verdict="", killed_by_us=False, failure_file=tmp_path / "output" / "failure",
                  model_dir=tmp_path / "model", launcher_lines=[], stderr_tail=lambda rank: tails.get(rank, []),
                  ranks=sorted(tails), teardown_abort_ranks=set())
    values.update(overrides)
    return Observed(**values)


def test_the_scripts_own_failure_file_wins(tmp_path):
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "failure").write_text("  bad label column 'kind'\n")

    verdict = judge(_observed(tmp_path, tails={0: ["Traceback ..."]}))

    assert (verdict.succeeded, verdict.reason) == (False, "bad label column 'kind'")


def test_without_a_failure_file_the_first_failed_ranks_stderr_and_signal_explain(tmp_path):
    verdict = judge(_observed(tmp_path, launcher_lines=ROOT_CAUSE, tails={0: ["zero"], 3: ["", "out of cheese"]}))

    assert not verdict.succeeded and verdict.exit_code == -9
    assert verdict.reason == ("rank 3 failed (killed by SIGKILL (likely out of memory: the kernel's OOM killer sends "
                              "SIGKILL)); the last lines of its stderr:\nout of cheese")
    guarded = judge(_observed(tmp_path, guard_verdict="OutOfMemory: ...", killed_by_us=True))
    assert guarded.reason == "OutOfMemory: ..."


def test_a_teardown_abort_counts_as_success_only_after_rank_0_wrote_the_model(tmp_path):
    aborted = dict(launcher_lines=["failed (exitcode: -6) local_rank: 1 (pid: 9)"], teardown_abort_ranks={1},
                   tails={1: ["terminate called without an active exception"]})
    assert not judge(_observed(tmp_path, **aborted)).succeeded

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"w")
    verdict = judge(_observed(tmp_path, **aborted))
    assert verdict.succeeded and verdict.note.startswith("teardown abort after training finished: rank 1")


def test_a_teardown_abort_on_another_node_than_node_0_leaves_the_verdict_to_node_0(tmp_path):
    aborted = dict(launcher_lines=["failed (exitcode: -6) local_rank: 0 (pid: 9)"], teardown_abort_ranks={1},
                   tails={1: ["terminate called without an active exception"]}, leader=False)
    verdict = judge(_observed(tmp_path, **aborted))
    assert (verdict.succeeded, verdict.leader_decides) == (False, True)
    assert verdict.reason.startswith("rank 1 failed (killed by SIGABRT)")

    crashed = judge(_observed(tmp_path, launcher_lines=ROOT_CAUSE, tails={3: ["out of cheese"]}, leader=False))
    assert (crashed.succeeded, crashed.leader_decides) == (False, False), "only a teardown abort waits for node 0"


# --- staging ------------------------------------------------------------------------------------
def _version(tmp_path: Path, files: dict[str, bytes], *, split: dict | None = None, fmt: str | None = None) -> VersionFacts:
    return validated_version_facts(tmp_path, files, split=split, fmt=fmt)[0]


def test_file_mode_stages_through_a_verified_cache_reused_by_later_jobs(tmp_path):
    version = _version(tmp_path, {"train.csv": b"a,label\n1,x\n2,y\n", "test.csv": b"a,label\n3,x\n"})
    cache = DataCache(tmp_path / "cache")

    first = stage_channel("train", "file", version, tmp_path / "job1" / "train", cache)
    second = stage_channel("train", "file", version, tmp_path / "job2" / "train", cache)

    assert (first.files, first.cached, second.cached) == (1, 0, 1)
    assert sorted(p.name for p in (tmp_path / "job2" / "train").iterdir()) == ["train.csv"]
    cached = cache.raw_path(version, version.files[1] if version.files[1]["path"] == "train.csv" else version.files[0])
    os.chmod(cached, 0o644)
    cached.write_bytes(b"a,label\n1,x\n2,TAMPERED\n")
    third = stage_channel("train", "file", version, tmp_path / "job3" / "train", cache)
    assert third.cached == 0, "a cache file that changed is fetched again"
    assert (tmp_path / "job3" / "train" / "train.csv").read_bytes() == b"a,label\n1,x\n2,y\n"


def test_a_file_that_changed_in_the_store_fails_staging_with_a_reason(tmp_path):
    version = _version(tmp_path, {"data.csv": b"a,label\n1,x\n"})
    with default_store().open_write(version.files[0]["uri"]) as out:
        out.write(b"a,label\n9,z\n")

    with pytest.raises(StagingError, match="no longer matches the version"):
        stage_channel("train", "file", version, tmp_path / "job" / "train", DataCache(tmp_path / "cache"))


def test_channels_named_like_the_versions_get_that_channel_and_others_get_everything(tmp_path):
    version = _version(tmp_path, {"train/cat/1.png": _png(), "train/dog/2.png": _png(), "test/cat/3.png": _png()})

    assert [path for _, path in plan_channel("train", version).whole] == ["cat/1.png", "dog/2.png"]
    assert [path for _, path in plan_channel("val", version).whole] == [
        "test/cat/3.png", "train/cat/1.png", "train/dog/2.png"], "no validation channel: the whole version"
    assert plan_channel("images", version).channel is None


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text"])
def test_a_seeded_split_materialises_exactly_the_records_validation_counted(tmp_path, fmt):
    split = {"train": 0.6, "validation": 0.3, "test": 0.1, "seed": 7}
    if fmt == "csv":
        files = {"a.csv": b'text,label\n"multi\nline",1\n\nplain,0\n' + b"".join(b"r%d,%d\n" % (i, i % 2) for i in range(60)),
                 "b.csv": b"text,label\r\n" + b"".join(b"s%d,1\r\n" % i for i in range(40))}
    elif fmt == "jsonl":
        files = {"a.jsonl": b"".join(b'{"i": %d}\n' % i for i in range(50)) + b"\n   \n",
                 "b.jsonl": b"".join(b'{"i": %d}\n' % i for i in range(50, 90))}
    else:
        files = {"a.txt": b"".join(b"line %d\r\n" % i for i in range(70)) + b"\n\n", "b.txt": b"tail\nno newline"}
    version, report = validated_version_facts(tmp_path, files, split=split)
    counts = report.channel_counts
    cache = DataCache(tmp_path / "cache")

    for channel in ("train", "validation", "test"):
        target = tmp_path / "job" / channel
        stage_channel(channel, "file", version, target, cache)
        staged = {p.name: p.read_bytes() for p in target.iterdir()}
        if fmt == "csv":
            records = sum(len(list(__import__("csv").reader(io.StringIO(b.decode())))) - 1 for b in staged.values())
            records -= sum(b.decode().count("\n\n") for b in staged.values())
        else:
            records = sum(sum(1 for line in b.decode().split("\n") if line.strip()) for b in staged.values())
        assert records == counts.get(channel, 0), (channel, staged)


def test_stream_mode_writes_a_manifest_instead_of_copying(tmp_path):
    version = _version(tmp_path, {"train.jsonl": b'{"a": 1}\n', "extra.jsonl": b'{"a": 2}\n'})

    staged = stage_channel("data", "stream", version, tmp_path / "data", DataCache(tmp_path / "cache"))

    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert staged.files == 2 and sorted(os.listdir(tmp_path / "data")) == ["manifest.json"]
    assert sorted(f["path"] for f in manifest["files"]) == ["extra.jsonl", "train.jsonl"]
    assert all(f["uri"].startswith("file://") for f in manifest["files"])


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (255, 0, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


# --- code and checkpoints ---------------------------------------------------------------------------
def test_a_script_archive_is_unpacked_and_its_entry_point_found(tmp_path):
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, data in (("train.py", b"print(1)"), ("lib/util.py", b"X = 1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    uri = object_uri("scripts/acme/t/source.tar.gz")
    with default_store().open_write(uri) as out:
        out.write(archive.getvalue())

    assert fetch_script(uri, "", tmp_path / "code") == "train.py"
    assert (tmp_path / "code" / "lib" / "util.py").read_text() == "X = 1"
    with pytest.raises(StagingError, match="not a file"):
        fetch_script(uri, "../../etc/passwd", tmp_path / "code2")


def test_checkpoints_are_restored_synced_and_rotated(tmp_path):
    uri = object_uri(f"checkpoints/unit-{os.getpid()}-{time.monotonic_ns()}")
    with default_store().open_write(f"{uri}/checkpoint-1.pt") as out:
        out.write(b"one")
    local = tmp_path / "checkpoints"
    local.mkdir()
    sync = CheckpointSync(local, uri)

    assert sync.restore() == 1 and (local / "checkpoint-1.pt").read_bytes() == b"one"
    (local / "checkpoint-2.pt").write_bytes(b"two")
    (local / ".checkpoint-3.pt.tmp").write_bytes(b"half")
    (local / "checkpoint-1.pt").unlink()
    result = sync.sync()

    assert (result.uploaded, result.deleted) == (1, 1)
    assert sorted(o.relative_path for o in store_for(uri).list(uri + "/")) == ["checkpoint-2.pt"]
    assert sync.sync().uploaded == 0, "unchanged files are not uploaded again"


# --- the guard -------------------------------------------------------------------------------------
def test_the_guard_kills_a_job_that_starts_too_many_processes():
    code = ("import subprocess, sys, time\nkids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
            " for _ in range(12)]\ntime.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    watch = guard.ProcessGuard(process, memory_limit_bytes=10 * 2**30, max_processes=8, interval=0.1)
    watch.start()
    try:
        process.wait(30)
    finally:
        guard.kill_group(process, process.pid)
        watch.stop()
    assert watch.verdict.startswith("the job started ") and "more than the limit of 8" in watch.verdict
    assert not guard.group_alive(process, process.pid)
    with pytest.raises(ValueError):
        guard.signal_group(os.getpgrp(), signal.SIGTERM)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the job's mark is read from /proc/<pid>/environ")
def test_ending_a_job_ends_a_descendant_that_left_its_tree_and_ignores_sigterm(tmp_path):
    """The launcher's child starts a grandchild in a session of its own that ignores
    SIGTERM, then dies: the grandchild is reparented away from the launcher, outside its
    group, never seen by the guard. Its environment still carries the job's mark."""
    pid_file = tmp_path / "orphan.pid"
    # The orphan says its pid only once SIGTERM is ignored (before that, SIGTERM would end it).
    orphan = ("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              f"open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
              f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\nwhile True: time.sleep(1)")
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {orphan!r}], start_new_session=True)"
    mark = guard.new_job_mark()
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                               env={**os.environ, guard.JOB_MARK_VARIABLE: mark})
    process.wait(30)
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the orphan did not start"
        time.sleep(0.05)
    orphan_pid = int(pid_file.read_text())
    try:
        assert guard.marked_pids(mark) == {orphan_pid}
        assert guard.marked_pids(guard.new_job_mark()) == set()

        assert guard.end_group(process, process.pid, grace=0.5, mark=mark) is True, "SIGTERM alone cannot end it"

        assert not guard.any_alive({orphan_pid})
        assert guard.marked_pids(mark) == set()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan_pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="hole punching and /proc are Linux features")
def test_spool_text_already_read_by_the_launcher_is_freed(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "stdout.log"
    with open(path, "wb") as out:
        for _ in range(80):
            out.write(b"z" * (1024 * 1024))
    reader = subprocess.Popen([sys.executable, "-c", f"import time\nf = open({str(path)!r}, 'rb')\nf.seek(70 * 2**20)\n"
                               "print('ready', flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert reader.stdout.readline() == b"ready\n"  # type: ignore[union-attr]
        freed = guard.trim_spool(reader.pid, spool, {})
    finally:
        reader.kill()
        reader.wait()
    assert freed >= 60 * 2**20
    assert path.stat().st_size == 80 * 2**20 and path.stat().st_blocks * 512 < 25 * 2**20
    with open(path, "rb") as check:
        check.seek(75 * 2**20)
        assert check.read(4) == b"zzzz", "what the reader has not read yet is intact"


def test_the_system_sampler_publishes_cpu_and_memory(isolated_storage):
    sampler = guard.SystemSampler(redis_client(), 424242, "node-x", interval=60)
    sampler.publish()
    entries = redis_client().xrevrange("trainyard:job:424242:system", count=1)
    fields = {k.decode(): v.decode() for k, v in entries[0][1].items()}
    assert fields["n"] == "node-x" and float(fields["cpu"]) >= 0 and int(fields["mem"]) > 0
    assert fields["gpu"] == "" or float(fields["gpu"]) >= 0
