"""Human review claims on PostgreSQL, each figure beside a baseline measured in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/review.py

1. claim+answer through review.actions by 32 concurrent reviewer processes (each its own
   database connection) against a backlog of loops with task_count 2: p50/p99 latency of
   one claim+answer, and answers/s — paced (each reviewer starts one claim+answer every
   --pace seconds, as people do, and 4× as often) and flat out (the machine's capacity,
   where latency is queueing: 32 processes share the CPUs); baseline: 1 reviewer process.
2. Claim latency (p50/p99) with a backlog of 100,000 InProgress loops, claims and
   releases repeated by reviewers in turn; baseline: the same with a backlog of 1,000.
   The candidate query's plan is printed to show it walks the partial index.
3. claim+answer over HTTP: 32 reviewer processes, each POSTing a claim and then its answer
   with a bearer token to gunicorn (what `studio up` runs), paced as in 1.

The bench creates its own database (trainyard_bench_review) on the server DATABASE_URL
names and drops it at the end. Without a PostgreSQL DATABASE_URL it says so and exits:
SKIP LOCKED claims are what it measures. --quick runs smaller numbers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "trainyard_bench_review"
REVIEWERS = 32
LABELS = ["cat", "dog", "bird"]
BENCH_QUEUE = "bench-review-outputs"


def pct(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def row(label: str, figure: str, baseline: str = "", note: str = "") -> None:
    print(f"  {label:<46} {figure:<30} {baseline:<30} {note}")


# --- the database ----------------------------------------------------------------------------
def admin_url(base: str) -> str:
    return urlparse(base)._replace(path="/postgres").geturl()


def create_database(base: str) -> str:
    import psycopg

    with psycopg.connect(admin_url(base), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    return urlparse(base)._replace(path=f"/{DB_NAME}").geturl()


def drop_database(base: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(admin_url(base), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")  # settings need one; review claims do not
    # Completed loops enqueue their output write; nothing consumes them here, and the bench
    # deletes this queue when it ends (never a studio's real control queue).
    os.environ["STUDIO_CONTROL_QUEUE"] = BENCH_QUEUE
    import django

    django.setup()


# --- fixtures --------------------------------------------------------------------------------
def make_reviewers(n: int):
    from studio import actions as studio_actions
    from studio.models import Project, Role

    project = Project.objects.filter(slug="bench").first() or studio_actions.create_project(slug="bench", name="Bench")
    owner = studio_actions.ensure_user("bench-owner", password="pw-bench-owner-123")
    studio_actions.set_membership(project=project, user=owner, role=Role.ADMIN)
    users = []
    for index in range(n):
        user = studio_actions.ensure_user(f"bench-reviewer-{index}", password="pw-bench-reviewer-123")
        studio_actions.set_membership(project=project, user=user, role=Role.REVIEWER)
        users.append(user)
    return project, owner, users


def make_flow(name: str, task_count: int, reviewers_n: int):
    from review.actions.teams import create_flow_definition, create_work_team

    project, owner, users = make_reviewers(reviewers_n)
    team = create_work_team(project=project, name=f"team-{name}", members=users, user=owner)
    flow = create_flow_definition(project=project, user=owner, data={
        "name": name, "work_team": team, "task_type": "classification", "labels": LABELS, "title": name,
        "instructions": "", "task_count": task_count, "task_availability_seconds": 24 * 3600,
        "task_time_limit_seconds": 600, "activation": {"confidence_below": None, "sample_percent": 100.0,
                                                       "combine": "any"},
        "order": "oldest", "show_prediction": True})
    return flow, users


def fill_backlog(flow, n: int, chunk: int = 5000) -> None:
    from review.actions.loops import start_loops_for_predictions

    rng = random.Random(7)
    done = 0
    while done < n:
        size = min(chunk, n - done)
        items = [({"row": {"f1": rng.random(), "f2": rng.random()}},
                  {"label": "cat", "confidence": rng.random(), "probabilities": {}}) for _ in range(size)]
        start_loops_for_predictions(flow, items, source={"bench": True}, rng=rng)
        done += size
    settle()


def settle() -> None:
    """After a bulk load, the state a running studio is in: statistics fresh, the rows
    vacuumed and flushed. Otherwise autovacuum and a checkpoint, woken by the load, run
    during the measurement that follows and are measured as claim latency."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE review_humanloop")
        cursor.execute("VACUUM ANALYZE review_assignment")
        cursor.execute("CHECKPOINT")


