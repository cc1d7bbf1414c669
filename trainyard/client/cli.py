"""The `trainyard` command (click): log in to a studio, run a script as a job and follow
it, and read or change jobs, datasets and tuning jobs with the API's own field names.

Exit codes: 0 done (a followed job Completed); 1 a followed job Failed or was Stopped;
2 the studio refused the request (a 4xx: its message and fields are printed) or the
command's input is wrong; 3 the studio could not be reached; 130 interrupted. `--json` on
every command prints the API's JSON instead of tables."""

from __future__ import annotations

import csv
import json
import socket
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainyard import __version__
from trainyard.client.config import Credentials, NotLoggedIn, save_credentials
from trainyard.client.follow import JobFollower, summary
from trainyard.client.http import ApiError, StudioHttp, StudioUnreachable, normalise_url
from trainyard.client.pack import DEFAULT_MAX_FILE_BYTES, PackError, human_size
from trainyard.client.studio import ClientError, Job, Studio, parse_hyperparameter

EXIT_JOB_NOT_COMPLETED = 1
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def fail(lines: list[str], code: int) -> NoReturn:
    for line in lines:
        err.print(f"[red]error:[/] {escape(line)}", highlight=False)
    sys.exit(code)


class TrainyardGroup(click.Group):
    """Turns the client's errors into a message and an exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            heading = f"the studio refused the request ({exc.status} {exc.code})"
            fail([heading, *exc.lines()] if exc.fields else [f"{heading}: {exc.message}"],
                 EXIT_REFUSED if exc.is_client_error else EXIT_JOB_NOT_COMPLETED)
        except StudioUnreachable as exc:
            fail([str(exc)], EXIT_UNREACHABLE)
        except (NotLoggedIn, ClientError, PackError, ValueError) as exc:
            fail([str(exc)], EXIT_REFUSED)


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--json`: print the API's JSON (passed to the command as `as_json`)."""
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")(command)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def studio_from(project: str | None = None) -> Studio:
    return Studio(project=project)


def note(text: str) -> None:
    err.print(text, highlight=False)


