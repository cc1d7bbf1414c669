"""`python manage.py studio <subcommand>`: run the studio and manage it from a shell.

    up        everything on one machine: migrate, demo admin and data, Redis, web, nodes,
              control worker (what `make run` calls)
    worker    one node worker (run one per machine, or several per machine with --name)
    control   the control worker with the beat scheduler
    flusher   write metric points from Redis to the database (long-running)
    demo      load the demo datasets into project `demo`
    adduser   create or update a user with a role in a project
    token     print a new API token for a user (only the token, for scripts)
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections, connections

from studio import actions
from studio.models import Project, Role, slug_validator
from studio.supervisor import ChildSpec, Supervisor

if TYPE_CHECKING:
    from django.contrib.auth.models import User

DEMO_PROJECT = "demo"
DEMO_ADMIN = "admin"
HEALTH_TIMEOUT_SECONDS = 120
STOP_GRACE_SECONDS = 15
# A child that dies once the studio runs is restarted after a pause, a few times at most.
RESTART_DELAY_SECONDS = 2
RESTARTS_PER_CHILD = 5
RESTART_WINDOW_SECONDS = 300


class Command(BaseCommand):
    help = "Run Trainyard (up, worker, control, flusher) and manage it (demo, adduser, token)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{up,worker,control,flusher,demo,adduser,token}")

        up = sub.add_parser("up", help="Start the whole studio on this machine; Ctrl-C stops it.")
        up.add_argument("--host", default="127.0.0.1", help="Address the web server binds (default 127.0.0.1).")
        up.add_argument("--port", type=int, default=8000, help="Web server port (default 8000).")
        up.add_argument("--nodes", type=int, default=1, help="Number of local node workers (default 1).")

        worker = sub.add_parser("worker", help="Run a node worker: registers a node and runs its jobs.")
        worker.add_argument("--queue", default="cpu", help="Instance type this node serves: cpu or gpu (default cpu).")
        worker.add_argument("--name", default="", help="Node name, stable across restarts (default: the host name).")
        worker.add_argument("--loglevel", default="INFO")

        control = sub.add_parser("control", help="Run the control worker with the beat scheduler.")
        control.add_argument("--loglevel", default="INFO")

        flusher = sub.add_parser("flusher", help="Write metric points and system samples from Redis to the database.")
        flusher.add_argument("--block-ms", type=int, default=500, help="Longest wait for new points per read (default 500).")
        flusher.add_argument("--no-rules", dest="rules", action="store_false",
                             help="Do not run the rule watcher beside the flusher (run it in another flusher).")

        demo = sub.add_parser("demo", help="Load the demo datasets (idempotent).")
        demo.add_argument("--project", default=DEMO_PROJECT, help="Project slug (default demo; created if missing).")

        adduser = sub.add_parser("adduser", help="Create or update a user and give them a role in a project.")
        adduser.add_argument("username")
        adduser.add_argument("--password", default=None, help="New password (a new user without one gets a random one).")
        adduser.add_argument("--project", required=True, help="Project slug (created if missing).")
        adduser.add_argument("--role", required=True, choices=list(Role.values), help="Role in the project.")

        token = sub.add_parser("token", help="Issue an API token; prints only the token.")
        token.add_argument("username")
        token.add_argument("--name", default="cli", help="A label to tell tokens apart (default cli).")

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options["subcommand"]
        if subcommand == "up":
            code = self.up(host=options["host"], port=options["port"], nodes=options["nodes"])
            if code:
                sys.exit(code)
        elif subcommand == "worker":
            self.worker(queue=options["queue"], name=options["name"] or socket.gethostname(), loglevel=options["loglevel"])
        elif subcommand == "control":
            self.control(loglevel=options["loglevel"])
        elif subcommand == "flusher":
            self.flusher(block_ms=options["block_ms"], rules=options["rules"])
        elif subcommand == "demo":
            self.demo(project_slug=options["project"])
        elif subcommand == "adduser":
            self.adduser(options["username"], password=options["password"], project_slug=options["project"],
                         role=options["role"])
        elif subcommand == "token":
            self.token(options["username"], name=options["name"])

    # --- up ------------------------------------------------------------------------------
    def up(self, *, host: str, port: int, nodes: int) -> int:
        """1. Refuse early if the port is taken (before minutes of start-up are wasted).
        2. Migrate, make sure a demo admin exists, start Redis, load the demo data.
        3. Start web, nodes, control and the metrics flusher; wait for /api/v1/health; print the banner.
        4. On Ctrl-C or SIGTERM stop everything; if a child dies, say which and stop."""
        from studio.embedded_redis import EmbeddedRedis

        if nodes < 0:
            raise CommandError("--nodes must be 0 or more.")
        _check_port_free(host, port)
        data_dir = Path(settings.DATA_DIR)
        data_dir.mkdir(parents=True, exist_ok=True)
        redis: EmbeddedRedis | None = None
        supervisor = Supervisor(out=self.stdout, grace=STOP_GRACE_SECONDS)
        stop = threading.Event()
        previous_handlers: dict[signal.Signals, Any] = {}
        try:
            self.stdout.write(f"Data directory: {data_dir}")
            self.stdout.write("Migrating the database …")
            call_command("migrate", interactive=False, verbosity=0)
            if not settings.DEBUG:
                from studio.staticfiles import collect_static

                self.stdout.write("Collecting static files (hashed, gzip and brotli; the first time takes a while) …")
                collect_static()
            admin = self._ensure_demo_admin()

            redis_url = os.environ.get("REDIS_URL", "")
            if not redis_url:
                # Durable: a restarted studio finds its queues, metric streams and consumer groups.
                redis = EmbeddedRedis(data_dir=data_dir / "redis", durable="everysec")
                redis_url = redis.start()
                if redis.process is not None:
                    supervisor.reaper.watch(redis.process.pid, "redis")
                self.stdout.write(f"Started the embedded Redis at {redis_url}")
            _use_broker(redis_url)

            project = Project.objects.filter(slug=DEMO_PROJECT).first()
            if project is not None and not project.datasets.exists():
                self.stdout.write("Loading the demo datasets (validated before the server starts) …")
                self._load_demo(project, admin)

            env = {**os.environ, "REDIS_URL": redis_url, "STUDIO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1",
                   "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "studio.settings")}
            specs = _child_specs(host=host, port=port, nodes=nodes, env=env)

            # From here on a signal asks for an orderly stop instead of interrupting
            # whatever line of start-up happens to run.
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous_handlers[signum] = signal.signal(signum, lambda *_: stop.set())
            # The supervisor needs the database no more; children open their own.
            connections.close_all()
            supervisor.start(specs)

            health_url = f"http://{_connect_host(host)}:{port}/api/v1/health"
            outcome = supervisor.watch(stop, until=lambda: _answers(health_url), timeout=HEALTH_TIMEOUT_SECONDS)
            if outcome == "ready":
                self._banner(supervisor, host=host, port=port, data_dir=data_dir, admin=admin, redis_url=redis_url,
                             embedded=redis is not None, nodes=nodes)
                outcome = self._keep_running(supervisor, stop)
            return self._shut_down(supervisor, outcome, health_url)
        except KeyboardInterrupt:
            # Ctrl-C before any child existed: nothing to stop but Redis (finally).
            self.stdout.write("\nInterrupted during start-up.")
            return 0
        finally:
            if supervisor.children and any(child.group_alive() for child in supervisor.children):
                supervisor.stop(grace=STOP_GRACE_SECONDS)
            if redis is not None:
                redis.stop()
            supervisor.reaper.release()
            for restored, handler in previous_handlers.items():
                signal.signal(restored, handler)

    def _keep_running(self, supervisor: Supervisor, stop: threading.Event) -> str:
        """Once the studio is up, a child that dies is started again (a killed node
        worker is a machine that rebooted: its job retries elsewhere, docs/SPEC.md §3.6), at most
        RESTARTS_PER_CHILD times in RESTART_WINDOW_SECONDS; then the studio stops."""
        recent: dict[str, list[float]] = {}
        while True:
            outcome = supervisor.watch(stop)
            if outcome != "exited":
                return outcome
            dead = supervisor.exited()
            assert dead is not None
            now = time.monotonic()
            times = [t for t in recent.get(dead.name, []) if now - t < RESTART_WINDOW_SECONDS]
            if len(times) >= RESTARTS_PER_CHILD:
                supervisor.say(f"\n{dead.name} exited {len(times) + 1} times within {RESTART_WINDOW_SECONDS} s; "
                               "not restarting it again.")
                return outcome
            recent[dead.name] = [*times, now]
            supervisor.say(f"\n{dead.name} exited unexpectedly with code {dead.process.returncode}; restarting it in "
                           f"{RESTART_DELAY_SECONDS} s (its output is above).")
            if stop.wait(RESTART_DELAY_SECONDS):
                return "stop"
            supervisor.restart(dead)

    def _shut_down(self, supervisor: Supervisor, outcome: str, health_url: str) -> int:
        code = 0
        if outcome == "exited":
            dead = supervisor.exited()
            assert dead is not None  # "exited" means watch() saw one
            supervisor.say(f"\n{dead.name} exited unexpectedly with code {dead.process.returncode}; "
                           "stopping the studio (its output is above).")
            code = 1
        elif outcome == "timeout":
            supervisor.say(f"\n{health_url} did not answer within {HEALTH_TIMEOUT_SECONDS} s; stopping the studio.")
            code = 1
        else:
            supervisor.say("\nStopping the studio …")
        killed = supervisor.stop(grace=STOP_GRACE_SECONDS)
        if killed:
            supervisor.say(f"Killed after {STOP_GRACE_SECONDS} s without stopping: {', '.join(killed)}.")
        supervisor.say("Stopped." if code == 0 else "Stopped after a failure.")
        return code

    def _ensure_demo_admin(self):
        """The first start creates `admin` (a superuser) and project `demo`, and prints the
        password once; it is stored only hashed, so it can never be shown again."""
        User = get_user_model()
        superuser = User.objects.filter(is_superuser=True).order_by("pk").first()
        if superuser is not None:
            self.stdout.write(f"Admin account {superuser.username!r} exists. Forgot its password? "
                              f"python manage.py changepassword {superuser.username}")
            if not Project.objects.filter(slug=DEMO_PROJECT).exists():
                actions.create_project(slug=DEMO_PROJECT, name="Demo", owner=superuser)
            return superuser
        if User.objects.filter(username=DEMO_ADMIN).exists():
            # Someone made a non-superuser called admin (studio adduser); promoting it and
            # replacing its password behind their back would be a surprise.
            self.stdout.write(self.style.WARNING(
                f"User {DEMO_ADMIN!r} exists but is not a superuser; no demo admin was created. "
                "Create one with: python manage.py createsuperuser"))
            return None
        password = secrets.token_urlsafe(12)
        admin = actions.ensure_user(DEMO_ADMIN, password=password, superuser=True)
        project = Project.objects.filter(slug=DEMO_PROJECT).first() or actions.create_project(slug=DEMO_PROJECT, name="Demo")
        actions.set_membership(project=project, user=admin, role=Role.ADMIN)
        self.stdout.write(self.style.SUCCESS("Created the demo admin account. The password is shown only this once:"))
        self.stdout.write(f"    username: {DEMO_ADMIN}\n    password: {password}")
        return admin

    def _load_demo(self, project: Project, user: User | None) -> None:
        from datasets.demo import load_demo_data

        for version in load_demo_data(project, user):
            counts = ", ".join(f"{k} {v}" for k, v in (version.channel_counts or {}).items())
            self.stdout.write(f"  {version.dataset.name} v{version.version}: {version.status}"
                              f"{f' ({counts})' if counts else ''}")
            for error in version.errors[:5]:
                self.stdout.write(self.style.ERROR(f"    {error.get('file') or ''}: {error.get('message')}"))

    def _banner(self, supervisor: Supervisor, *, host: str, port: int, data_dir: Path, admin, redis_url: str, embedded: bool,
                nodes: int) -> None:
        login = (f"{admin.username} (its password was printed when the account was created; "
                 f"reset it with: python manage.py changepassword {admin.username})") if admin else "no superuser yet"
        lines = [
            "",
            "=" * 72,
            f"  Trainyard is running at http://{host}:{port}/",
            f"  Log in as:  {login}",
            f"  API:        http://{host}:{port}/api/v1/  (docs at /api/docs/)",
            f"  Data:       {data_dir}",
            f"  Redis:      {redis_url}{' (embedded)' if embedded else ''}",
            f"  Nodes:      {', '.join(f'node-{i}' for i in range(1, nodes + 1)) or 'none'}",
            "  Ctrl-C to stop.",
            "=" * 72,
            "",
        ]
        supervisor.say("\n".join(lines))

    # --- workers -------------------------------------------------------------------------
    def worker(self, *, queue: str, name: str, loglevel: str) -> None:
        """Register the node, heartbeat from a thread, consume only the node's own queue.
        The solo pool runs tasks in this process, next to the heartbeat thread: one process
        is one node, and a SIGTERM reaches the code that owns the node's job processes."""
        from jobs.nodes import HeartbeatThread, mark_stopped, register_node
        from studio.celery import app

        _refuse_duplicate_node(name)
        # Until Celery installs its own handler (warm shutdown), a SIGTERM must still run
        # the `finally` below, or the node would look alive until the lost-node sweep.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        beats = HeartbeatThread(name)
        try:
            node = register_node(name=name, instance_type=queue)
            self.stderr.write(f"node {node.name}: {node.cpus} CPUs, {node.memory_bytes / 2**30:.1f} GiB, "
                              f"{node.gpus} GPUs; queue {node.queue}")
            beats.start()
            app.start(["worker", "-Q", node.queue, "-c", "1", "--pool", "solo", "-n", f"{_celery_name(name)}@%h",
                       "-l", loglevel, "--without-gossip", "--without-mingle"])
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
            beats.stop()
            from jobs.runner import warm

            warm.close()
            close_old_connections()
            mark_stopped(name)
            self.stderr.write(f"node {name}: stopped")

    def control(self, *, loglevel: str) -> None:
        from studio.celery import app

        # One beat per studio. Its schedule file lives with the studio's data, so two
        # studios on one machine (different STUDIO_DATA_DIR) keep separate schedules.
        schedule = Path(settings.DATA_DIR) / "celerybeat-schedule"
        app.start(["worker", "-Q", settings.STUDIO_CONTROL_QUEUE, "-c", "2", "-B", "-s", str(schedule),
                   "-n", "control@%h", "-l", loglevel, "--without-gossip", "--without-mingle"])

    def flusher(self, *, block_ms: int, rules: bool = True) -> None:
        """Until SIGTERM or Ctrl-C: read the jobs' metric streams, write them in batches;
        beside it, on a thread, the rule watcher evaluates the jobs' rules on the same
        streams (jobs.rules.watcher). The signal only sets a flag; the loop drains what is
        waiting, then returns."""
        from jobs.metrics.ingest import install_stop_handlers, run_flusher
        from jobs.rules.watcher import start_watcher_thread

        stop = threading.Event()
        install_stop_handlers(stop)
        watcher = start_watcher_thread(stop) if rules else None
        self.stderr.write("flusher: started" + (" (with the rule watcher)" if rules else ""))
        flusher = run_flusher(stop, block_ms=block_ms)
        if watcher is not None:
            watcher.join(10)
        self.stderr.write(f"flusher: stopped ({flusher.written:,} points and samples written, "
                          f"{flusher.dropped:,} dropped for deleted jobs)")

    # --- administration ------------------------------------------------------------------
    def demo(self, *, project_slug: str) -> None:
        """Load the demo datasets. Registration enqueues a validation task on commit, so a
        broker must answer: without REDIS_URL a temporary embedded Redis serves (the task it
        receives is redundant; validation here is synchronous)."""
        from studio.embedded_redis import EmbeddedRedis

        project = _project(project_slug)
        user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
        redis = None
        if not os.environ.get("REDIS_URL"):
            redis = EmbeddedRedis()
            _use_broker(redis.start())
        try:
            self._load_demo(project, user)
        finally:
            if redis is not None:
                redis.stop()

    def adduser(self, username: str, *, password: str | None, project_slug: str, role: str) -> None:
        User = get_user_model()
        existing = User.objects.filter(username=username).first()
        generated = None
        if password is None and existing is None:
            password = generated = secrets.token_urlsafe(12)
        if password is not None:
            try:
                validate_password(password, user=existing)
            except ValidationError as exc:
                raise CommandError("Password refused: " + " ".join(exc.messages)) from exc
        project_created = not Project.objects.filter(slug=project_slug).exists()
        project = _project(project_slug)
        user = actions.ensure_user(username, password=password)
        actions.set_membership(project=project, user=user, role=role)
        self.stdout.write(f"{'Created' if existing is None else 'Updated'} user {username!r}: {role} in project "
                          f"{project.slug!r}{' (new project)' if project_created else ''}.")
        if generated:
            self.stdout.write(f"Password (shown only this once): {generated}")

    def token(self, username: str, *, name: str) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}. Create one with: python manage.py studio adduser {username} "
                               "--project SLUG --role scientist")
        _, raw = actions.issue_token(user, name=name)
        # Only the token on stdout, so `TOKEN=$(python manage.py studio token me)` works.
        self.stdout.write(raw)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _project(slug: str) -> Project:
    try:
        slug_validator(slug)
    except ValidationError as exc:
        raise CommandError(f"Bad project slug {slug!r}: {' '.join(exc.messages)}") from exc
    return Project.objects.filter(slug=slug).first() or actions.create_project(slug=slug)


