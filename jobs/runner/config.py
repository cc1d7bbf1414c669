"""The agent's settings. Each comes from Django settings when the project defines it there,
else from the environment (so a node worker started with a variable set gets it even
before settings.py lists it), else a default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from studio.envconf import SettingError, env_bool, env_int, env_str


def _int(name: str, default: int) -> int:
    value = getattr(settings, name, None)
    return int(value) if value is not None else env_int(name, default)


def _float(name: str, default: float) -> float:
    value = getattr(settings, name, None)
    if value is not None:
        return float(value)
    raw = env_str(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise SettingError(f"{name} must be a number, got {raw!r}") from exc


def _str(name: str, default: str = "") -> str:
    value = getattr(settings, name, None)
    return str(value) if value is not None else env_str(name, default)


def _bool(name: str, default: bool) -> bool:
    value = getattr(settings, name, None)
    return bool(value) if value is not None else env_bool(name, default)


@dataclass(frozen=True)
class RunnerConfig:
    data_dir: Path
    stop_grace_seconds: float  # SIGTERM → SIGKILL
    log_max_bytes: int  # per rank, in the job's log files
    memory_fraction: float  # of the node's memory, when the job sets no memory_limit_mb
    max_processes: int  # a job with more processes than this is a fork bomb
    lease_seconds: int  # how long a job's lease lasts without renewal
    renew_seconds: float  # lease renewal and node heartbeat interval
    poll_seconds: float  # how often the agent reads the job row (stop requests)
    sync_seconds: float  # checkpoint sync and log upload interval
    system_metrics_seconds: float
    keep_job_dirs: bool  # keep <data_dir>/jobs/<id>/ after the job (debugging)
    node_address: str  # how other nodes reach this one (multi-node rendezvous)
    rendezvous_timeout_seconds: int
    warm_ready_seconds: float = 30.0  # how long a warm launch waits for the pool's fork server to finish importing
    # How long a node other than node 0 whose ranks aborted at teardown waits for node 0's
    # result (rank 0 may still be writing the model) before its own failure counts.
    leader_verdict_seconds: float = 300.0
    # Where a script's requirements.txt is installed from (jobs.runner.process.envs.Sources):
    # empty, wherever the node's pip looks; an index URL ("none": no index) / find-links folders.
    pip_index_url: str = ""
    pip_find_links: str = ""

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache" / "datasets"

    @property
    def envs_dir(self) -> Path:
        # Job environments (a script's requirements.txt), shared by the node's later jobs.
        return self.data_dir / "envs"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @classmethod
    def load(cls) -> RunnerConfig:
        heartbeat = float(getattr(settings, "STUDIO_NODE_HEARTBEAT_SECONDS", 5))
        lost_after = int(getattr(settings, "STUDIO_NODE_LOST_SECONDS", 30))
        return cls(
            data_dir=Path(settings.DATA_DIR),
            stop_grace_seconds=_float("STUDIO_STOP_GRACE_SECONDS", 30.0),
            log_max_bytes=_int("STUDIO_LOG_MAX_BYTES", 20 * 1024 * 1024),
            memory_fraction=_float("STUDIO_JOB_MEMORY_FRACTION", 0.8),
            max_processes=_int("STUDIO_JOB_MAX_PROCESSES", 512),
            # Long enough to survive a few missed renewals (a slow database), short enough
            # that a dead agent's job is noticed about as fast as a dead node.
            lease_seconds=_int("STUDIO_JOB_LEASE_SECONDS", max(lost_after, int(3 * heartbeat))),
            renew_seconds=min(heartbeat, 5.0),
            poll_seconds=_float("STUDIO_JOB_POLL_SECONDS", 1.0),
            sync_seconds=_float("STUDIO_JOB_SYNC_SECONDS", 5.0),
            system_metrics_seconds=_float("STUDIO_SYSTEM_METRICS_SECONDS", 5.0),
            keep_job_dirs=_bool("STUDIO_KEEP_JOB_DIRS", False),
            node_address=str(getattr(settings, "STUDIO_NODE_ADDRESS", "") or env_str("STUDIO_NODE_ADDRESS", "")),
            rendezvous_timeout_seconds=_int("STUDIO_RENDEZVOUS_TIMEOUT_SECONDS", 300),
            warm_ready_seconds=_float("STUDIO_WARM_READY_SECONDS", 30.0),
            leader_verdict_seconds=_float("STUDIO_LEADER_VERDICT_SECONDS", 300.0),
            pip_index_url=_str("STUDIO_PIP_INDEX_URL"),
            pip_find_links=_str("STUDIO_PIP_FIND_LINKS"),
        )