@click.group(cls=TrainyardGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainyard")
def cli() -> None:
    """Submit PyTorch training scripts to a Trainyard studio and follow them.

    The studio and token come from TRAINYARD_URL and TRAINYARD_TOKEN, else from
    `trainyard login URL`; TRAINYARD_PROJECT names the default project."""


# --- login ----------------------------------------------------------------------------------
@cli.command()
@click.argument("url")
@click.option("--token", help="An API token (ty_…); asked for when neither it nor --username is given.")
@click.option("--username", help="Sign in with this user's password instead; the studio issues a token.")
@click.option("--project", help="The default project for later commands.")
@json_option
def login(url: str, token: str | None, username: str | None, project: str | None, as_json: bool) -> None:
    """Store a token for the studio at URL (readable by you only)."""
    url = normalise_url(url)
    hidden = sys.stdin.isatty()
    if not token and not username:
        token = click.prompt("API token (press Enter to sign in with a username and password)", default="",
                             show_default=False, hide_input=hidden).strip()
        if not token:
            username = click.prompt("Username")
    if not token:
        password = click.prompt("Password", hide_input=hidden)
        anonymous = StudioHttp(url, None)
        issued = anonymous.post("/tokens/", {"name": f"trainyard CLI on {socket.gethostname()}"[:100]},
                                auth=(username or "", password))
        anonymous.close()
        token = str(issued["token"])
    http = StudioHttp(url, token)
    projects = list(http.pages("/projects/"))
    http.close()
    path = save_credentials(Credentials(url=url, token=token, project=project))
    if as_json:
        print_json({"url": url, "credentials": str(path), "projects": projects})
        return
    names = ", ".join(f"{p['slug']} ({p.get('role') or 'member'})" for p in projects) or "none yet"
    out.print(f"Logged in to {url}; projects: {names}. Token stored in {path}.", highlight=False)


# --- run --------------------------------------------------------------------------------------
def parse_inputs(values: tuple[str, ...]) -> dict[str, str]:
    inputs = {}
    for raw in values:
        channel, sep, dataset = raw.partition("=")
        if not sep or not channel or not dataset:
            raise ClientError(f"{raw!r}: write it as channel=dataset[:version], e.g. train=iris:2", field="inputs")
        inputs[channel] = dataset
    return inputs


def parse_distribution(raw: str) -> str | dict[str, Any]:
    """One of our words, or a SageMaker estimator's `distribution` object as JSON."""
    if not raw.lstrip().startswith("{"):
        return raw
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ClientError(f"not a JSON object: {exc}", field="distribution") from exc
    if not isinstance(value, dict):
        raise ClientError("give one of none, ddp, fsdp, pipeline, or a JSON object", field="distribution")
    return value


def parse_environment(values: tuple[str, ...]) -> dict[str, str]:
    environment = {}
    for raw in values:
        name, sep, value = raw.partition("=")
        if not sep or not name:
            raise ClientError(f"{raw!r}: write it as NAME=value", field="environment")
        environment[name] = value
    return environment


def parse_rules(values: tuple[str, ...]) -> list[Any] | None:
    """--rule: a rule as JSON ('{"type": "stalled", "parameters": {"threshold_seconds": 600}}'), a
    JSON list of them, a bare type (stalled: its defaults), or @FILE holding either. The
    studio checks each (a bad one is its 400 naming the field, rules[1].parameters.window)."""
    if not values:
        return None
    rules: list[Any] = []
    for raw in values:
        text, where = raw, "--rule"
        if raw.startswith("@"):
            where = raw[1:]
            try:
                text = Path(where).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ClientError(f"cannot read {where}: {exc}", field="rules") from exc
        stripped = text.strip()
        if stripped[:1] in ("{", "["):
            try:
                value = json.loads(stripped)
            except ValueError as exc:
                raise ClientError(f"{where}: not JSON: {exc}", field="rules") from exc
            rules.extend(value if isinstance(value, list) else [value])
        elif stripped and not raw.startswith("@") and all(c.isalnum() or c == "_" for c in stripped):
            rules.append({"type": stripped})
        else:
            raise ClientError(f"{raw!r}: give a rule as JSON, a JSON list, a rule type (stalled) or @FILE",
                              field="rules")
    return rules


def pipeline_settings(stages: int | None, microbatches: int | None, schedule: str | None,
                      partition: str | None) -> dict[str, Any] | None:
    """The job's `pipeline` object from the --stages … flags (None when none is given)."""
    settings: dict[str, Any] = {"stages": stages, "microbatches": microbatches, "schedule": schedule}
    if partition is not None:
        counts = [part.strip() for part in partition.split(",")]
        settings["partition"] = [int(c) for c in counts] if all(c.isdigit() for c in counts) else partition
    settings = {k: v for k, v in settings.items() if v is not None}
    return settings or None


@cli.command()
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--source-dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="The folder to send (default: the script's folder).")
@click.option("--project", help="The project (default: TRAINYARD_PROJECT, the login's, or your only one).")
@click.option("--name", help="The job's name (default: the script's name and the time).")
@click.option("--instance-type", default="cpu", show_default=True, help="resources.instance_type: the node queue.")
@click.option("--instance-count", type=int, default=1, show_default=True, help="resources.instance_count: nodes.")
@click.option("--processes-per-node", type=int, help="resources.processes_per_node.")
@click.option("--distribution", default="none", show_default=True, metavar="none|ddp|fsdp|pipeline|JSON",
              help="distribution: one of our words, or a SageMaker estimator's distribution object as JSON.")
@click.option("--stages", type=int, help="pipeline.stages (with --distribution pipeline).")
@click.option("--microbatches", type=int, help="pipeline.microbatches.")
@click.option("--schedule", type=click.Choice(("gpipe", "1f1b")), help="pipeline.schedule.")
@click.option("--partition", help="pipeline.partition: auto, even, or blocks per stage (3,2).")
@click.option("--hp", "hyperparameters", multiple=True, metavar="NAME=VALUE",
              help="A hyperparameter; the value is read as JSON when it is a number or boolean. Repeatable.")