# --- 1. claim+answer with concurrent reviewer processes ------------------------------------
def reviewer_process(user_id: int, flow_id: int, seconds: float, pace: float, ready, go, out) -> None:
    setup_django()
    from django.contrib.auth import get_user_model
    from django.db import connections

    from review.actions.answers import answer_slot
    from review.actions.claims import claim_next_slot
    from review.models import FlowDefinition
    from review.output import write_output_soon

    user = get_user_model().objects.get(pk=user_id)
    flow = FlowDefinition.objects.get(pk=flow_id)
    # Warm up as a long-lived web worker is: its connection open, every code path of a
    # claim+answer run once (the first run pays imports and query compiles).
    warm = claim_next_slot(user, flow)
    if warm is not None:
        answer_slot(warm.pk, user, {"label": "cat"})
    # A long-lived web worker has published to the broker before; a fresh process pays
    # 50-400 ms (connection, queue declaration) on the first answer that completes a loop
    # and enqueues its output write, which would otherwise be measured here as 32 one-off
    # outliers. One publish of the same task (for no loop: a worker would skip it; nothing
    # consumes the bench's queue) warms that path.
    write_output_soon(0)
    # Everyone starts together once every reviewer is warm: a straggler still connecting
    # would otherwise be measured as the others' latency.
    ready.put(user_id)
    while not go.value:
        time.sleep(0.005)
    start_at = go.value
    # Paced reviewers start one claim+answer every `pace` seconds, at a random phase, the
    # way people working through an inbox do; pace 0 runs flat out.
    next_at = start_at + (random.Random(user_id).random() * pace)
    while time.time() < next_at:
        time.sleep(0.001)
    latencies: list[float] = []
    claims: list[float] = []
    clock = time.perf_counter
    stop = start_at + seconds
    while time.time() < stop:
        if pace:
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            next_at += pace
        began = clock()
        held = claim_next_slot(user, flow)
        claimed = clock()
        if held is None:
            break
        answer_slot(held.pk, user, {"label": "cat"})  # everyone agrees: no tie asks for a third
        latencies.append(clock() - began)
        claims.append(claimed - began)
    connections.close_all()
    out.put((latencies, claims))