def _child_specs(*, host: str, port: int, nodes: int, env: dict[str, str]) -> list[ChildSpec]:
    manage = str(Path(settings.BASE_DIR) / "manage.py")
    cwd = Path(settings.BASE_DIR)
    # gthread: a server-sent-event stream holds one thread, not a whole worker process
    # (sync workers would be exhausted by a few open charts).
    web = [sys.executable, "-m", "gunicorn", "studio.wsgi:application", "-k", "gthread", "--workers", "2",
           "--threads", "8", "--bind", f"{host}:{port}", "--timeout", "120", "--graceful-timeout", "10",
           # The control socket defaults to one path per user: two studios would fight over it.
           "--no-control-socket"]
    specs = [ChildSpec(name="web", argv=web, env=env, cwd=cwd)]
    for index in range(1, nodes + 1):
        argv = [sys.executable, manage, "studio", "worker", "--queue", "cpu", "--name", f"node-{index}"]
        specs.append(ChildSpec(name=f"node-{index}", argv=argv, env=env, cwd=cwd))
    specs.append(ChildSpec(name="control", argv=[sys.executable, manage, "studio", "control"], env=env, cwd=cwd))
    specs.append(ChildSpec(name="flusher", argv=[sys.executable, manage, "studio", "flusher"], env=env, cwd=cwd))
    return specs