@click.option("--input", "inputs", multiple=True, metavar="CHANNEL=DATASET[:VERSION]",
              help="A channel's data: a dataset's name (its newest ready version), name:version, or a version id.")
@click.option("--env", "environment", multiple=True, metavar="NAME=VALUE", help="environment: a variable for the script.")
@click.option("--tag", "tags", multiple=True, help="tags: a tag of the job. Repeatable.")
@click.option("--max-runtime", "max_runtime_seconds", type=int, help="stopping.max_runtime_seconds.")
@click.option("--retries", type=int, help="retries: attempts after a lost node.")
@click.option("--checkpoint-every", "checkpoint_every_steps", type=int, help="checkpoint.every_steps.")
@click.option("--keep-alive", "keep_alive_seconds", type=int, help="keep_alive_seconds: keep the nodes warm this long.")
@click.option("--rule", "rules", multiple=True, metavar="JSON|TYPE|@FILE",
              help='rules: a rule on the live metrics, e.g. \'{"type": "stalled", "parameters": {"threshold_seconds": 600}, '
                   '"actions": ["stop"]}\', a type with its defaults (overfit), or @rules.json. Repeatable; '
                   'non_finite is on unless one turns it off ({"type": "non_finite", "enabled": false}).')
@click.option("--max-file-size", type=float, default=DEFAULT_MAX_FILE_BYTES / 2**20, show_default=True,
              help="Leave out (and say so) source files larger than this many MiB.")
@click.option("--follow", "-f", is_flag=True, help="Show the job's progress until it ends; exit with its outcome.")
@json_option
def run(script: Path, source_dir: Path | None, project: str | None, name: str | None, instance_type: str,
        instance_count: int, processes_per_node: int | None, distribution: str, stages: int | None,
        microbatches: int | None, schedule: str | None, partition: str | None, hyperparameters: tuple[str, ...],
        inputs: tuple[str, ...], environment: tuple[str, ...], tags: tuple[str, ...], max_runtime_seconds: int | None,
        retries: int | None, checkpoint_every_steps: int | None, keep_alive_seconds: int | None,
        rules: tuple[str, ...], max_file_size: float, follow: bool, as_json: bool) -> None:
    """Pack SCRIPT's folder, upload it and submit SCRIPT as a training job."""
    hps = dict(parse_hyperparameter(raw) for raw in hyperparameters)
    fields: dict[str, Any] = {"environment": parse_environment(environment), "tags": list(tags)}
    if (pipeline := pipeline_settings(stages, microbatches, schedule, partition)) is not None:
        fields["pipeline"] = pipeline
    if max_runtime_seconds is not None:
        fields["stopping"] = {"max_runtime_seconds": max_runtime_seconds}
    if retries is not None:
        fields["retries"] = retries
    if checkpoint_every_steps is not None:
        fields["checkpoint"] = {"every_steps": checkpoint_every_steps}
    if (parsed_rules := parse_rules(rules)) is not None:
        fields["rules"] = parsed_rules
    studio = studio_from(project)
    job = studio.run(script, source_dir, name=name, instance_type=instance_type, instance_count=instance_count,
                     processes_per_node=processes_per_node, distribution=parse_distribution(distribution),
                     hyperparameters=hps, inputs=parse_inputs(inputs), keep_alive_seconds=keep_alive_seconds,
                     max_file_bytes=int(max_file_size * 2**20), **fields)
    if job.source is not None:
        packed = job.source.packed
        note(f"sent {len(packed.files)} file(s), {human_size(packed.total_bytes)}, from "
             f"{(source_dir or script.parent or Path('.'))}")
        for skipped in packed.skipped:
            note(f"[yellow]left out[/] {escape(skipped.path)}: {escape(skipped.reason)}")
    if not follow:
        if as_json:
            print_json(job.data)
        else:
            out.print(f"job {job.id} submitted ({job.status}): {studio.url}/jobs/{job.id}/", highlight=False)
        return
    follow_to_end(job, quiet=as_json)


