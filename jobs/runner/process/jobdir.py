"""The job directory (docs/SPEC.md §3.4) and the environment of the processes that run in it.

    <data_dir>/jobs/<job_id>/attempt-<n>/node-<rank>/
        input/config/hyperparameters.json   values as strings, like SageMaker
        input/config/resourceconfig.json    {"current_host", "hosts", "network_interface_name"}
        input/data/<channel>/               staged files, or manifest.json in stream mode
        code/                               the script's source (cwd of the processes)
        packages/                           links to the repository's trainyard/ and algorithms/
        model/  output/  output/data/  checkpoints/  logs/  tmp/

One directory per node rank: simulated nodes on one machine share the data directory,
and two of them in one job must not write into each other's model/ or logs/.
Pure functions only (no database), so they are unit-tested without a worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard import protocol
from trainyard.env import distribution_variable

REPO_ROOT = Path(__file__).resolve().parents[3]
# What a job's processes import besides their own code and the Python environment's packages:
# the SDK and the built-in algorithms, and nothing else of the repository (never its apps).
JOB_PACKAGES = ("trainyard", "algorithms")
# Variables of the worker's own environment that a job may see. Everything else (the
# database URL, the secret key, Django's settings module) stays with the worker: job
# processes never touch the database: only the worker that runs them does.
PASSED_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TERM", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
                  "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "OMP_NUM_THREADS",
                  "MKL_NUM_THREADS")
PASSED_THROUGH_PREFIXES = ("LC_", "AWS_", "NCCL_", "GLOO_")


@dataclass(frozen=True)
class JobDir:
    root: Path

    @classmethod
    def for_launch(cls, jobs_dir: Path, job_id: int, attempt: int, node_rank: int) -> JobDir:
        return cls(jobs_dir / str(job_id) / f"attempt-{attempt}" / f"node-{node_rank}")

    @property
    def input_dir(self) -> Path:
        return self.root / "input"

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def data_dir(self) -> Path:
        return self.root / "input" / "data"

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def packages_dir(self) -> Path:
        return self.root / "packages"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.root / "output" / "data"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    # torchrun's --tee spool: each rank's output passes through files here.
    @property
    def spool_dir(self) -> Path:
        return self.root / "tmp" / "launcher"

    # What the processes report about themselves (trainyard.report): <name>.json files that
    # node 0's agent copies into the job's `details`.
    @property
    def report_dir(self) -> Path:
        return self.output_dir / "report"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    def create(self) -> None:
        for folder in (self.config_dir, self.data_dir, self.code_dir, self.model_dir, self.output_data_dir,
                       self.checkpoint_dir, self.logs_dir, self.spool_dir, self.report_dir):
            folder.mkdir(parents=True, exist_ok=True)
        link_job_packages(self.packages_dir)


def link_job_packages(folder: Path) -> Path:
    """Make `folder` hold one link per JOB_PACKAGES package to the repository's folder of it,
    and return it. Links, not copies: in a checkout, an edit reaches the next job."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in JOB_PACKAGES:
        link, target = folder / name, REPO_ROOT / name
        if link.is_symlink() and os.readlink(link) == str(target):
            continue
        temporary = folder / f".{name}.link-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        temporary.symlink_to(target, target_is_directory=True)
        os.replace(temporary, link)
    return folder


@dataclass(frozen=True)
class LaunchFacts:
    """What the environment is made from; everything a process may learn about its job."""

    job_id: int
    job_name: str
    attempt: int
    node_rank: int
    hosts: list[str]  # node names in node-rank order
    hyperparameters: dict[str, Any]
    channels: dict[str, str]  # channel → input mode ("file" | "stream")
    entry_point: str  # the script's path in code/, or the built-in algorithm's module
    num_gpus: int
    num_cpus: int
    redis_url: str
    checkpoint_every_steps: int = 0
    network_interface: str = "lo"
    environment: Mapping[str, str] = field(default_factory=dict)  # the job's own `environment`
    distribution: str = "none"  # none | ddp | fsdp | pipeline
    pipeline: Mapping[str, Any] = field(default_factory=dict)  # {"stages", "microbatches", "schedule", "partition"}

    @property
    def current_host(self) -> str:
        return self.hosts[self.node_rank]


def hyperparameter_strings(hyperparameters: Mapping[str, Any]) -> dict[str, str]:
    """SageMaker passes every hyperparameter as a string: numbers and booleans as JSON
    ("10", "0.1", "true"), strings as they are."""
    return {str(name): value if isinstance(value, str) else json.dumps(value) for name, value in hyperparameters.items()}


def env_name(name: str) -> str:
    """SM_HP_<NAME> / SM_CHANNEL_<NAME>: upper case, anything but letters and digits as '_'."""
    return re.sub(r"[^A-Z0-9_]", "_", name.upper())


def resource_config(facts: LaunchFacts) -> dict[str, Any]:
    return {"current_host": facts.current_host, "hosts": list(facts.hosts),
            "network_interface_name": facts.network_interface}


def write_config(job_dir: JobDir, facts: LaunchFacts) -> None:
    job_dir.config_dir.mkdir(parents=True, exist_ok=True)
    (job_dir.config_dir / "hyperparameters.json").write_text(json.dumps(hyperparameter_strings(facts.hyperparameters),
                                                                        indent=1))
    (job_dir.config_dir / "resourceconfig.json").write_text(json.dumps(resource_config(facts), indent=1))
    (job_dir.config_dir / "inputdataconfig.json").write_text(json.dumps(input_data_config(facts), indent=1))