def _use_broker(url: str) -> None:
    """Point this process's Celery producer at `url` (settings were read before the
    embedded Redis existed), so actions that enqueue on commit reach a live broker."""
    from studio.celery import app

    os.environ["REDIS_URL"] = url
    settings.REDIS_URL = url
    settings.CELERY_BROKER_URL = url
    app.conf.broker_url = url


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CommandError(f"Cannot listen on {host}:{port} ({exc.strerror}). Is another studio running? "
                               "Pick another port with --port.") from exc


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _celery_name(name: str) -> str:
    # Celery splits node names at '@'; keep the node's name readable in `celery inspect`.
    return name.replace("@", "-")


def _refuse_duplicate_node(name: str) -> None:
    """Two processes heartbeating one node row would hide each other's death. A row whose
    process is still alive on this host, with a fresh heartbeat, means a duplicate."""
    import psutil

    from jobs.models import Node, NodeState

    node = Node.objects.filter(name=name).first()
    if node is None or node.state in (NodeState.STOPPED, NodeState.LOST) or node.pid in (None, os.getpid()):
        return
    fresh = node.seconds_since_heartbeat() < settings.STUDIO_NODE_LOST_SECONDS
    if fresh and node.hostname == socket.gethostname() and psutil.pid_exists(node.pid):
        raise CommandError(f"Node {name!r} is already running here (pid {node.pid}). Stop it first, or give this worker "
                           "another name with --name.")