def follow_to_end(job: Job, *, quiet: bool = False) -> NoReturn:
    """Follow until the job ends and exit with its outcome; Ctrl-C offers to stop it."""
    header = True
    while True:
        try:
            job = job.wait() if quiet else JobFollower(job, out).follow(header=header)
            break
        except KeyboardInterrupt:
            if sys.stdin.isatty() and click.confirm(f"\nStop job {job.id}?", default=False, err=True):
                job.stop()
                note(f"stopping job {job.id} …")
                header = False
                continue
            note(f"\njob {job.id} keeps running; `trainyard jobs logs -f {job.id}` follows it again.")
            sys.exit(EXIT_INTERRUPTED)
    if quiet:
        print_json(job.data)
    else:
        style = "green" if job.completed else "red"
        out.print(f"[{style}]{escape(summary(job))}[/]", highlight=False)
    sys.exit(0 if job.completed else EXIT_JOB_NOT_COMPLETED)


# --- jobs -------------------------------------------------------------------------------------
@cli.group()
def jobs() -> None:
    """List, read, follow and stop training jobs."""


def table(columns: list[str], rows: list[list[Any]]) -> Table:
    shown = Table(*columns, box=None, header_style="bold", pad_edge=False)
    for row in rows:
        shown.add_row(*("" if value is None else escape(str(value)) for value in row))
    return shown


@jobs.command("list")
@click.option("--project")
@click.option("--status", help="One or more statuses, comma-separated (Training,Pending).")
@click.option("--search", help="Part of the name.")
@json_option
def jobs_list(project: str | None, status: str | None, search: str | None, as_json: bool) -> None:
    """Your jobs, newest first."""
    rows = studio_from().jobs(project=project, status=status, search=search)
    if as_json:
        print_json(rows)
        return
    out.print(table(["id", "project", "name", "status", "created_at", "failure_reason"],
                    [[r["id"], r["project"], r["name"], r["status"], r["created_at"], (r.get("failure_reason") or "")[:80]]
                     for r in rows]))


@jobs.command("show")
@click.argument("job_id", type=int)
@json_option
def jobs_show(job_id: int, as_json: bool) -> None:
    """One job with its timeline."""
    job = studio_from().job(job_id)
    if as_json:
        print_json(job.data)
        return
    data = job.data
    resources = data.get("resources") or {}
    facts = [("name", data["name"]), ("project", data["project"]), ("status", data["status"]),
             ("script", (data.get("script") or {}).get("entry_point") or data.get("algorithm")),
             ("distribution", data.get("distribution")),
             ("resources", ", ".join(f"{k}={v}" for k, v in resources.items() if v is not None)),
             ("hyperparameters", json.dumps(data.get("hyperparameters") or {})),
             ("failure_reason", data.get("failure_reason")), ("stop_reason", data.get("stop_reason")),
             ("stop_rule", data.get("stop_rule")),
             ("waiting_reason", data.get("waiting_reason")), ("final_metrics", json.dumps(data.get("final_metrics") or {})),
             ("tags", ", ".join(str(tag) for tag in data.get("tags") or [])),
             ("model_uri", data.get("model_uri")), ("cost", cost_text(data)),
             ("billable_time_seconds", data.get("billable_time_seconds")),
             ("training_time_seconds", data.get("training_time_seconds"))]
    out.print(table(["job", str(job.id)], [[k, v] for k, v in facts if v not in (None, "")]))
    out.print(table(["at", "status", "message"], [[moment(e["at"]), e["status"], e["message"]] for e in data.get("timeline") or []]))
    if data.get("rules"):
        out.print(table(["rule", "type", "state", "reason"],
                        [[r["name"], r["type"], r["state"] if r.get("enabled", True) else "off", r.get("state_reason")]
                         for r in data["rules"]]))


def job_label(job: Any) -> str:
    return f"{job.get('id')} {job.get('name', '')} ({job.get('status', '')})" if isinstance(job, dict) else str(job or "")


