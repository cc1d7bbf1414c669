"""The node agent: one launch of one job on this node (`run_node`), from claim to release.

Ownership lives in the database, not in the broker: the scheduler moved the job to
Starting with this attempt number and created this node's JobAttempt row; the agent
claims that row by compare-and-set, so a redelivered task (acks_late) finds it taken and
leaves. While the job runs, a thread renews the job's lease and the node's heartbeat.

Node 0 owns the job's status (Training, Uploading, Completed, Stopped); any node may fail
it. Every node watches the job row: Stopping (the API's stop), a finished status set
elsewhere (another node failed) or its own max_runtime_seconds end its processes.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psutil
from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from datasets.storage import StorageError, join_uri, object_uri
from jobs import cost
from jobs.models import (
    EARLY_STOPPED,
    FINISHED_STATUSES,
    RULE_TRIGGERED,
    JobAttempt,
    JobInput,
    JobStatus,
    Node,
    NodeState,
    TrainingJob,
)
from jobs.runner import artifacts
from jobs.runner.config import RunnerConfig
from jobs.runner.lease import LeaseKeeper
from jobs.runner.process import envs, guard, outcome
from jobs.runner.process.capture import LAUNCHER_RANK, LivePublisher, OutputCapture, compile_metric_rules
from jobs.runner.process.jobdir import JobDir, LaunchFacts, build_environment, python_executable, write_config
from jobs.runner.process.launch import (
    RENDEZVOUS_KEY,
    LaunchSpec,
    build_command,
    default_node_address,
    describe_exit,
    free_port,
    launch_environment,
)
from jobs.runner.staging import DataCache, StagingError, VersionFacts, stage_channel
from jobs.transitions import note, transition

log = logging.getLogger(__name__)

# Set by the worker's shutdown signal (jobs.tasks): the running job is ended, not abandoned.
SHUTDOWN = threading.Event()
MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
# Set by a node other than node 0 whose launcher ended in a teardown abort: node 0 stops
# waiting in torchrun's exit barrier for it.
# {run}: the job's id and creation time, so a database whose ids start again (a reset studio
# beside the same Redis, a fresh test database) never reads an earlier job's keys.
LAUNCHER_ENDED_KEY = "trainyard:job:{run}:attempt:{attempt}:launcher-ended:{node_rank}"
# A node whose ranks all succeeded and whose torchrun waits in its exit barrier (3+ nodes: for
# a node whose ranks aborted at teardown): node 0 ends the barrier for all (see above).
IN_BARRIER_KEY = "trainyard:job:{run}:attempt:{attempt}:in-exit-barrier:{node_rank}"
GONE = "<deleted>"  # the job's row no longer exists: end its processes


@dataclass(frozen=True)
class Claim:
    job: TrainingJob
    attempt: int
    node_rank: int
    node: Node
    hosts: list[str]


def run_node(job_id: int, attempt: int, node_rank: int) -> str:
    """Run this node's part of the job's attempt; returns the outcome ("skipped" when
    someone else owns it). Never raises: a failure is recorded on the job instead."""
    claim = claim_launch(job_id, attempt, node_rank)
    if claim is None:
        log.info("job %s attempt %s node %s: not ours to run (already claimed, moved on, or gone)",
                 job_id, attempt, node_rank)
        return "skipped"
    return NodeRun(claim, RunnerConfig.load()).execute()


def claim_launch(job_id: int, attempt: int, node_rank: int) -> Claim | None:
    # One UPDATE that checks the job's status and attempt too: a redelivered task, a
    # later attempt or a stopped job all match no row (and SQLite never has to upgrade a
    # read transaction to a write, which fails under contention).
    # Starting, or Training already: node 0 may have launched before a slower node claims.
    # Stopping too: a stop asked for between placement and this claim (a tuning job's pruner
    # 17 ms after a trial started) is carried out here at once — refused, nobody ended the
    # job, which waited in Stopping, billed, until its lease ran out (120 s).
    claimed = (JobAttempt.objects.filter(job_id=job_id, attempt=attempt, node_rank=node_rank, outcome="",
                                         job__status__in=[JobStatus.STARTING, JobStatus.TRAINING, JobStatus.STOPPING],
                                         job__attempt=attempt)
               .update(outcome="running", started_at=timezone.now()))
    if not claimed:
        return None
    job = TrainingJob.objects.get(pk=job_id)
    attempts = list(JobAttempt.objects.filter(job_id=job_id, attempt=attempt).select_related("node").order_by("node_rank"))
    mine = next(a for a in attempts if a.node_rank == node_rank)
    if mine.node is None:
        return None
    hosts = [a.node.name if a.node else f"node-rank-{a.node_rank}" for a in attempts]
    return Claim(job=job, attempt=attempt, node_rank=node_rank, node=mine.node, hosts=hosts)


class PeriodicSync(threading.Thread):
    """Checkpoints and logs to the object store every few seconds."""

    def __init__(self, run: NodeRun, interval: float) -> None:
        super().__init__(name=f"sync-{run.job_id}", daemon=True)
        self.run_ = run
        self.interval = interval
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.run_.sync_outputs()
            except Exception:  # noqa: BLE001 - the final sync at exit tries again
                log.warning("periodic sync of job %s failed", self.run_.job_id, exc_info=True)

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(30)


class NodeRun:
    def __init__(self, claim: Claim, config: RunnerConfig) -> None:
        self.claim = claim
        self.config = config
        self.job = claim.job
        self.job_id = claim.job.pk
        self.attempt = claim.attempt
        self.node_rank = claim.node_rank
        self.is_leader = claim.node_rank == 0
        self.job_dir = JobDir.for_launch(config.jobs_dir, self.job_id, self.attempt, self.node_rank)
        self.output_uri = (self.job.output_uri or object_uri(f"jobs/{self.job_id}")).rstrip("/")
        checkpoint_uri = (self.job.checkpoint or {}).get("uri") or ""
        self.checkpoints = artifacts.CheckpointSync(self.job_dir.checkpoint_dir, checkpoint_uri) if checkpoint_uri else None
        self.uploader = artifacts.FileUploader()
        self.lease = LeaseKeeper(self.job_id, self.attempt, claim.node.name, config)
        self.process: subprocess.Popen | None = None
        self.capture: OutputCapture | None = None
        self.publisher: LivePublisher | None = None
        self.guard: guard.ProcessGuard | None = None
        self.mark = ""  # guard.JOB_MARK_VARIABLE's value for this launch
        self.sampler: guard.SystemSampler | None = None
        self.syncer: PeriodicSync | None = None
        self.exit_code: int | None = None
        self._workers_seen = False  # the launcher has had worker processes
        self._barrier_ending_since: float | None = None  # node 0 told the others to end the exit barrier
        self._cold_launch = False  # torchrun, not a warm pool's fork server
        self._reported: dict = {}
        self.environment: envs.JobEnvironment | None = None  # a script's requirements.txt, installed
        self.python = python_executable()  # what the job runs with: the node's, or its environment's

    # --- the whole run ------------------------------------------------------------------------
    def execute(self) -> str:
        result = "error"
        self.lease.start()
        try:
            result = self._execute()
        except Exception as exc:  # noqa: BLE001 - recorded on the job, never raised into the worker
            log.exception("job %s attempt %s: the node agent failed", self.job_id, self.attempt)
            self._end_processes(grace=0)
            try:
                self._close_capture()
                self.sync_outputs()
            except Exception:  # noqa: BLE001 - the failure below matters more than the logs
                log.exception("job %s: could not save its logs after the agent failed", self.job_id)
            try:
                self._fail(f"infrastructure error on node {self.claim.node.name}: {type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - database away: the lease sweep ends the job later
                log.exception("job %s: could not record its failure", self.job_id)
        finally:
            self._finish(result)
        return result

    def _execute(self) -> str:
        started = time.monotonic()
        if self._status() == JobStatus.STOPPING:  # asked to stop before this node claimed: stage nothing
            return self._stopped_before_launch()
        try:
            spec, env = self.prepare()
        except StagingError as exc:
            self._fail(str(exc))
            return "failed"
        self._note(f"node {self.claim.node.name}: staged inputs and code in {time.monotonic() - started:.1f} s")
        # Node 0 moves the job to Training when it launches; the others may start later.
        if self._status() not in ((JobStatus.STARTING,) if self.is_leader else (JobStatus.STARTING, JobStatus.TRAINING)):
            return self._stopped_before_launch()
        self.launch(spec, env)
        ended_by = self.supervise()
        return self.conclude(ended_by)

    # --- 1. prepare ---------------------------------------------------------------------------
    def prepare(self) -> tuple[LaunchSpec, dict[str, str]]:
        """1. Create the job directory. 2. Stage every channel. 3. Fetch the script (or
        name the built-in module). 4. Restore checkpoints. 5. Write the config files and
        build the environment and command line."""
        self.job_dir.create()
        channels: dict[str, str] = {}
        cache = DataCache(self.config.cache_dir)
        for job_input in JobInput.objects.filter(job_id=self.job_id).select_related("dataset_version__dataset"):
            version = VersionFacts.of(job_input.dataset_version)
            try:
                staged = stage_channel(job_input.channel, job_input.mode, version,
                                       self.job_dir.channel_dir(job_input.channel), cache)
            except (StagingError, StorageError, OSError) as exc:
                raise StagingError(f"could not stage channel {job_input.channel!r} ({version.label}): {exc}") from exc
            channels[job_input.channel] = job_input.mode
            log.info("job %s: channel %s: %d files, %d bytes (%d from cache)", self.job_id, staged.channel, staged.files,
                     staged.bytes, staged.cached)
        args: list[str] = []
        if self.job.algorithm:
            from algorithms import entry_module

            try:
                module, script = entry_module(self.job.algorithm), ""
            except KeyError as exc:
                raise StagingError(str(exc.args[0])) from exc
            entry_point = module
        elif self.job.script_uri:
            script = artifacts.fetch_script(self.job.script_uri, self.job.entry_point, self.job_dir.code_dir)
            module, entry_point = "", script
            args = script_arguments(self.job.hyperparameters)
            self.environment = self.job_environment()
            if self.environment is not None:
                self.python = self.environment.python
        else:
            raise StagingError("the job names neither an algorithm nor a script")
        if self.checkpoints is not None:
            restored = self.checkpoints.restore()
            if restored:
                self._note(f"restored {restored} checkpoint file(s) from {self.checkpoints.uri}")
        node = self.claim.node
        facts = LaunchFacts(
            job_id=self.job_id, job_name=self.job.name, attempt=self.attempt, node_rank=self.node_rank,
            hosts=self.claim.hosts, hyperparameters=dict(self.job.hyperparameters or {}), channels=channels,
            entry_point=entry_point, num_gpus=node.gpus, num_cpus=node.cpus or (os.cpu_count() or 1),
            redis_url=settings.REDIS_URL, checkpoint_every_steps=int((self.job.checkpoint or {}).get("every_steps") or 0),
            environment={str(k): str(v) for k, v in (self.job.environment or {}).items()},
            distribution=self.job.distribution or "none", pipeline=dict(self.job.pipeline or {}),
        )
        write_config(self.job_dir, facts)
        processes = self.job.resources.get("processes_per_node") or (node.gpus or 1)
        if processes > max(node.cpus, node.gpus, 1):
            # The API checks against the largest node of the type; a smaller one got it.
            raise StagingError(f"{processes} processes per node do not fit node {node.name} ({node.cpus} CPUs, "
                               f"{node.gpus} GPUs); use processes_per_node ≤ {max(node.cpus, node.gpus, 1)}")
        spec = LaunchSpec(job_id=self.job_id, attempt=self.attempt, python=self.python,
                          spool_dir=self.job_dir.spool_dir, module=module, script=script, args=args,
                          nnodes=self.job.instance_count, node_rank=self.node_rank,
                          nproc_per_node=self.job.resources.get("processes_per_node"), gpus=node.gpus,
                          rendezvous_endpoint=self.rendezvous_endpoint() if self.job.instance_count > 1 else "")
        env = {**build_environment(self.job_dir, facts), **launch_environment(spec)}
        if self.environment is not None:
            env.update(self.environment.variables(env))
        return spec, env

    def job_environment(self) -> envs.JobEnvironment | None:
        """A script folder's requirements.txt becomes a job environment on this node
        (jobs.runner.process.envs): built by the first job that asks for it, reused by the
        ones after. StagingError with the reason when a line is refused or the install fails."""
        path = self.job_dir.code_dir / envs.REQUIREMENTS_FILE
        if not path.is_file():
            return None
        node = self.claim.node.name
        try:
            requirements = envs.read_requirements(path)
            environment = envs.ensure_environment(
                requirements, self.config.envs_dir,
                sources=envs.Sources.of(self.config.pip_index_url, self.config.pip_find_links),
                announce=lambda message: self._note(f"node {node}: {message}"))
        except envs.RequirementsError as exc:
            raise StagingError(str(exc)) from exc
        if environment.reused:
            self._note(f"node {node}: reused the environment for {envs.REQUIREMENTS_FILE} "
                       f"({requirements.describe()})")
        else:
            self._note(f"node {node}: installed {requirements.describe()} in {environment.seconds:.1f} s "
                       f"({environment.installer})")
        return environment

    def rendezvous_endpoint(self) -> str:
        """Node 0 picks a free port and publishes "address:port" in Redis; the others wait
        for it (as long as the job is still starting)."""
        from studio.redis_conn import redis_client

        name = RENDEZVOUS_KEY.format(job_id=self.job_id, attempt=self.attempt)
        if self.is_leader:
            address = self.config.node_address or default_node_address()
            endpoint = f"{address}:{free_port()}"
            redis_client().set(name, endpoint, ex=24 * 3600)
            return endpoint
        deadline = time.monotonic() + self.config.rendezvous_timeout_seconds
        while time.monotonic() < deadline:
            value = redis_client().get(name)
            if value:
                return value.decode() if isinstance(value, bytes) else str(value)
            if self._status() not in (JobStatus.STARTING, JobStatus.TRAINING, None):
                raise StagingError("the job stopped before node 0 published its rendezvous address")
            time.sleep(0.5)
        raise StagingError(f"node 0 did not publish its rendezvous address within {self.config.rendezvous_timeout_seconds} s")

    # --- 2. launch ---------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec, env: dict[str, str]) -> None:
        from studio.redis_conn import redis_client
        from studio.supervisor import die_with_parent_hook

        rules, problems = compile_metric_rules(self.job.metric_definitions or [])
        self.publisher = LivePublisher(redis_client(), self.job_id, self.node_rank)
        self.publisher.start()
        self.capture = OutputCapture(logs_dir=self.job_dir.logs_dir, max_bytes=self.config.log_max_bytes, rules=rules,
                                     publisher=self.publisher)
        for problem in problems:
            self.capture.note(problem)
        command = build_command(spec)
        self.mark = guard.new_job_mark()
        env = {**env, guard.JOB_MARK_VARIABLE: self.mark}
        forked = self._launch_warm(spec, env) if self.job.warm_pool else None
        self._cold_launch = forked is None
        if forked is not None:
            self.process = forked  # type: ignore[assignment]  # Popen-like: pid, poll, wait, stdout, stderr
            command = ["fork-server", spec.module or spec.script, *spec.args]
        else:
            # Its own session: signals for the job never reach the worker, and the worker's
            # terminal's Ctrl-C never reaches the job directly. die_with_parent_hook: if the
            # worker is killed, the launcher gets SIGTERM and ends its processes.
            self.process = subprocess.Popen(command, cwd=self.job_dir.code_dir, env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                            preexec_fn=die_with_parent_hook())
        self.capture.start(self.process.stdout, self.process.stderr)  # type: ignore[arg-type]
        memory_limit = guard.memory_limit_bytes((self.job.resources or {}).get("memory_limit_mb"),
                                                self.claim.node.memory_bytes, self.config.memory_fraction)
        self.guard = guard.ProcessGuard(self.process, memory_limit_bytes=memory_limit,
                                        max_processes=self.config.max_processes, spool_dir=self.job_dir.spool_dir,
                                        mark=self.mark)
        self.guard.start()
        self.sampler = guard.SystemSampler(redis_client(), self.job_id, self.claim.node.name,
                                           self.config.system_metrics_seconds)
        self.sampler.start()
        self.syncer = PeriodicSync(self, self.config.sync_seconds)
        self.syncer.start()
        how = f"warm from pool {self.job.warm_pool} (forked)" if forked is not None else "cold"
        self.capture.note(f"launched {spec.processes} process(es) on node {self.claim.node.name}, {how}: "
                          f"{shlex.join(command)}")
        if self.is_leader:
            training_at = timezone.now()
            if transition(self.job_id, JobStatus.TRAINING, from_statuses=[JobStatus.STARTING],
                          message=f"{spec.processes * spec.nnodes} process(es) on {spec.nnodes} node(s)",
                          training_started_at=training_at):
                self._cost_step(lambda: cost.mark_training(self.job_id, self.attempt, training_at))
        if self.job.keep_alive_seconds and not SHUTDOWN.is_set():
            # This node stays warm after the job: its fork server imports torch now, while
            # the job runs, so the pool's next job forks at once even when it comes the
            # moment this one ends (started at the end, it would wait seconds for the
            # import). Already there when this job itself started warm. This thread is the
            # worker's main one, as the server needs (PR_SET_PDEATHSIG, jobs.runner.warm).
            # With this job's interpreter (its environment's, for a script with requirements):
            # a server of another one is replaced, which is safe as this job did not fork from it.
            from jobs.runner import warm

            warm.ensure_server(self.python)

    def _launch_warm(self, spec: LaunchSpec, env: dict[str, str]):
        """Fork the job's processes from the pool's fork server; None (a cold launch
        follows) when the server is not there, not ready in time, or runs another Python
        than the job's (a job environment's packages are only in its own interpreter)."""
        from jobs.runner import warm
        from jobs.runner.process.forkserver import ForkServerError, LaunchRequest

        running = warm.server_python()
        if running and running != spec.python:
            self._note(f"node {self.claim.node.name}: the warm pool's fork server runs {running}, this job "
                       f"{spec.python}; starting cold")
            return None
        server = warm.server_for_launch(timeout=self.config.warm_ready_seconds, python=spec.python)
        if server is None:
            self._note(f"node {self.claim.node.name}: the warm pool's fork server is not ready; starting cold")
            return None
        master_addr, master_port = "127.0.0.1", 0
        if spec.nnodes > 1:
            host, _, port = spec.rendezvous_endpoint.rpartition(":")
            master_addr, master_port = host, int(port)
        request = LaunchRequest(module=spec.module, script=spec.script, args=list(spec.args), env=dict(env),
                                cwd=str(self.job_dir.code_dir), nproc=spec.processes, nnodes=spec.nnodes,
                                node_rank=spec.node_rank, master_addr=master_addr, master_port=master_port,
                                run_id=spec.rendezvous_id)
        try:
            return server.launch(request)
        except (ForkServerError, OSError) as exc:
            self._note(f"node {self.claim.node.name}: the fork server could not launch ({exc}); starting cold")
            return None

    # --- 3. supervise ------------------------------------------------------------------------
    def supervise(self) -> str:
        """Wait for the launcher, reading the job row every poll interval. Returns what
        ended it: "exit", "stop", "runtime", "elsewhere" (finished by someone else),
        "shutdown" (the worker is going down) or "guard"."""
        assert self.process is not None and self.guard is not None
        max_runtime = self.job.max_runtime_seconds
        launched = time.monotonic()
        ended_by = "exit"
        term_sent_at: float | None = None
        while True:
            try:
                self.process.wait(self.config.poll_seconds)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.guard.verdict:
                ended_by = "guard"
                continue
            if term_sent_at is not None:
                if time.monotonic() - term_sent_at > self.config.stop_grace_seconds:
                    self.capture_note(f"still running {self.config.stop_grace_seconds:g} s after SIGTERM: SIGKILL")
                    guard.kill_group(self.process, self.process.pid, self.guard.live_seen_pids(), mark=self.mark)
                continue
            reason = self._stop_reason(max_runtime, launched)
            if not reason and self._only_the_exit_barrier_left():
                self.capture_note("our ranks finished and the other nodes' launchers have ended or wait (a node's "
                                  "ranks aborted at teardown): ending torchrun's exit barrier, which would wait 300 s"
                                  if self.is_leader else "our ranks finished and node 0 ends torchrun's exit barrier "
                                  "(a node's ranks aborted at teardown): ending ours")
                reason = "barrier"
            if reason:
                ended_by = reason
                term_sent_at = time.monotonic()
                self.capture_note(f"stopping ({reason}): SIGTERM to the job's processes; SIGKILL after "
                                  f"{self.config.stop_grace_seconds:g} s")
                if self.capture is not None:
                    self.capture.expect_stop()
                guard.signal_group(self.process.pid, guard.signal.SIGTERM)
        if self.guard.verdict:
            ended_by = "guard"
        # Whatever the launcher left behind (a child that ignored SIGTERM, a daemon) goes too.
        guard.kill_group(self.process, self.process.pid, self.guard.live_seen_pids(), mark=self.mark)
        self.exit_code = self.process.returncode
        return ended_by

    def _stop_reason(self, max_runtime: int | None, launched: float) -> str:
        status = self._status()
        if status == JobStatus.STOPPING:
            return "stop"
        if status in FINISHED_STATUSES or status == GONE:
            return "elsewhere"
        if SHUTDOWN.is_set():
            return "shutdown"
        if max_runtime and time.monotonic() - launched > max_runtime:
            message = f"{MAX_RUNTIME_EXCEEDED}: the job ran longer than its max_runtime_seconds ({max_runtime} s)"
            transition(self.job_id, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING],
                       message=message, stop_reason=MAX_RUNTIME_EXCEEDED, stop_requested_at=timezone.now())
            return "runtime"
        return ""

    # --- 4. conclude -------------------------------------------------------------------------
    def conclude(self, ended_by: str) -> str:
        """1. Drain the output (the pipes end once every writer is gone). 2. Judge the
        ending and say it in the log. 3. Close and upload the logs, sync checkpoints.
        4. Record the outcome — last, so whoever sees the final status finds the logs."""
        assert self.capture is not None and self.guard is not None and self.process is not None
        if not self.capture.join(timeout=30):
            log.warning("job %s: output pipes still open after the processes ended", self.job_id)
        verdict: outcome.Verdict | None = None
        if ended_by == "barrier":
            verdict = outcome.Verdict(True)
            self.capture_note("processes ended: success (torchrun's exit barrier ended by us)")
        elif ended_by == "exit" or ended_by == "guard":
            verdict = outcome.judge(outcome.Observed(
                returncode=self.process.returncode, guard_verdict=self.guard.verdict, killed_by_us=ended_by == "guard",
                failure_file=self.job_dir.failure_file, model_dir=self.job_dir.model_dir,
                launcher_lines=list(self.capture.launcher_tail), stderr_tail=self.capture.stderr_tail,
                ranks=sorted(self.capture.ranks), teardown_abort_ranks=set(self.capture.teardown_abort_ranks),
                leader=self.is_leader))
            if verdict.leader_decides:
                verdict = self._leader_verdict(verdict)
            self.exit_code = self.process.returncode if verdict.succeeded else verdict.exit_code
            self.capture_note(f"processes ended: {'success' if verdict.succeeded else verdict.reason.splitlines()[0]}")
            if verdict.note:
                self.capture_note(verdict.note)
        else:
            self.capture_note(f"processes ended ({ended_by}), launcher {describe_exit(self.process.returncode)}")
        self._close_capture()
        self._stop_threads()
        self.sync_outputs()
        if ended_by == "elsewhere":
            return "aborted"
        if ended_by in ("stop", "runtime"):
            return self._record_stopped(ended_by)
        if ended_by == "shutdown":
            from jobs.recovery import end_attempt

            end_attempt(self.job_id, self.attempt, cause=f"node {self.claim.node.name} was shut down while the job ran")
            return "shutdown"
        assert verdict is not None
        if verdict.note:
            self._note(verdict.note)
        if not verdict.succeeded:
            lost = self._vanished_peers()
            if lost:
                # Our processes failed because a peer's did not answer any more: not the
                # job's fault. The attempt ends and the job retries (within its retries).
                from jobs.recovery import end_attempt

                self.capture_note(f"node(s) {', '.join(lost)} of this attempt stopped heartbeating: the attempt is lost")
                end_attempt(self.job_id, self.attempt, cause=f"node {', '.join(lost)} stopped answering mid-attempt")
                return "aborted"
            self._fail(verdict.reason)
            return "failed"
        if not self.is_leader:
            return "completed"
        return self._upload_and_complete(teardown_abort=bool(verdict.note))

    def _attempt_key(self, template: str, node_rank: int) -> str:
        run = f"{self.job_id}.{int(self.job.created_at.timestamp() * 1_000_000)}"
        return template.format(run=run, attempt=self.attempt, node_rank=node_rank)

    def _only_the_exit_barrier_left(self) -> bool:
        """A multi-node cold launch whose local workers succeeded. torchrun then waits up to
        300 s in its exit barrier for every node's torchrun; a node whose ranks aborted at
        teardown never gets there (its torchrun failed) and waits for node 0's result
        instead (_leader_verdict), saying so under LAUNCHER_ENDED_KEY.

        Node 0: True once every other node's launcher has ended that way, its attempt is
        closed, or it waits in the barrier too (IN_BARRIER_KEY), and at least one will never
        arrive — but first it tells the waiting nodes (its own LAUNCHER_ENDED_KEY) and gives
        them a few polls to end theirs, so none sees node 0's store vanish under its barrier.
        Another node: says it waits in the barrier, and True once node 0 has said it ends its.
        (torchrun, run with --max_restarts 0, returns at once when a local worker fails: a
        launcher without workers has seen them succeed.)"""
        if self.job.instance_count <= 1 or not self._cold_launch or self.process is None:
            return False
        try:
            workers = [child for child in psutil.Process(self.process.pid).children()
                       if child.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return False
        if workers:
            self._workers_seen = True
            return False
        if self.guard is not None and self.guard.seen_pids:
            self._workers_seen = True  # the guard's faster sampling saw some
        if not self._workers_seen:
            return False  # still in the rendezvous
        from studio.redis_conn import redis_client

        try:
            client = redis_client()
            if not self.is_leader:
                client.set(self._attempt_key(IN_BARRIER_KEY, self.node_rank), "1", ex=24 * 3600)
                if client.get(self._attempt_key(LAUNCHER_ENDED_KEY, 0)) is None:
                    return False
                client.set(self._attempt_key(LAUNCHER_ENDED_KEY, self.node_rank), "barrier", ex=24 * 3600)
                return True
            closed = set(JobAttempt.objects.filter(job_id=self.job_id, attempt=self.attempt, finished_at__isnull=False)
                         .values_list("node_rank", flat=True))
            others = range(1, self.job.instance_count)
            said = {rank: client.get(self._attempt_key(LAUNCHER_ENDED_KEY, rank)) for rank in others}
            ended = {rank for rank in others if rank in closed or said[rank] is not None}
            never_arriving = {rank for rank in ended if rank in closed or said[rank] != b"barrier"}
            waiting = {rank for rank in others if rank not in ended and client.exists(self._attempt_key(IN_BARRIER_KEY, rank))}
            if not never_arriving or len(ended) + len(waiting) < len(others):
                return False  # a node still trains, or every node's torchrun reaches the barrier by itself
            if not waiting:
                return True
            if self._barrier_ending_since is None:
                client.set(self._attempt_key(LAUNCHER_ENDED_KEY, 0), "barrier", ex=24 * 3600)
                self._barrier_ending_since = time.monotonic()
                self.capture_note(f"node(s) {', '.join(map(str, sorted(waiting)))} wait in torchrun's exit barrier "
                                  "too: telling them to end theirs first")
            # Those that do not answer within a few polls end when node 0's store goes.
            return time.monotonic() - self._barrier_ending_since > 4 * self.config.poll_seconds + 5
        except Exception:  # noqa: BLE001 - ask again at the next poll
            close_old_connections()
            return False

    def _leader_verdict(self, verdict: outcome.Verdict) -> outcome.Verdict:
        """Our ranks aborted at teardown (gloo's "terminate called without an active
        exception") and the model, if any, is on node 0: its result is the job's. Wait for
        node 0 to upload or complete (rank 0 may still be writing the model when ours exit);
        our failure counts only if node 0 neither succeeds nor fails by itself in time."""
        ranks = ", ".join(str(r) for r in sorted(self.capture.teardown_abort_ranks)) if self.capture else "?"
        from studio.redis_conn import redis_client

        try:
            redis_client().set(self._attempt_key(LAUNCHER_ENDED_KEY, self.node_rank), "teardown-abort", ex=24 * 3600)
        except Exception:  # noqa: BLE001 - node 0 then waits out torchrun's exit barrier (300 s)
            log.warning("job %s: could not tell node 0 our launcher ended", self.job_id, exc_info=True)
        self.capture_note(f"rank {ranks} aborted at exit (\"terminate called without an active exception\"); "
                          "waiting for node 0's result, which decides the job's")
        deadline = time.monotonic() + self.config.leader_verdict_seconds
        while time.monotonic() < deadline:
            status = self._status()
            if status in (JobStatus.UPLOADING, JobStatus.COMPLETED):
                return outcome.Verdict(True, note=(
                    f"teardown abort on node {self.node_rank}: rank {ranks} aborted at exit (\"terminate called "
                    "without an active exception\", a known gloo shutdown crash) and node 0 finished training; "
                    "the result stands"), exit_code=verdict.exit_code)
            if status is not None and status not in (JobStatus.STARTING, JobStatus.TRAINING):
                break  # node 0 failed, or a stop or a retry ended the attempt: what it says stands
            time.sleep(0.5)
        return verdict

    def _vanished_peers(self) -> list[str]:
        """In a multi-node attempt whose processes failed: the peers that went silent. A
        peer killed with its worker takes its ranks with it, and ours fail on the next
        collective within a second — long before the lost-node sweep. So wait up to two
        heartbeat intervals (and a second) for each peer that has not finished its part to
        heartbeat again; those that do not are gone."""
        if self.job.instance_count <= 1:
            return []
        try:
            peers = list(JobAttempt.objects.filter(job_id=self.job_id, attempt=self.attempt, finished_at__isnull=True)
                         .exclude(node_rank=self.node_rank).exclude(node=None).values_list("node_id", "node__name"))
            if not peers:
                return []
            since = timezone.now()
            deadline = time.monotonic() + 2 * float(settings.STUDIO_NODE_HEARTBEAT_SECONDS) + 1
            silent = dict(peers)
            while silent and time.monotonic() < deadline:
                time.sleep(0.25)
                beat = dict(Node.objects.filter(pk__in=list(silent)).values_list("pk", "last_heartbeat"))
                finished = set(JobAttempt.objects.filter(job_id=self.job_id, attempt=self.attempt,
                                                         node_id__in=list(silent), finished_at__isnull=False)
                               .values_list("node_id", flat=True))
                for node_id in list(silent):
                    if node_id in finished or (beat.get(node_id) and beat[node_id] > since):
                        silent.pop(node_id)
            return sorted(silent.values())
        except DatabaseError:
            close_old_connections()
            return []

    def sync_reports(self) -> None:
        """Node 0 copies what rank 0 reported (TRAINYARD_REPORT_DIR/<name>.json) into the
        job's `details`, when it changed."""
        if not self.is_leader or not self.job_dir.report_dir.is_dir():
            return
        reports: dict = {}
        for path in sorted(self.job_dir.report_dir.glob("*.json")):
            try:
                reports[path.stem] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being written (the SDK replaces files atomically) or not ours
        if reports and reports != self._reported:
            TrainingJob.objects.filter(pk=self.job_id).update(details={**(self.job.details or {}), **reports})
            self._reported = reports

    def _close_capture(self) -> None:
        """Flush the live view, then close the log files (appending cut logs' last lines)."""
        if self.publisher is not None:
            self.publisher.stop()
        if self.capture is not None:
            self.capture.close()

    def _upload_and_complete(self, *, teardown_abort: bool) -> str:
        if not transition(self.job_id, JobStatus.UPLOADING, from_statuses=[JobStatus.TRAINING],
                          message="uploading model.tar.gz"):
            if self._status() == JobStatus.STOPPING:
                return self._record_stopped("stop")
            return "aborted"
        model_uri = join_uri(self.output_uri, "model.tar.gz")
        try:
            files = artifacts.upload_archive(self.job_dir.model_dir, model_uri)
            if artifacts.has_files(self.job_dir.output_data_dir):
                artifacts.upload_archive(self.job_dir.output_data_dir, join_uri(self.output_uri, "output.tar.gz"))
        except (OSError, StorageError) as exc:
            self._fail(f"could not upload the model to {model_uri}: {exc}")
            return "failed"
        message = f"model.tar.gz with {files} file(s)" + (" (after a teardown abort)" if teardown_abort else "")
        self._wait_for_other_nodes()
        transition(self.job_id, JobStatus.COMPLETED, from_statuses=[JobStatus.UPLOADING], message=message,
                   model_uri=model_uri)
        return "completed"

    def _record_stopped(self, ended_by: str) -> str:
        if not self.is_leader:
            return "stopped"
        self._wait_for_other_nodes()
        if ended_by == "runtime":
            limit = self.job.max_runtime_seconds
            message = f"{MAX_RUNTIME_EXCEEDED}: stopped after its max_runtime_seconds ({limit} s)"
            transition(self.job_id, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING], message=message,
                       stop_reason=MAX_RUNTIME_EXCEEDED, failure_reason=message)
        else:
            transition(self.job_id, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING],
                       message=self._stopped_message())
        return "stopped"

    def _stopped_message(self) -> str:
        """The final timeline entry in the words of whoever asked: a person, a search's
        pruner, or one of the job's rules (jobs.rules)."""
        reason, rule = TrainingJob.objects.filter(pk=self.job_id).values_list("stop_reason", "stop_rule").first() or ("", "")
        if reason == RULE_TRIGGERED and rule:
            return f"stopped by its rule {rule}"
        if reason == EARLY_STOPPED:
            return "stopped by its tuning job's pruner"
        return "stopped on request"

    def _stopped_before_launch(self) -> str:
        status = self._status()
        if status == JobStatus.STOPPING and self.is_leader:
            self._close_unclaimed_launches()
            transition(self.job_id, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING],
                       message="stopped before its processes started")
            return "stopped"
        return "aborted"

    def _close_unclaimed_launches(self) -> None:
        """The gang's launches no node claimed yet end with this one (billed from their
        placement): once the job is Stopped a late claim is refused, and no lease sweep
        looks at a finished job, so their nodes would stay reserved for it."""
        with transaction.atomic():
            unclaimed = list(JobAttempt.objects.select_for_update().filter(
                job_id=self.job_id, attempt=self.attempt, outcome="").exclude(node_rank=self.node_rank)
                .values_list("pk", "node_id"))
            if not unclaimed:
                return
            JobAttempt.objects.filter(pk__in=[pk for pk, _ in unclaimed]).update(finished_at=timezone.now(),
                                                                                 outcome="stopped")
            Node.objects.filter(pk__in=[node for _, node in unclaimed if node], current_job_id=self.job_id,
                                state=NodeState.BUSY).update(state=NodeState.IDLE, current_job=None)

    def _wait_for_other_nodes(self) -> None:
        """Before the final status, give the other nodes of the gang time to end and upload
        their logs: whoever sees Completed or Stopped finds every rank's log. Bounded: a
        node that hangs does not hold the job's outcome back (its lease sweep ends it)."""
        if self.job.instance_count <= 1:
            return
        deadline = time.monotonic() + self.config.stop_grace_seconds + 30
        others = JobAttempt.objects.filter(job_id=self.job_id, attempt=self.attempt, finished_at__isnull=True).exclude(
            node_rank=self.node_rank)
        while time.monotonic() < deadline:
            try:
                if not others.exists():
                    return
            except DatabaseError:
                close_old_connections()
            time.sleep(0.2)
        log.warning("job %s: other nodes still running %.0f s after node 0 finished", self.job_id,
                    self.config.stop_grace_seconds + 30)

    # --- helpers -----------------------------------------------------------------------------
    def sync_outputs(self) -> None:
        try:
            self.sync_reports()
        except Exception:  # noqa: BLE001 - a report is not worth failing a job for
            log.warning("job %s: could not save its reports", self.job_id, exc_info=True)
        if self.checkpoints is not None:
            try:
                self.checkpoints.sync()
            except StorageError as exc:
                log.warning("job %s: checkpoint sync failed: %s", self.job_id, exc)
        if self.capture is not None:
            files = {path: join_uri(self.output_uri, "logs", self._log_name(path)) for path in self.capture.log_files()}
            self.uploader.upload_changed(files)

    def _log_name(self, path: Path) -> str:
        assert self.capture is not None
        if path == self.capture.log_path(LAUNCHER_RANK):
            return f"launcher-node-{self.node_rank}.log"
        return path.name

    def capture_note(self, text: str) -> None:
        if self.capture is not None:
            try:
                self.capture.note(text)
            except Exception:  # noqa: BLE001 - a log line is never worth an error
                log.warning("job %s: could not log %r", self.job_id, text, exc_info=True)

    def _status(self) -> str | None:
        """The job's status; GONE if its row was deleted or its attempt moved on (the
        attempt was ended elsewhere: a lost node, a retry); None if the database did not
        answer."""
        try:
            row = TrainingJob.objects.filter(pk=self.job_id).values_list("status", "attempt").first()
            if row is None or row[1] != self.attempt:
                return GONE
            return row[0]
        except DatabaseError:
            # The database restarting must not end a healthy job: ask again next time.
            log.warning("job %s: could not read its status", self.job_id, exc_info=True)
            close_old_connections()
            return None

    def _note(self, message: str) -> None:
        try:
            note(self.job_id, message)
        except Exception:  # noqa: BLE001 - a timeline note is not worth failing a job for
            log.warning("job %s: could not add a timeline note", self.job_id, exc_info=True)

    def _fail(self, reason: str) -> None:
        self.capture_note(f"failed: {reason.splitlines()[0] if reason else ''}")
        if transition(self.job_id, JobStatus.FAILED, failure_reason=reason,
                      from_statuses=[JobStatus.STARTING, JobStatus.TRAINING, JobStatus.UPLOADING],
                      message=reason.splitlines()[0][:300] if reason else "failed"):
            return
        # Someone asked it to stop meanwhile: what the person asked for is what they see.
        transition(self.job_id, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING],
                   message=f"stopped; it was also failing: {reason.splitlines()[0][:250] if reason else ''}")

    def _cost_step(self, step) -> None:
        try:
            step()
        except Exception:  # noqa: BLE001 - cost bookkeeping is never worth a job; jobs.cost reads around a gap
            log.warning("job %s: could not record its cost figures", self.job_id, exc_info=True)

    def _end_processes(self, grace: float) -> None:
        if self.process is None:
            return
        try:
            if self.guard:
                self.guard.sample()  # a last look: processes started since the guard's previous sample
            extra = self.guard.live_seen_pids() if self.guard else set()
            guard.end_group(self.process, self.process.pid, grace=grace, extra_pids=extra, mark=self.mark)
        except Exception:  # noqa: BLE001
            log.exception("job %s: could not end its processes", self.job_id)

    def _stop_threads(self) -> None:
        for thread in (self.guard, self.sampler, self.syncer):
            if thread is not None:
                try:
                    thread.stop()
                except Exception:  # noqa: BLE001
                    log.warning("could not stop %s", thread.name, exc_info=True)

    def _finish(self, result: str) -> None:
        """Always: threads stopped, final sync, the node released, the attempt closed, the
        job directory removed (unless kept for debugging). Each step on its own."""
        self._stop_threads()
        if self.publisher is not None:
            self.publisher.stop()
        self.lease.stop()
        # The attempt closes before the node is free: a node's attempts never overlap.
        steps = (
            lambda: JobAttempt.objects.filter(job_id=self.job_id, attempt=self.attempt, node_rank=self.node_rank)
            .update(finished_at=timezone.now(), exit_code=self.exit_code, outcome=result),
            # Billable and training seconds and the cost, at the price snapshotted at placement.
            lambda: cost.settle_launches(self.job_id, self.attempt),
            lambda: self._release_node(result),
        )
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001
                log.exception("job %s: clean-up step failed", self.job_id)
        if not self.config.keep_job_dirs:
            shutil.rmtree(self.job_dir.root, ignore_errors=True)
        try:
            from jobs.tasks import schedule_jobs_task

            # The node is free: let the next job start now rather than at the next tick.
            schedule_jobs_task.delay()
        except Exception:  # noqa: BLE001 - the periodic tick schedules it anyway
            log.debug("could not send a scheduling tick", exc_info=True)


    def _release_node(self, result: str) -> None:
        """Idle, or warm: a job with keep_alive_seconds leaves its node reserved for the
        next job of its pool (same project, instance type, instance count), holding a fork
        server with torch imported (jobs.runner.warm)."""
        mine = Node.objects.filter(pk=self.claim.node.pk, current_job_id=self.job_id).exclude(
            state__in=[NodeState.STOPPED, NodeState.LOST])
        keep = self.job.keep_alive_seconds
        # Node 0 records the final status after the others finish, so the others go by
        # their own result: the attempt ran its course here (not lost, not requeued).
        row = TrainingJob.objects.filter(pk=self.job_id).values_list("status", "attempt").first()
        ended_here = (result in ("completed", "failed", "stopped") and row is not None and row[1] == self.attempt
                      and row[0] != JobStatus.PENDING)
        if keep and ended_here and not SHUTDOWN.is_set():
            pool = self.job.warm_pool or f"pool-{self.job_id}"
            if mine.update(state=NodeState.WARM, current_job=None, warm_pool=pool, warm_project=self.job.project_id,
                           warm_instance_count=self.job.instance_count, warm_from_job=self.job_id,
                           warm_until=timezone.now() + timedelta(seconds=keep)):
                from jobs.runner import warm

                warm.ensure_server(self.python)
                self._note(f"node {self.claim.node.name} stays warm in {pool} for {keep} s")
            return
        mine.update(state=NodeState.IDLE, current_job=None, warm_pool="", warm_until=None, warm_project=None,
                    warm_instance_count=0, warm_from_job=None)


def script_arguments(hyperparameters: dict) -> list[str]:
    """SageMaker's script mode passes hyperparameters as `--name value` arguments too
    (sorted by name, str() of each value: a string as given, a boolean as True/False, a dict
    as k=v,k=v sorted by key), so argparse-based scripts run unchanged. SM_HPS keeps the
    JSON values. The launch passes them on untouched (jobs.runner.process.launch.build_command)."""
    args: list[str] = []
    for name in sorted(hyperparameters or {}):
        value = hyperparameters[name]
        text = ",".join(f"{k}={v}" for k, v in sorted(value.items())) if isinstance(value, dict) else str(value)
        args += [f"--{name}", text]
    return args