def run_together(target, arguments: list[tuple], pace: float, seconds: float) -> list:
    """One forked process per argument tuple, each called as target(*arguments, pace,
    ready, go, out); they all start measuring together once every one has said it is warm
    (ready), and each puts its results on `out`."""
    context = mp.get_context("fork")
    out, ready, go = context.Queue(), context.Queue(), context.Value("d", 0.0)
    processes = [context.Process(target=target, args=(*args, pace, ready, go, out)) for args in arguments]
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=120)
    go.value = time.time() + 0.5
    results = [out.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(30)
    return results


def print_runs(results: list[tuple[str, object, dict]]) -> None:
    """One column per (title, flow, figures) run."""
    print(f"  {'':<40}" + "".join(f"{title:<24}" for title, _, _ in results))
    for label, key, unit in (("claim+answer p50", "p50", "ms"), ("claim+answer p99 (target ≤ 50 ms)", "p99", "ms"),
                             ("  of which claim p50", "claim_p50", "ms"), ("  of which claim p99", "claim_p99", "ms"),
                             ("throughput (answers/s)", "rate", ""), ("answers recorded", "n", "")):
        cells = [f"{r[key]:.1f} {unit}".strip() if unit else f"{r[key]:.0f}" for _, _, r in results]
        print(f"  {label:<40}" + "".join(f"{cell:<24}" for cell in cells))


def run_reviewers(flow, users, seconds: float, pace: float = 0.0) -> dict:
    from django.db import connections

    connections.close_all()  # the children open their own
    results = run_together(reviewer_process, [(u.pk, flow.pk, seconds) for u in users], pace, seconds)
    latencies = [x for lat, _ in results for x in lat]
    claims = [x for _, c in results for x in c]
    return {"n": len(latencies), "p50": pct(latencies, 0.5) * 1000, "p99": pct(latencies, 0.99) * 1000,
            "claim_p50": pct(claims, 0.5) * 1000, "claim_p99": pct(claims, 0.99) * 1000,
            "rate": len(latencies) / seconds}


def check_invariants(flow) -> str:
    from django.db.models import Count

    from review.models import Assignment, AssignmentStatus, HumanLoop

    double = (Assignment.objects.filter(loop__flow_definition=flow, status=AssignmentStatus.ANSWERED)
              .values("loop_id", "worker_id").annotate(n=Count("id")).filter(n__gt=1).count())
    over = HumanLoop.objects.filter(flow_definition=flow).extra(where=["answers_count > answers_needed"]).count()
    bad_counters = HumanLoop.objects.filter(flow_definition=flow).extra(
        where=["answers_needed <> answers_count + holds_count + open_slots"]).count()
    return f"double answers {double}, over-answered {over}, counter mismatches {bad_counters}"


def bench_claim_answer(seconds: float, backlog: int, pace: float, paced_seconds: float) -> None:
    print(f"\n1. claim+answer through review.actions, {seconds:.0f} s per flat-out run, {paced_seconds:.0f} s paced")
    print(f"   paced: each of the {REVIEWERS} reviewers starts one claim+answer every {pace:g} s (people read "
          f"before they answer), and again 4× as often; flat out: no pause at all, the machine's capacity")
    fast_pace = pace / 4
    # The baseline reviewer works alone, so its loops take one answer each: with two, every
    # loop it answered would keep an open slot only someone else may fill.
    runs = [("1 reviewer, flat out", "concurrency-1", 1, 1, seconds, 0.0),
            (f"{REVIEWERS}, 1 per {pace:g} s each", "concurrency-32-paced", 2, REVIEWERS, paced_seconds, pace),
            (f"{REVIEWERS}, 1 per {fast_pace:g} s each", "concurrency-32-fast", 2, REVIEWERS, seconds, fast_pace),
            (f"{REVIEWERS}, flat out", "concurrency-32", 2, REVIEWERS, seconds, 0.0)]
    results = []
    for title, name, task_count, reviewers, length, run_pace in runs:
        flow, users = make_flow(name, task_count, REVIEWERS)
        fill_backlog(flow, backlog)
        results.append((title, flow, run_reviewers(flow, users[:reviewers], length, pace=run_pace)))
    print_runs(results)
    single = results[0][2]
    print("  p99 ratio to the baseline: " + ", ".join(
        f"{title} {r['p99'] / single['p99']:.1f}×" for title, _, r in results[1:]))
    print(f"  flat-out throughput ratio to the baseline: {results[-1][2]['rate'] / single['rate']:.1f}×")
    for title, flow, _ in results[1:]:
        print(f"  invariants after '{title}': {check_invariants(flow)}")


# --- 3. claim+answer over HTTP ----------------------------------------------------------------
def http_reviewer(port: int, token: str, flow_id: int, seconds: float, pace: float, ready, go, out) -> None:
    """One reviewer as the inbox page is: POST /api/v1/review/claim/, then POST the answer,
    on one keep-alive connection; the latency is both requests."""
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    claim_body = json.dumps({"flow_definition": flow_id}).encode()
    answer_body = json.dumps({"answer": {"label": "cat"}}).encode()
    errors: list[str] = []

    def post(path: str, body: bytes) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                return response.status, response.read()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                # gunicorn closes a connection idle for 2 s (its keep-alive): reconnect, as
                # a browser does, and count the reconnect in the latency.
                connection.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def claim_answer() -> float | None:
        """Seconds the claim took, or None when there was nothing to claim or it failed."""
        began = time.perf_counter()
        status, payload = post("/api/v1/review/claim/", claim_body)
        claimed = time.perf_counter() - began
        if status != 200:
            if status != 204:
                errors.append(f"claim {status}: {payload[:200]!r}")
            return None
        status, payload = post(f"/api/v1/review/assignments/{json.loads(payload)['assignment']}/answer/", answer_body)
        if status != 200:
            errors.append(f"answer {status}: {payload[:200]!r}")
            return None
        return claimed

    claim_answer()  # warm: this connection, the server thread's database connection
    ready.put(1)
    while not go.value:
        time.sleep(0.005)
    start_at = go.value
    next_at = start_at + random.random() * pace
    latencies: list[float] = []
    claims: list[float] = []
    while time.time() < start_at + seconds:
        delay = next_at - time.time()
        if delay > 0:
            time.sleep(delay)
        next_at += pace
        began = time.perf_counter()
        claimed = claim_answer()
        if claimed is None:
            break
        latencies.append(time.perf_counter() - began)
        claims.append(claimed)
    connection.close()
    out.put((latencies, claims, errors))


def run_http_reviewers(port: int, flow, tokens: list[str], seconds: float, pace: float) -> dict:
    results = run_together(http_reviewer, [(port, token, flow.pk, seconds) for token in tokens], pace, seconds)
    latencies = [x for lat, _, _ in results for x in lat]
    claims = [x for _, c, _ in results for x in c]
    errors = [e for _, _, errs in results for e in errs]
    return {"n": len(latencies), "p50": pct(latencies, 0.5) * 1000, "p99": pct(latencies, 0.99) * 1000,
            "claim_p50": pct(claims, 0.5) * 1000, "claim_p99": pct(claims, 0.99) * 1000,
            "rate": len(latencies) / seconds, "errors": errors}


def bench_http(seconds: float, backlog: int, pace: float) -> None:
    from studio_setup import gunicorn_command, start_server, stop_server

    from studio import actions as studio_actions
    from studio.embedded_redis import free_port

    print(f"\n3. claim+answer over HTTP, {REVIEWERS} reviewers as the inbox page makes them (claim, then answer, "
          f"each a request with a bearer token), gunicorn gthread 2×8 as `studio up` runs it, {seconds:.0f} s per run")
    runs = []
    for run_pace in (pace, pace / 4):
        flow, users = make_flow(f"http-{run_pace:g}", 2, REVIEWERS)
        fill_backlog(flow, backlog)
        tokens = [studio_actions.issue_token(user, name=f"bench-{flow.pk}")[1] for user in users]
        runs.append((run_pace, flow, tokens))
    from django.db import connections

    connections.close_all()
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="trainyard-bench-review-")
    process = start_server(gunicorn_command(port), {**os.environ, "STUDIO_DATA_DIR": data_dir}, port)
    results = []
    try:
        for run_pace, flow, tokens in runs:
            results.append((f"{REVIEWERS}, 1 per {run_pace:g} s each", flow,
                            run_http_reviewers(port, flow, tokens, seconds, run_pace)))
    finally:
        stop_server(process)
        shutil.rmtree(data_dir, ignore_errors=True)
    print_runs(results)
    for title, flow, result in results:
        errors = result["errors"]
        print(f"  '{title}': {len(errors)} failed requests{': ' + errors[0] if errors else ''}; "
              f"invariants: {check_invariants(flow)}")