def money(amount: Any) -> str:
    """A cost as the pages show it, to the cent ("0.354167" → "0.35"); what is not a number as is."""
    try:
        return str(Decimal(str(amount)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
    except (InvalidOperation, ValueError):
        return str(amount)


def cost_text(data: dict[str, Any]) -> str | None:
    """"0.35 USD", with the projection while it runs ("0.35 USD, projected 2.10")."""
    cost = data.get("cost")
    if cost in (None, ""):
        return None
    text = f"{money(cost)} {data.get('currency') or ''}".strip()
    projected = data.get("projected_cost")
    return text + (f", projected {money(projected)}" if projected not in (None, "") else "")


def moment(text: Any) -> str | None:
    """An API time ("2026-12-05T12:30:01.123456Z") to the second, in UTC, as a column can
    hold it ("2026-12-05 12:30:01 UTC"); what does not parse as is."""
    if not text:
        return None
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return str(text)
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if at.tzinfo is not None else "")


@cli.command()
@click.option("--project", help="Only this project's.")
@click.option("--state", help="OK, ALARM or INSUFFICIENT_DATA (default: ALARM).")
@click.option("--finished", is_flag=True, help="Include finished jobs' rules.")
@json_option
def alarms(project: str | None, state: str | None, finished: bool, as_json: bool) -> None:
    """The rules firing (in ALARM) on running jobs in the projects you can read."""
    rows = studio_from().alarms(project=project, state=state, finished="true" if finished else None)
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no rule is " + (state or "ALARM") + (" on a running job" if not finished else ""), highlight=False)
        return
    out.print(table(["job", "rule", "type", "state", "since", "reason"],
                    [[job_label(r.get("job")), r["name"], r["type"], r["state"], moment(r.get("state_changed_at")),
                      r.get("state_reason")]
                     for r in rows]))


@jobs.command("logs")
@click.argument("job_id", type=int)
@click.option("--rank", default="0", show_default=True, help="A rank number, -1 for the launcher.")
@click.option("--tail", type=int, help="Only the last N lines.")
@click.option("--follow", "-f", is_flag=True, help="Then follow the job's log until it ends (every rank).")
@json_option
def jobs_logs(job_id: int, rank: str, tail: int | None, follow: bool, as_json: bool) -> None:
    """A job's log lines."""
    studio = studio_from()
    job = studio.job(job_id)
    if as_json and not follow:
        print_json(studio.http.get(f"/jobs/{job_id}/logs/", rank=rank, tail=tail))
        return
    for line in job.logs(rank=rank, tail=tail if tail is not None else (50 if follow else None)):
        click.echo(line)
    if follow and not job.finished:
        try:
            for event in job.events():
                if event.kind == "log" and isinstance(event.data, dict):
                    click.echo(str(event.data.get("line", "")).rstrip("\n"))
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)


@jobs.command("metrics")
@click.argument("job_id", type=int)
@click.option("--name", help="One series' points (downsampled) instead of the list of series.")
@click.option("--rank", default="0", show_default=True)
@click.option("--points", type=int, help="At most this many points.")
@json_option
def jobs_metrics(job_id: int, name: str | None, rank: str, points: int | None, as_json: bool) -> None:
    """A job's metric series, or one series' points."""
    job = studio_from().job(job_id)
    data = job.metrics(name, rank=rank, points=points) if name else job.metrics()
    if as_json:
        print_json(data)
        return
    if name:
        out.print(table(["step", name], [[p[0], p[1]] for p in data.get("points") or []]))
        return
    out.print(table(["name", "rank", "count", "first_step", "last_step", "last_value"],
                    [[s["name"], s["rank"], s["count"], s["first_step"], s["last_step"], s["last_value"]]
                     for s in data.get("series") or []]))


@jobs.command("stop")
@click.argument("job_id", type=int)
@json_option
def jobs_stop(job_id: int, as_json: bool) -> None:
    """Ask a job to stop (its processes get SIGTERM, then SIGKILL after the grace period)."""
    job = studio_from().job(job_id).stop()
    if as_json:
        print_json(job.data)
    else:
        out.print(f"job {job.id}: {job.status}", highlight=False)


