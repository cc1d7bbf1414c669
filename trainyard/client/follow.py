"""Following a job in the terminal: its status transitions and timeline notes, a progress
bar of rank 0's steps with the newest value of each metric, and the log lines as they are
written, from the job's event stream, until the job ends. On a terminal the bar is drawn by
rich; piped into a file or a CI log, the same facts come as plain lines."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from trainyard.client.studio import Job

# A hyperparameter of one of these names (an integer) is taken as the run's total steps.
TOTAL_STEP_HYPERPARAMETERS = ("steps", "max_steps", "total_steps", "num_steps", "iterations")
PLAIN_PROGRESS_SECONDS = 1.0
MAX_METRICS_SHOWN = 4
# The bar is drawn from Training on (and when following a job that is already stopping).
BAR_STATUSES = ("Training", "Uploading", "Stopping")
STATUS_STYLES = {"Pending": "grey50", "Starting": "blue", "Training": "magenta", "Uploading": "cyan",
                 "Completed": "green", "Stopping": "yellow", "Stopped": "yellow", "Failed": "red"}


def total_steps(job: Job) -> int | None:
    hyperparameters = job.data.get("hyperparameters") or {}
    for name in TOTAL_STEP_HYPERPARAMETERS:
        value = hyperparameters.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def world_size(job: Job) -> int:
    resources = job.data.get("resources") or {}
    per_node = resources.get("processes_per_node") or (job.data.get("pipeline") or {}).get("stages") or 1
    return int(resources.get("instance_count") or 1) * int(per_node)


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "nan" if value is None else str(value)


@dataclass
class FollowState:
    status: str = ""
    step: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    seen_notes: set[tuple[str, str]] = field(default_factory=set)

    def metrics_text(self) -> str:
        return "  ".join(f"{name}={format_value(value)}" for name, value in list(self.metrics.items())[-MAX_METRICS_SHOWN:])


class JobFollower:
    """Prints one job's events to `console` (see the module's docstring)."""

    def __init__(self, job: Job, console: Console, *, show_logs: bool = True):
        self.job = job
        self.console = console
        self.show_logs = show_logs
        self.state = FollowState()
        self.total = total_steps(job)
        self.prefix_ranks = world_size(job) > 1
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.last_plain = 0.0
        self.plain_shown: tuple[int | None, str] | None = None

    # --- output -----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        (self.progress.console if self.progress else self.console).print(text, highlight=False, soft_wrap=True)

    def start_bar(self) -> None:
        if self.progress is not None or not self.console.is_terminal:
            return
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.fields[status]}"), BarColumn(),
                                 TextColumn("{task.fields[steps]}"), TextColumn("{task.fields[metrics]}"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
        self.task = self.progress.add_task("job", total=self.total, status=self.state.status, steps="", metrics="")
        self.progress.start()

    def stop_bar(self) -> None:
        if self.progress is not None:
            self.update_bar()
            self.progress.stop()
            self.progress = None

    def update_bar(self) -> None:
        step = self.state.step
        steps = "" if step is None else (f"step {step}/{self.total}" if self.total else f"step {step}")
        if self.progress is not None and self.task is not None:
            style = STATUS_STYLES.get(self.state.status, "white")
            self.progress.update(self.task, completed=step or 0, status=f"[{style}]{self.state.status}[/]", steps=steps,
                                 metrics=escape(self.state.metrics_text()))
            return
        if self.console.is_terminal:  # the bar is not up yet (or any more): nothing to draw
            return
        # Plain output: a progress line when the step or metrics moved, at most once a second.
        shown = (step, self.state.metrics_text())
        now = time.monotonic()
        if step is not None and shown != self.plain_shown and now - self.last_plain >= PLAIN_PROGRESS_SECONDS:
            self.plain_shown, self.last_plain = shown, now
            self.console.print(f"progress: {steps}  {shown[1]}".rstrip(), highlight=False, soft_wrap=True)

    # --- events -----------------------------------------------------------------------------
    def on_status(self, data: dict[str, Any]) -> None:
        status, message = str(data.get("status") or ""), str(data.get("message") or "")
        if not status:
            return
        if (status, message) not in self.state.seen_notes:
            self.state.seen_notes.add((status, message))
            changed = status != self.state.status
            if changed or message:
                style = STATUS_STYLES.get(status, "white")
                stamp = time.strftime("%H:%M:%S")
                self.say(f"{stamp} [{style}]{escape(status)}[/]" + (f"  {escape(message)}" if message else ""))
        self.state.status = status
        if status in BAR_STATUSES:
            self.start_bar()
        self.update_bar()

    def on_metric(self, data: dict[str, Any]) -> None:
        if data.get("rank") != 0:
            return
        for name, step, value, *_ in data.get("points") or []:
            if isinstance(step, int) and (self.state.step is None or step >= self.state.step):
                self.state.step = step
            self.state.metrics.pop(name, None)
            self.state.metrics[name] = value
        self.start_bar()
        self.update_bar()

    def on_log(self, data: dict[str, Any]) -> None:
        if not self.show_logs:
            return
        rank = data.get("rank", 0)
        line = str(data.get("line", "")).rstrip("\n")
        prefix = "[launcher] " if rank == -1 else (f"[rank {rank}] " if self.prefix_ranks else "")
        self.say(escape(prefix + line))

    def follow(self, *, header: bool = True) -> Job:
        """Until the stream's final status; then the job as the API reads it."""
        if header:
            self.console.print(f"job {self.job.id} ({escape(str(self.job.data.get('name')))}): "
                               f"{self.job.studio.url}/jobs/{self.job.id}/", highlight=False, soft_wrap=True)
        try:
            for event in self.job.events():
                if not isinstance(event.data, dict):
                    continue
                if event.kind == "status":
                    self.on_status(event.data)
                elif event.kind == "metric":
                    self.on_metric(event.data)
                elif event.kind == "log":
                    self.on_log(event.data)
            self.job.refresh()
            self.on_status({"status": self.job.status})
            self.last_plain = 0.0
            self.update_bar()
        finally:
            self.stop_bar()
        return self.job


def summary(job: Job) -> str:
    """The last words on a finished job: its outcome and final metrics, or its reason."""
    final = job.data.get("final_metrics") or {}
    metrics = "  ".join(f"{name}={format_value(value)}" for name, value in final.items()) if isinstance(final, dict) else ""
    if job.status == "Completed":
        model = job.data.get("model_uri") or ""
        return f"job {job.id} Completed" + (f"; final metrics: {metrics}" if metrics else "") + (f"; model: {model}" if model else "")
    reason = job.failure_reason or job.data.get("stop_reason") or "no reason recorded"
    rule = job.data.get("stop_rule")
    if rule:  # RuleTriggered: which rule, and what it saw
        said = next((r.get("state_reason") for r in job.data.get("rules") or [] if r.get("name") == rule), "")
        reason += f" (rule {rule}" + (f": {said}" if said else "") + ")"
    return f"job {job.id} {job.status}: {reason}"
