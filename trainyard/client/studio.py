"""The Python client, shaped like an estimator: `Studio(url, token).run(entry_point=…,
source_dir=…)` packs and uploads the folder, submits the job and hands back a `Job` with
`wait()`, `logs()`, `metrics()`, `stop()`, `status` and `refresh()`. Field names are the
API's own (docs/SPEC.md §3.1)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainyard.client.config import resolve_credentials
from trainyard.client.http import Event, StudioHttp
from trainyard.client.pack import DEFAULT_MAX_FILE_BYTES, PackedSource, pack_source

FINISHED_STATUSES = ("Completed", "Stopped", "Failed")
WAIT_POLL_SECONDS = 2.0


class ClientError(Exception):
    """Input the client can refuse before asking the studio (a missing file, an unknown dataset)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


@dataclass(frozen=True)
class UploadedSource:
    uri: str
    entry_point: str
    packed: PackedSource


def parse_hyperparameter(raw: str) -> tuple[str, str | int | float | bool]:
    """`name=value`, the value read as a JSON scalar where it is one (5 → 5, 0.1 → 0.1,
    true → True, "x" → x) and kept as the text otherwise."""
    import json

    name, sep, text = raw.partition("=")
    if not sep or not name.strip():
        raise ClientError(f"{raw!r}: write it as name=value, e.g. lr=0.1", field="hyperparameters")
    try:
        value = json.loads(text)
    except ValueError:
        return name.strip(), text
    if isinstance(value, bool | str) or (isinstance(value, int | float) and math.isfinite(value)):
        return name.strip(), value
    return name.strip(), text


def default_job_name(entry_point: str) -> str:
    stem = Path(entry_point).stem or "job"
    return f"{stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