# --- datasets ---------------------------------------------------------------------------------
LAUNCH_COLUMNS = ("job_id", "job_name", "user", "instance_type", "attempt", "node_rank", "started_at", "finished_at",
                  "billable_seconds", "training_seconds", "warm_seconds", "price_per_hour", "currency", "cost")


@cli.command()
@click.option("--project", help="The project (default: TRAINYARD_PROJECT, the login's, or your only one).")
@click.option("--month", help="YYYY-MM (UTC; default: this month).")
@click.option("--launches", is_flag=True, help="Its line items, one per launch, instead of the totals.")
@click.option("--csv", "as_csv", is_flag=True, help="The line items as CSV on stdout (as the Spend page downloads).")
@json_option
def spend(project: str | None, month: str | None, launches: bool, as_csv: bool, as_json: bool) -> None:
    """What a project's launches that started in a month cost: by instance type and by user."""
    studio = studio_from(project)
    if launches or as_csv:
        rows = studio.spend_launches(month, project=project)
        if as_json:
            print_json(rows)
        elif as_csv:
            writer = csv.writer(sys.stdout)
            writer.writerow(LAUNCH_COLUMNS)
            writer.writerows([["" if row.get(column) is None else row.get(column) for column in LAUNCH_COLUMNS]
                              for row in rows])
        else:
            out.print(table(["job", "user", "type", "attempt", "node", "started", "billable", "warm", "price/h", "cost"],
                            [[f"{r['job_id']} {r['job_name']}", r["user"], r["instance_type"], r["attempt"], r["node_rank"],
                              moment(r["started_at"]), f"{r['billable_seconds']:g} s", f"{r['warm_seconds']:g} s",
                              r["price_per_hour"], f"{money(r['cost'])} {r['currency']}"] for r in rows]))
        return
    data = studio.spend(month, project=project)
    if as_json:
        print_json(data)
        return
    currency, total = data["currency"], data["total"]
    out.print(f"{data['month']}: {money(total['cost'])} {currency} over {total['jobs']} job(s), {total['launches']} "
              f"launch(es), {total['node_hours']} node-hours", highlight=False)
    for title, key, rows in (("instance type", "instance_type", data["by_instance_type"]),
                             ("user", "user", data["by_user"])):
        if rows:
            out.print(table([title, "jobs", "launches", "node-hours", f"cost ({currency})"],
                            [[r[key], r["jobs"], r["launches"], r["node_hours"], money(r["cost"])] for r in rows]))


@cli.group()
def datasets() -> None:
    """Upload and list datasets."""


@datasets.command("upload")
@click.argument("name")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--project")
@click.option("--description")
@click.option("--format", "format_", help="format: csv, jsonl, image_folder or text (default: detected).")
@click.option("--label-column")
@click.option("--text-column")
@click.option("--delimiter")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the version is validated.")
@json_option
def datasets_upload(name: str, paths: tuple[Path, ...], project: str | None, description: str | None, format_: str | None,
                    label_column: str | None, text_column: str | None, delimiter: str | None, wait: bool,
                    as_json: bool) -> None:
    """Upload files or folders as a new version of dataset NAME."""
    studio = studio_from(project)
    version = studio.upload_dataset(name, list(paths), description=description, format=format_, label_column=label_column,
                                    text_column=text_column, delimiter=delimiter)
    if wait and version.get("status") == "validating":
        version = {**version, **studio.wait_version(version["id"])}
    if as_json:
        print_json(version)
    else:
        unchanged = " (unchanged: the same content as an existing version)" if version.get("unchanged") else ""
        out.print(f"dataset {version['name']} version {version['version']} (id {version['id']}): {version['status']}, "
                  f"{version.get('num_records')} records{unchanged}", highlight=False)
        for problem in version.get("errors") or []:
            out.print(f"  {escape(str(problem))}", highlight=False)
    if version.get("status") == "invalid":
        sys.exit(EXIT_JOB_NOT_COMPLETED)