def input_data_config(facts: LaunchFacts) -> dict[str, dict[str, str]]:
    return {channel: {"TrainingInputMode": "File" if mode == "file" else "FastFile",
                      "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
            for channel, mode in sorted(facts.channels.items())}


def build_environment(job_dir: JobDir, facts: LaunchFacts, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """1. A whitelist of the worker's environment (PATH, locale, AWS_*, NCCL_* ...).
    2. SageMaker's training-toolkit variables (docs/SPEC.md §3.4). 3. Trainyard's (trainyard/protocol).
    4. The job's own `environment`, which may override anything but the job's identity.
    torchrun adds RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR ... per process."""
    base = os.environ if base is None else base
    env = {name: value for name, value in base.items()
           if name in PASSED_THROUGH or name.startswith(PASSED_THROUGH_PREFIXES)}
    channel_dirs = {channel: str(job_dir.channel_dir(channel)) for channel in sorted(facts.channels)}
    hp_strings = hyperparameter_strings(facts.hyperparameters)
    training_env = {
        "job_name": facts.job_name,
        "job_id": facts.job_id,
        "attempt": facts.attempt,
        "hosts": list(facts.hosts),
        "current_host": facts.current_host,
        "master_hostname": facts.hosts[0],
        "is_master": facts.node_rank == 0,
        "channel_input_dirs": channel_dirs,
        "hyperparameters": dict(facts.hyperparameters),
        "input_dir": str(job_dir.input_dir),
        "input_config_dir": str(job_dir.config_dir),
        "input_data_config": input_data_config(facts),
        "model_dir": str(job_dir.model_dir),
        "output_dir": str(job_dir.output_dir),
        "output_data_dir": str(job_dir.output_data_dir),
        "checkpoint_dir": str(job_dir.checkpoint_dir),
        "module_dir": str(job_dir.code_dir),
        "user_entry_point": facts.entry_point,
        "num_gpus": facts.num_gpus,
        "num_cpus": facts.num_cpus,
        "resource_config": resource_config(facts),
        "network_interface_name": facts.network_interface,
    }
    env.update({
        "SM_BASE_DIR": str(job_dir.root),
        "SM_MODEL_DIR": str(job_dir.model_dir),
        "SM_INPUT_DIR": str(job_dir.input_dir),
        "SM_INPUT_CONFIG_DIR": str(job_dir.config_dir),
        "SM_OUTPUT_DIR": str(job_dir.output_dir),
        "SM_OUTPUT_DATA_DIR": str(job_dir.output_data_dir),
        "SM_CHECKPOINT_DIR": str(job_dir.checkpoint_dir),
        "SM_MODULE_DIR": str(job_dir.code_dir),
        "SM_CHANNELS": json.dumps(sorted(facts.channels)),
        "SM_HPS": json.dumps(dict(facts.hyperparameters)),
        "SM_HOSTS": json.dumps(list(facts.hosts)),
        "SM_CURRENT_HOST": facts.current_host,
        "SM_NUM_GPUS": str(facts.num_gpus),
        "SM_NUM_CPUS": str(facts.num_cpus),
        "SM_USER_ENTRY_POINT": facts.entry_point,
        "SM_NETWORK_INTERFACE_NAME": facts.network_interface,
        "SM_RESOURCE_CONFIG": json.dumps(resource_config(facts)),
        "SM_INPUT_DATA_CONFIG": json.dumps(input_data_config(facts)),
        "SM_TRAINING_ENV": json.dumps(training_env),
        "SM_LOG_LEVEL": "20",
    })
    for channel, path in channel_dirs.items():
        env[f"SM_CHANNEL_{env_name(channel)}"] = path
    for name, value in hp_strings.items():
        env[f"SM_HP_{env_name(name)}"] = value
    env.update({str(name): str(value) for name, value in facts.environment.items()})
    env.update({
        protocol.ENV_JOB_ID: str(facts.job_id),
        protocol.ENV_ATTEMPT: str(facts.attempt),
        protocol.ENV_REDIS_URL: facts.redis_url,
        protocol.ENV_CHECKPOINT_EVERY_STEPS: str(facts.checkpoint_every_steps),
        protocol.ENV_NODE_NAME: facts.current_host,
        protocol.ENV_DISTRIBUTION: distribution_variable(facts.distribution, facts.pipeline),
        protocol.ENV_PIPELINE: json.dumps(dict(facts.pipeline)),
        protocol.ENV_REPORT_DIR: str(job_dir.report_dir),
        "PYTHONUNBUFFERED": "1",
        # Temporary files die with the job directory instead of filling /tmp.
        "TMPDIR": str(job_dir.tmp_dir),
        # The script's own folder comes first (Python puts it on sys.path itself); the links
        # in packages/ make `-m algorithms.<x>` and `import trainyard` work, while the
        # repository root, and with it the studio's apps, stays off the job's sys.path.
        "PYTHONPATH": os.pathsep.join(p for p in (str(job_dir.code_dir), str(job_dir.packages_dir),
                                                  facts.environment.get("PYTHONPATH", "")) if p),
        "PYTHONNOUSERSITE": "1",
    })
    return env


def python_executable() -> str:
    return sys.executable