class Studio:
    """One studio's API. Without `url` and `token`, TRAINYARD_URL / TRAINYARD_TOKEN, else
    the stored `trainyard login`. `project` is the default project of what it creates."""

    def __init__(self, url: str | None = None, token: str | None = None, *, project: str | None = None,
                 timeout: float = 30.0):
        credentials = resolve_credentials(url, token, project)
        self.http = StudioHttp(credentials.url, credentials.token, timeout=timeout)
        self.url = self.http.url
        self._project = credentials.project

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Studio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- projects ---------------------------------------------------------------------------
    def projects(self) -> list[dict[str, Any]]:
        return list(self.http.pages("/projects/"))

    def project(self, project: str | None = None) -> str:
        """The project to work in: the one given, the default, or the user's only writable one."""
        if project or self._project:
            return str(project or self._project)
        writable = [p["slug"] for p in self.projects() if p.get("role") in ("admin", "scientist")]
        if len(writable) == 1:
            self._project = writable[0]
            return writable[0]
        hint = f"one of {', '.join(writable)}" if writable else "you can write in none yet"
        raise ClientError(f"name the project (--project, or TRAINYARD_PROJECT): {hint}", field="project")

    # --- scripts and jobs ---------------------------------------------------------------
    def upload_source(self, entry_point: str | Path, source_dir: str | Path | None = None, *, project: str | None = None,
                      max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> UploadedSource:
        """Pack `source_dir` (default: the entry point's folder) and upload it; the entry
        point is named by its path inside that folder."""
        script = Path(entry_point)
        folder = Path(source_dir) if source_dir is not None else (script.parent if script.parent != Path() else Path("."))
        if not script.is_absolute() and source_dir is not None and not script.exists() and (folder / script).is_file():
            script = folder / script
        if not script.is_file():
            raise ClientError(f"{entry_point} is not a file", field="entry_point")
        try:
            relative = script.resolve().relative_to(folder.resolve()).as_posix()
        except ValueError:
            raise ClientError(f"{entry_point} is not inside the source folder {folder}", field="entry_point") from None
        packed = pack_source(folder, max_file_bytes=max_file_bytes)
        if relative not in packed.files:
            left_out = next((s.reason for s in packed.skipped if s.path == relative), "ignored by a .gitignore")
            raise ClientError(f"{relative} would not be sent ({left_out})", field="entry_point")
        stored = self.http.upload("/scripts/", {"project": self.project(project)},
                                  [("file", ("source.tar.gz", packed.data, "application/gzip"))])
        return UploadedSource(uri=stored["uri"], entry_point=relative, packed=packed)

    def submit(self, spec: dict[str, Any]) -> Job:
        """POST /api/v1/jobs/ with `spec` as the API takes it (project defaulted)."""
        body = {**spec, "project": self.project(spec.get("project"))}
        return Job(self, self.http.post("/jobs/", body))

    def run(self, entry_point: str | Path, source_dir: str | Path | None = None, *, project: str | None = None,
            name: str | None = None, instance_type: str = "cpu", instance_count: int = 1,
            processes_per_node: int | None = None, distribution: str | dict[str, Any] = "none",
            hyperparameters: dict[str, Any] | None = None, inputs: dict[str, Any] | None = None,
            keep_alive_seconds: int | None = None, wait: bool = False, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
            **fields: Any) -> Job:
        """Upload the source, submit the job, and (wait=True) wait for it to finish.
        `inputs` maps a channel to a dataset version id, `"name"` or `"name:version"`;
        any other job field (`stopping`, `checkpoint`, `retries`, `environment`, `tags`,
        `pipeline` …) passes through under its API name."""
        project = self.project(project)
        uploaded = self.upload_source(entry_point, source_dir, project=project, max_file_bytes=max_file_bytes)
        spec: dict[str, Any] = {
            "project": project, "name": name or default_job_name(uploaded.entry_point),
            "script": {"uri": uploaded.uri, "entry_point": uploaded.entry_point},
            "resources": {"instance_type": instance_type, "instance_count": instance_count,
                          **({"processes_per_node": processes_per_node} if processes_per_node is not None else {})},
            "distribution": distribution, "hyperparameters": dict(hyperparameters or {}),
            "inputs": {channel: self.resolve_input(value, project=project) for channel, value in (inputs or {}).items()},
            **fields,
        }
        if keep_alive_seconds is not None:
            spec["keep_alive_seconds"] = keep_alive_seconds
        job = self.submit(spec)
        job.source = uploaded
        return job.wait() if wait else job

    def job(self, job_id: int) -> Job:
        return Job(self, self.http.get(f"/jobs/{int(job_id)}/"))

    def jobs(self, **filters: Any) -> list[dict[str, Any]]:
        return list(self.http.pages("/jobs/", **filters))

    def spend(self, month: str | None = None, *, project: str | None = None) -> dict[str, Any]:
        """A project's spend in a month (YYYY-MM, UTC; default this month): totals, by
        instance type and by user."""
        return self.http.get(f"/projects/{self.project(project)}/spend/", month=month)

    def spend_launches(self, month: str | None = None, *, project: str | None = None) -> list[dict[str, Any]]:
        """The month's line items: one per launch, at its snapshotted price."""
        return list(self.http.pages(f"/projects/{self.project(project)}/spend/launches/", month=month))

    def alarms(self, **filters: Any) -> list[dict[str, Any]]:
        """Rules in ALARM on running jobs you can read (`project`, `state`, `finished="true"`)."""
        return list(self.http.pages("/alarms/", **filters))  # a None filter is dropped by http.get

    # --- datasets ---------------------------------------------------------------------------
    def datasets(self, project: str | None = None, search: str | None = None) -> list[dict[str, Any]]:
        return list(self.http.pages("/datasets/", project=project, search=search))

    def resolve_input(self, value: Any, *, project: str | None = None) -> Any:
        """A channel's input as the API takes it: a dataset version id, or `name` (its
        newest ready version) or `name:version`, looked up in the project."""
        if isinstance(value, int | dict) and not isinstance(value, bool):
            return value
        text = str(value)
        name, _, version = text.rpartition(":") if ":" in text else (text, "", "")
        found = [d for d in self.datasets(project=self.project(project), search=name) if d["name"] == name]
        if not found:
            if text.isdigit():
                return int(text)
            raise ClientError(f"no dataset {name!r} in project {self.project(project)}", field="inputs")
        versions = found[0]["versions"]
        if version:
            match = [v for v in versions if str(v["version"]) == version]
            if not match:
                raise ClientError(f"dataset {name!r} has no version {version} (it has "
                                  f"{', '.join(str(v['version']) for v in versions) or 'none'})", field="inputs")
            return match[0]["id"]
        ready = [v for v in versions if v["status"] == "ready"]
        if not (ready or versions):
            raise ClientError(f"dataset {name!r} has no versions yet", field="inputs")
        return (ready or versions)[0]["id"]

    def upload_dataset(self, name: str, paths: list[Path], *, project: str | None = None,
                       **options: Any) -> dict[str, Any]:
        """A new version of dataset `name` from files or folders (a folder's files keep
        their paths inside it); `options` are the API's (`format`, `label_column`,
        `description`, …). Answers the version, validating until `wait_version`."""
        parts: list[tuple[str, Path]] = []
        for path in paths:
            if path.is_dir():
                parts += [(p.relative_to(path).as_posix(), p) for p in sorted(path.rglob("*"))
                          if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)]
            elif path.is_file():
                parts.append((path.name, path))
            else:
                raise ClientError(f"{path} is not a file or folder", field="file")
        if not parts:
            raise ClientError("no files to upload", field="file")
        data = {"project": self.project(project), "name": name, "paths": [relative for relative, _ in parts],
                **{k: v for k, v in options.items() if v not in (None, "")}}
        handles = [open(path, "rb") for _, path in parts]  # noqa: SIM115 - closed below, after the upload
        try:
            return self.http.upload("/datasets/", data, [("file", (relative, handle, "application/octet-stream"))
                                                         for (relative, _), handle in zip(parts, handles, strict=True)])
        finally:
            for handle in handles:
                handle.close()

    def wait_version(self, version_id: int, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            version = self.http.get(f"/dataset-versions/{int(version_id)}/")
            if version["status"] != "validating" or (deadline is not None and time.monotonic() > deadline):
                return version
            time.sleep(1.0)

    # --- tuning -----------------------------------------------------------------------------
    def tune(self, spec: dict[str, Any]) -> dict[str, Any]:
        """POST /api/v1/tuning-jobs/ with `spec` as the API takes it (project defaulted)."""
        return self.http.post("/tuning-jobs/", {**spec, "project": self.project(spec.get("project"))})

    def tuning_jobs(self, **filters: Any) -> list[dict[str, Any]]:
        return list(self.http.pages("/tuning-jobs/", **filters))

    def tuning_job(self, tuning_job_id: int) -> dict[str, Any]:
        return self.http.get(f"/tuning-jobs/{int(tuning_job_id)}/")

    def stop_tuning_job(self, tuning_job_id: int) -> dict[str, Any]:
        return self.http.post(f"/tuning-jobs/{int(tuning_job_id)}/stop/")


class Job:
    """A training job on the studio. `data` is the API's JSON of it as last read."""

    def __init__(self, studio: Studio, data: dict[str, Any]):
        self.studio = studio
        self.data = data
        self.id: int = data["id"]
        self.source: UploadedSource | None = None

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.data.get('name')!r} {self.status}>"

    @property
    def status(self) -> str:
        return str(self.data["status"])

    @property
    def failure_reason(self) -> str:
        return str(self.data.get("failure_reason") or "")

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def completed(self) -> bool:
        return self.status == "Completed"

    def refresh(self) -> Job:
        self.data = self.studio.http.get(f"/jobs/{self.id}/")
        return self

    def wait(self, timeout: float | None = None, poll_seconds: float = WAIT_POLL_SECONDS) -> Job:
        """Until the job is Completed, Stopped or Failed (or `timeout` seconds pass: then
        TimeoutError). Read `status` and `failure_reason` after it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().finished:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {self.status} after {timeout} s")
            time.sleep(poll_seconds)
        return self

    def stop(self) -> Job:
        self.data = self.studio.http.post(f"/jobs/{self.id}/stop/")
        return self

    def rules(self) -> list[dict[str, Any]]:
        """The job's rules with their states (name, type, parameters, actions, state, state_reason …)."""
        return list(self.studio.http.pages(f"/jobs/{self.id}/rules/"))

    def add_rule(self, rule: dict[str, Any]) -> dict[str, Any]:
        """Add a rule to a pending or running job (checked by the studio: a 400 names the field)."""
        return self.studio.http.post(f"/jobs/{self.id}/rules/", rule)

    def alarm_transitions(self) -> list[dict[str, Any]]:
        """Every state change of the job's rules, oldest first, with the values that caused it."""
        return list(self.studio.http.pages(f"/jobs/{self.id}/alarm-transitions/"))

    def logs(self, rank: int | str = 0, tail: int | None = None) -> list[str]:
        """The log lines of `rank` (every page), or its last `tail` lines."""
        path = f"/jobs/{self.id}/logs/"
        if tail is not None:
            return [line_text(line) for line in self.studio.http.get(path, rank=rank, tail=tail)["lines"]]
        lines: list[str] = []
        cursor = None
        while True:
            page = self.studio.http.get(path, rank=rank, cursor=cursor, limit=5000)
            lines += [line_text(line) for line in page["lines"]]
            if not page["lines"] or not page.get("next_cursor") or page["next_cursor"] == cursor:
                return lines
            cursor = page["next_cursor"]

    def metrics(self, name: str | None = None, **params: Any) -> dict[str, Any]:
        """Without `name`, every series (name, rank, count, last value) and the final
        metrics; with it, that series (`points`, `rank`, `raw` … as the API takes them)."""
        return self.studio.http.get(f"/jobs/{self.id}/metrics/", name=name, **params)

    def events(self, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's live events (`status`, `metric`, `log`, `system`) until it finishes."""
        return self.studio.http.events(f"/jobs/{self.id}/stream", last_event_id)


def line_text(line: dict[str, Any]) -> str:
    return str(line.get("text", line.get("line", ""))).rstrip("\n")