@datasets.command("list")
@click.option("--project")
@click.option("--search")
@json_option
def datasets_list(project: str | None, search: str | None, as_json: bool) -> None:
    """Datasets with their newest version."""
    rows = studio_from().datasets(project=project, search=search)
    if as_json:
        print_json(rows)
        return
    out.print(table(["id", "project", "name", "version", "version_id", "status", "num_records"],
                    [[r["id"], r["project"], r["name"], *((v["version"], v["id"], v["status"], v["num_records"])
                                                          if (v := r.get("latest_version")) else ("", "", "", ""))]
                     for r in rows]))


# --- tuning -----------------------------------------------------------------------------------
@cli.group()
def tune() -> None:
    """Hyperparameter searches whose trials are training jobs."""


@tune.command("create")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="A JSON file of the tuning job as POST /api/v1/tuning-jobs/ takes it.")
@click.option("--project")
@click.option("--name")
@click.option("--max-trials", type=int)
@click.option("--max-parallel", type=int)
@click.option("--strategy")
@click.option("--entry-point", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Upload this script (and its folder, or --source-dir) as base_job.script.")
@click.option("--source-dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@json_option
def tune_create(spec_path: Path, project: str | None, name: str | None, max_trials: int | None, max_parallel: int | None,
                strategy: str | None, entry_point: Path | None, source_dir: Path | None, as_json: bool) -> None:
    """Start a tuning job from a JSON spec; flags replace the spec's fields of the same name."""
    try:
        spec = json.loads(spec_path.read_text())
    except ValueError as exc:
        raise ClientError(f"{spec_path} is not JSON: {exc}", field="spec") from exc
    if not isinstance(spec, dict):
        raise ClientError(f"{spec_path} must hold a JSON object", field="spec")
    studio = studio_from(project)
    overrides = {"project": project, "name": name, "max_trials": max_trials, "max_parallel": max_parallel,
                 "strategy": strategy}
    spec.update({k: v for k, v in overrides.items() if v is not None})
    if entry_point is not None:
        uploaded = studio.upload_source(entry_point, source_dir, project=spec.get("project"))
        spec["base_job"] = {**(spec.get("base_job") or {}), "script": {"uri": uploaded.uri, "entry_point": uploaded.entry_point}}
        spec["base_job"].pop("algorithm", None)
    created = studio.tune(spec)
    if as_json:
        print_json(created)
    else:
        out.print(f"tuning job {created['id']} ({escape(str(created.get('name')))}): {created.get('status')}: "
                  f"{studio.url}/tuning/{created['id']}/", highlight=False)


@tune.command("list")
@click.option("--project")
@click.option("--status")
@json_option
def tune_list(project: str | None, status: str | None, as_json: bool) -> None:
    """Tuning jobs, newest first."""
    rows = studio_from().tuning_jobs(project=project, status=status)
    if as_json:
        print_json(rows)
        return
    out.print(table(["id", "project", "name", "status", "strategy", "max_trials", "created_at"],
                    [[r.get("id"), r.get("project"), r.get("name"), r.get("status"), r.get("strategy"), r.get("max_trials"),
                      r.get("created_at")] for r in rows]))


@tune.command("show")
@click.argument("tuning_job_id", type=int)
@json_option
def tune_show(tuning_job_id: int, as_json: bool) -> None:
    """A tuning job and its trials."""
    data = studio_from().tuning_job(tuning_job_id)
    if as_json:
        print_json(data)
        return
    out.print(f"tuning job {data['id']} ({escape(str(data.get('name')))}): {data.get('status')}", highlight=False)
    out.print(table(["trial", "job", "status", "objective_value", "trial_params"],
                    [[t.get("trial_number"), t.get("id"), t.get("status"), t.get("objective_value"),
                      json.dumps(t.get("trial_params") or {})] for t in data.get("trials") or []]))


@tune.command("stop")
@click.argument("tuning_job_id", type=int)
@json_option
def tune_stop(tuning_job_id: int, as_json: bool) -> None:
    """Stop a tuning job and its running trials."""
    data = studio_from().stop_tuning_job(tuning_job_id)
    if as_json:
        print_json(data)
    else:
        out.print(f"tuning job {data['id']}: {data.get('status')}", highlight=False)


def main() -> None:
    cli(prog_name="trainyard")


if __name__ == "__main__":
    main()
