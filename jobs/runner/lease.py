"""The job's lease and the node's heartbeat, renewed from a thread while an agent runs a
job: a job whose lease runs out is ended by the scheduler's sweep (jobs.scheduling), so a
dead agent never leaves a job "Training" forever (no run stays running after its
process died)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from jobs.models import FINISHED_STATUSES, TrainingJob
from jobs.nodes import heartbeat
from jobs.runner.config import RunnerConfig

log = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    """Renews the job's lease and the node's heartbeat until stopped."""

    def __init__(self, job_id: int, attempt: int, node_name: str, config: RunnerConfig) -> None:
        super().__init__(name=f"lease-{job_id}", daemon=True)
        self.job_id, self.attempt, self.node_name, self.config = job_id, attempt, node_name, config
        self._stopping = threading.Event()

    def renew(self) -> None:
        expires = timezone.now() + timedelta(seconds=self.config.lease_seconds)
        (TrainingJob.objects.filter(pk=self.job_id, attempt=self.attempt).exclude(status__in=FINISHED_STATUSES)
         .update(lease_expires_at=expires))
        heartbeat(self.node_name)

    def run(self) -> None:
        try:
            while not self._stopping.wait(self.config.renew_seconds):
                try:
                    self.renew()
                except Exception:  # noqa: BLE001 - a missed renewal is retried; the lease outlasts a few
                    log.warning("lease renewal for job %s failed", self.job_id, exc_info=True)
                    connection.close()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(5)
