"""Hyperparameters reach a script exactly as given (docs/SPEC.md §3.5: nothing between the
launcher and the script parses them) — whatever they look like to torch.distributed.run's parser:
names that are prefixes of its options (`--start` of --start-method, `--log` of --log_dir),
its own option names, values that begin with `-`, hold spaces, `=` or `$`.

Through the real launch (torch's own parser and argument rewrite) and through real jobs:
a cold one (torch.distributed.run) and the next one of its warm pool (the fork server)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from torch.distributed.elastic.utils import macros
from torch.distributed.run import config_from_args, parse_args

from datasets.storage import store_for
from jobs.models import JobAttempt, JobStatus, Node, NodeState
from jobs.runner.agent import script_arguments
from jobs.runner.process.launch import LaunchSpec, build_command
from tests.conftest import wait_for
from tests.jobs.conftest import run_to_end

# Every name the issue lists (each an abbreviation or a name of a torchrun option), and
# values torchrun's parser or its ${local_rank} substitution would take for its own.
LOOKALIKES: dict[str, object] = {
    "start": "1", "max": "2", "log": "info", "node": "n0", "nproc": 3, "role": "-r", "tee": "--tee", "standalone": True,
    "run": "--run_path", "no": "--no-python", "master": "--master_addr=10.0.0.1", "local": "-1", "rdzv": "a b",
    "monitor": "k=v", "module": "-m", "nproc_per_node": "--nproc_per_node=8", "m": "--", "dollar": "${local_rank} $x $$",
    "space": "  two  spaces  ", "empty": "", "lr": 0.001, "off": False,
}
# script_arguments' forms, written out: sorted names, strings as given, str() of the rest.
EXPECTED_ARGV = [
    "--dollar", "${local_rank} $x $$", "--empty", "", "--local", "-1", "--log", "info", "--lr", "0.001",
    "--m", "--", "--master", "--master_addr=10.0.0.1", "--max", "2", "--module", "-m", "--monitor", "k=v",
    "--no", "--no-python", "--node", "n0", "--nproc", "3", "--nproc_per_node", "--nproc_per_node=8", "--off", "False",
    "--rdzv", "a b", "--role", "-r", "--run", "--run_path", "--space", "  two  spaces  ", "--standalone", "True",
    "--start", "1", "--tee", "--tee",
]


def worker_argv(command: list[str], local_rank: str = "0") -> list[str]:
    """What torch.distributed.run would start each worker with for `command`: its parser,
    its config, its per-rank argument substitution — torch's own code, not a copy."""
    assert command[1:3] == ["-m", "torch.distributed.run"]
    launcher_args = parse_args(command[3:])
    _, _, args = config_from_args(launcher_args)
    return macros.substitute(list(args), local_rank)


def test_script_arguments_are_sorted_name_value_pairs_in_sagemakers_forms():
    assert script_arguments(LOOKALIKES) == EXPECTED_ARGV
    assert script_arguments({"b": {"z": 1, "a": "x y"}, "a": True}) == ["--a", "True", "--b", "a=x y,z=1"]
    assert script_arguments({}) == []


@pytest.mark.parametrize("target", [{"script": "train.py"}, {"module": "algorithms.tabular"}])
def test_torchrun_passes_every_argument_untouched(tmp_path, target):
    spec = LaunchSpec(job_id=1, attempt=1, python="/venv/bin/python", spool_dir=tmp_path, args=EXPECTED_ARGV,
                      nproc_per_node=2, **target)

    command = build_command(spec)

    head = ["-u", "-m", target["module"]] if "module" in target else ["-u", target["script"]]
    for rank in ("0", "1"):
        assert worker_argv(command, rank) == [*head, *EXPECTED_ARGV]
    launcher = parse_args(command[3:])
    assert (launcher.nproc_per_node, launcher.standalone, launcher.role, launcher.max_restarts) == ("2", True,
                                                                                                     "trainer", 0)
    assert launcher.module is ("module" in target) and not launcher.no_python and not launcher.run_path


def test_a_script_named_like_an_option_is_still_the_script(tmp_path):
    spec = LaunchSpec(job_id=1, attempt=1, python="/venv/bin/python", spool_dir=tmp_path, script="--start$1.py",
                      args=["--max", "$$"], nnodes=2, node_rank=1, rendezvous_endpoint="10.0.0.5:29400")

    assert worker_argv(build_command(spec)) == ["-u", "--start$1.py", "--max", "$$"]


def _seen(job) -> dict:
    with store_for(job.model_uri).open_read(job.model_uri) as source, \
            tarfile.open(fileobj=io.BytesIO(source.read()), mode="r:gz") as archive:
        member = next(m for m in archive.getmembers() if Path(m.name).name == "argv.json")
        extracted = archive.extractfile(member)
        assert extracted is not None
        return json.loads(extracted.read())


@pytest.mark.slow
def test_lookalike_hyperparameters_reach_a_cold_and_a_warm_script_exactly(node, make_job):
    cold = run_to_end(make_job(script="argv_dump.py", hyperparameters=LOOKALIKES, keep_alive_seconds=120), timeout=120)
    assert cold.status == JobStatus.COMPLETED, cold.failure_reason
    wait_for(lambda: Node.objects.filter(pk=node.pk, state=NodeState.WARM).exists(), timeout=30,
             message="the node to turn warm")
    warm = run_to_end(make_job(script="argv_dump.py", hyperparameters=LOOKALIKES, keep_alive_seconds=120), timeout=120)
    assert warm.status == JobStatus.COMPLETED, warm.failure_reason

    assert not JobAttempt.objects.get(job=cold).warm_start and JobAttempt.objects.get(job=warm).warm_start
    for job, preloaded in ((cold, False), (warm, True)):
        seen = _seen(job)
        assert seen["torch_preloaded"] is preloaded  # cold: torch.distributed.run; warm: the fork server
        assert seen["argv"] == EXPECTED_ARGV
        assert seen["sm_hps"] == LOOKALIKES
        assert seen["sm_hp"]["SM_HP_DOLLAR"] == "${local_rank} $x $$"
        assert seen["sm_hp"]["SM_HP_STANDALONE"] == "true" and seen["sm_hp"]["SM_HP_NPROC"] == "3"
        assert seen["sm_hp"]["SM_HP_SPACE"] == "  two  spaces  " and seen["sm_hp"]["SM_HP_EMPTY"] == ""