# --- 2. claim latency over a deep backlog ------------------------------------------------------
def claim_release_latencies(flow, users, rounds: int) -> list[float]:
    from review.actions.claims import claim_next_slot, release_slot

    latencies = []
    clock = time.perf_counter
    for index in range(rounds):
        user = users[index % len(users)]
        began = clock()
        held = claim_next_slot(user, flow)
        latencies.append(clock() - began)
        assert held is not None, "the backlog ran dry"
        release_slot(held.pk, user)
    return latencies


def candidate_plan(flow, user) -> list[str]:
    """EXPLAIN ANALYZE of the claim statement as claim_next_slot sends it (rolled back:
    ANALYZE runs it, and it inserts a hold)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from review.actions.claims import claim_statement

    sql, params = claim_statement(user, flow.pk, flow.order, flow.task_time_limit_seconds, timezone.now())
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql, params)
            lines = [line for (line,) in cursor.fetchall()]
        transaction.set_rollback(True)
    return lines


def bench_deep_backlog(backlog: int, small: int, rounds: int) -> None:
    print(f"\n2. claim latency (claim, then release), {rounds} claims by {REVIEWERS} reviewers in turn")
    started = time.perf_counter()
    deep, users = make_flow("backlog-deep", 1, REVIEWERS)
    fill_backlog(deep, backlog)
    filled = time.perf_counter() - started
    shallow, _ = make_flow("backlog-small", 1, REVIEWERS)
    fill_backlog(shallow, small)
    claim_release_latencies(shallow, users, 50)  # warm caches
    claim_release_latencies(deep, users, 50)  # warm caches
    deep_lat = claim_release_latencies(deep, users, rounds)
    small_lat = claim_release_latencies(shallow, users, rounds)
    row("", f"backlog {backlog:,}", f"baseline: backlog {small:,}", "")
    row("claim p50", f"{pct(deep_lat, 0.5) * 1000:.2f} ms", f"{pct(small_lat, 0.5) * 1000:.2f} ms",
        "target p50 ≤ 10 ms")
    row("claim p99", f"{pct(deep_lat, 0.99) * 1000:.2f} ms", f"{pct(small_lat, 0.99) * 1000:.2f} ms", "")
    print(f"  ({backlog:,} loops inserted in {filled:.1f} s by start_loops_for_predictions)")
    print("  candidate query plan (deep backlog):")
    for line in candidate_plan(deep, users[0]):
        print(f"    {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller numbers (a smoke run)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each claim+answer run")
    parser.add_argument("--pace", type=float, default=2.0,
                        help="seconds between one paced reviewer's claim+answer starts (default 2)")
    parser.add_argument("--paced-seconds", type=float, default=30.0,
                        help="length of the paced run (default 30: enough answers for a steady p99)")
    parser.add_argument("--only", type=int, choices=(1, 2, 3), action="append",
                        help="run only this section (repeatable); default: all three")
    args = parser.parse_args()
    sections = set(args.only or (1, 2, 3))
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        print("bench/review.py: skipped — set DATABASE_URL to a PostgreSQL server "
              "(e.g. postgres://postgres@127.0.0.1:5432/postgres); it measures SKIP LOCKED claims.")
        return 0
    os.environ["DATABASE_URL"] = create_database(base)
    try:
        setup_django()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(f"Human review claims on PostgreSQL ({DB_NAME}), {os.cpu_count()} CPUs")
        seconds = 3.0 if args.quick else args.seconds
        if 1 in sections:
            bench_claim_answer(seconds, backlog=5_000 if args.quick else 40_000, pace=args.pace,
                               paced_seconds=6.0 if args.quick else args.paced_seconds)
        if 2 in sections:
            bench_deep_backlog(backlog=10_000 if args.quick else 100_000, small=1_000,
                               rounds=300 if args.quick else 2_000)
        if 3 in sections:
            bench_http(seconds=6.0 if args.quick else 20.0, backlog=5_000 if args.quick else 10_000, pace=args.pace)
    finally:
        drop_database(base)
        drop_bench_queue()
    return 0


def drop_bench_queue() -> None:
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).delete(BENCH_QUEUE)


if __name__ == "__main__":
    raise SystemExit(main())
