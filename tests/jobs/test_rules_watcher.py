"""The rule watcher on real Redis streams, in this process: points written the way the SDK
writes them, cycles run by hand, transitions and actions read from the database."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import AlarmTransition, JobRule, JobStatus, RuleState, TrainingJob
from jobs.rules.engine import check_rules
from jobs.rules.store import waiting_reason
from jobs.rules.watcher import LEADER_KEY, RULES_GROUP, RuleWatcher
from studio.redis_conn import redis_client
from tests.factories import make_job
from tests.jobs.conftest import clear_job_streams
from trainyard.protocol import LOGS_STREAM, METRICS_STREAM, key


@pytest.fixture
def watcher():
    redis_client().delete(LEADER_KEY)
    made: list[RuleWatcher] = []

    def make(**kwargs) -> RuleWatcher:
        w = RuleWatcher(redis_client(), discover_seconds=0.0, tick_seconds=0.0, **kwargs)
        made.append(w)
        return w

    yield make
    for w in made:
        w.resign()


def running_job(project, rules: list, **fields) -> TrainingJob:
    job = make_job(project, name=fields.pop("name", "watched"), submitted=True, status=JobStatus.TRAINING,
                   started_at=timezone.now(), training_started_at=timezone.now(), **fields)
    clear_job_streams(job.pk)
    for spec in check_rules(rules):
        JobRule.objects.create(job=job, name=spec["name"], type=spec["type"], parameters=spec["parameters"],
                               actions=spec["actions"], enabled=spec["enabled"], state_reason=waiting_reason(spec))
    return job


def send(job: TrainingJob, points: list[tuple[str, int, float]], *, rank: int = 0, at: float | None = None) -> None:
    """One stream entry as trainyard.metrics writes it (NaN and Infinity bare, as json.dumps does)."""
    now = at or time.time()
    redis_client().xadd(key(METRICS_STREAM, job.pk), {"r": rank, "p": json.dumps([[n, s, v, now] for n, s, v in points])})


def run(w: RuleWatcher, cycles: int = 3) -> None:
    for _ in range(cycles):
        w.cycle(block_ms=10)


def test_a_nan_point_stops_the_job_with_the_default_rule(project, watcher):
    job = running_job(project, [])
    w = watcher()
    send(job, [("train_loss", 1, 0.9), ("train_loss", 2, 0.8)])
    run(w)
    rule = JobRule.objects.get(job=job, name="non_finite")
    assert rule.state == RuleState.OK, rule.state_reason

    send(job, [("train_loss", 3, float("nan")), ("accuracy", 3, 0.5)])
    run(w)

    job.refresh_from_db()
    assert (job.status, job.stop_reason, job.stop_rule) == (JobStatus.STOPPING, "RuleTriggered", "non_finite")
    alarm = AlarmTransition.objects.get(job=job, to_state=RuleState.ALARM)
    assert alarm.step == 3 and alarm.from_state == RuleState.OK
    assert alarm.actions_taken[0]["type"] == "stop"
    assert job.events.filter(message__contains="rule non_finite").exists()


def test_infinity_on_another_rank_is_caught_too(project, watcher):
    job = running_job(project, [])
    w = watcher()
    send(job, [("val_loss", 1, 0.5)])
    send(job, [("val_loss", 1, float("inf"))], rank=3)
    run(w)
    job.refresh_from_db()
    assert job.stop_rule == "non_finite"


def test_a_default_rule_can_be_turned_off(project, watcher):
    job = running_job(project, [{"type": "non_finite", "enabled": False}])
    w = watcher()
    send(job, [("train_loss", 1, float("nan"))])
    run(w)
    job.refresh_from_db()
    assert job.status == JobStatus.TRAINING and not AlarmTransition.objects.filter(job=job).exists()


def test_a_custom_m_of_n_rule_fires_where_its_definition_says(project, watcher):
    rule = {"name": "loss-high", "type": "custom", "actions": ["tag"],
            "parameters": {"metric": "loss", "statistic": "last", "window": 1, "comparison": ">", "threshold": 2,
                           "datapoints_to_alarm": 2, "evaluation_periods": 3}}
    job = running_job(project, [rule])
    w = watcher()
    for step, value in enumerate([1, 1, 1, 1, 5, 1, 5, 5, 1, 1, 1], start=1):
        send(job, [("loss", step, value)])
        run(w, 1)
    changes = list(AlarmTransition.objects.filter(job=job, rule__name="loss-high").order_by("at", "pk")
                   .values_list("from_state", "to_state", "step"))
    assert ("OK", "ALARM", 7) in changes and ("ALARM", "OK", 10) in changes, changes
    job.refresh_from_db()
    assert "alarm:loss-high" in job.tags and job.status == JobStatus.TRAINING


def test_a_rule_on_one_metric_of_the_sdks_grouped_entries_sees_exactly_its_points(project, watcher, monkeypatch):
    """Entries the SDK writes (trainyard.metrics, grouped by name) with several metrics: once
    the rules have their first data, only the watched metric's span of each entry is decoded
    (span_rows), and the custom rule still fires at the step its definition says."""
    from django.conf import settings

    import jobs.rules.watcher as watcher_module
    from trainyard.metrics import MetricsLogger

    spans = []
    real_span_rows = watcher_module.span_rows
    monkeypatch.setattr(watcher_module, "span_rows", lambda *a: spans.append(r := real_span_rows(*a)) or r)
    rule = {"name": "loss-high", "type": "custom", "actions": ["tag"],
            "parameters": {"metric": "loss", "statistic": "mean", "window": 10, "comparison": ">", "threshold": 2,
                           "datapoints_to_alarm": 2, "evaluation_periods": 3}}
    job = running_job(project, [rule])
    w = watcher()
    logger = MetricsLogger(job.pk, settings.REDIS_URL)
    for step in range(0, 3000):  # loss jumps to 5 from step 2,000: the periods ending at 2,009 and 2,019 breach
        logger.log_metrics({"acc": 0.5, "loss": 5.0 if step >= 2000 else 1.0, "lr": 0.1, "zeta": 2.0}, step)
        if step % 500 == 499:
            assert logger.flush(10)
            run(w, 1)
    run(w, 2)
    changes = list(AlarmTransition.objects.filter(job=job, rule__name="loss-high").order_by("at", "pk")
                   .values_list("from_state", "to_state", "step"))
    assert ("OK", "ALARM", 2019) in changes, changes
    assert spans and all(rows is not None and {r.name for r in rows} == {"loss"} for rows in spans), \
        "the grouped entries' spans hold the watched metric's rows only"


def test_entries_a_dead_watcher_read_and_never_acked_are_read_again(project, watcher):
    job = running_job(project, [])
    first = watcher(consumer="first")
    send(job, [("loss", 1, 1.0)])
    run(first)
    # A second entry read by a watcher that then died before acking it.
    send(job, [("loss", 2, float("nan"))])
    redis_client().xreadgroup(RULES_GROUP, "crashed", {key(METRICS_STREAM, job.pk): ">"}, count=10)
    first.resign()

    second = watcher(consumer="second")
    run(second)

    job.refresh_from_db()
    assert job.stop_rule == "non_finite", list(AlarmTransition.objects.filter(job=job).values())


def test_only_one_watcher_leads(project, watcher):
    running_job(project, [])
    a, b = watcher(consumer="a"), watcher(consumer="b")
    assert a.lead() and not b.lead()
    a.resign()
    assert b.lead()


def test_stalled_fires_on_the_clock_and_a_log_line_clears_it(project, watcher):
    job = running_job(project, [{"type": "stalled", "parameters": {"threshold_seconds": 1}}])
    w = watcher()
    send(job, [("loss", 1, 1.0)])
    run(w)
    time.sleep(1.5)
    run(w)
    rule = JobRule.objects.get(job=job, name="stalled")
    assert rule.state == RuleState.ALARM, rule.state_reason
    redis_client().xadd(key(LOGS_STREAM, job.pk), {"r": 0, "t": f"{time.time():.3f}", "s": "out", "l": "still here"})
    run(w)
    rule.refresh_from_db()
    assert rule.state == RuleState.OK, rule.state_reason


@pytest.mark.parametrize("status", [JobStatus.UPLOADING, JobStatus.STOPPING])
def test_clock_rules_stay_quiet_once_the_processes_have_ended(project, watcher, status, settings):
    """Seen in a walk: `stalled` (and `budget`) moved to ALARM while the job uploaded its
    output, and notified "... the job is Completed". Silence after the script exits is
    expected; the clock rules are ticked only while it runs."""
    from jobs.models import JobAttempt, Node

    settings.STUDIO_INSTANCE_PRICES = '{"cpu": 36.0}'  # a cent a second
    job = running_job(project, [{"type": "stalled", "parameters": {"threshold_seconds": 1}},
                                {"type": "budget", "parameters": {"limit": 0.5, "projected": False}}],
                      resources={"instance_type": "cpu", "instance_count": 1})
    node = Node.objects.create(name="priced-quiet", hostname="h", queue="node.priced-quiet")
    JobAttempt.objects.create(job=job, attempt=1, node_rank=0, node=node, started_at=timezone.now(),
                              price_per_hour="36.0", currency="USD")
    TrainingJob.objects.filter(pk=job.pk).update(attempt=1)
    w = watcher()
    send(job, [("loss", 1, 1.0)])
    run(w)
    assert set(JobRule.objects.filter(job=job).values_list("state", flat=True)) == {RuleState.OK}
    # The script exits; the output is uploaded (or the job is being stopped) for a while.
    TrainingJob.objects.filter(pk=job.pk).update(status=status)
    JobAttempt.objects.filter(job=job).update(started_at=timezone.now() - timedelta(seconds=120))  # over budget
    time.sleep(1.5)
    run(w)
    assert not AlarmTransition.objects.filter(job=job, to_state=RuleState.ALARM).exists(), list(
        AlarmTransition.objects.filter(job=job).values_list("rule__name", "to_state", "reason"))
    job.refresh_from_db()
    assert job.status == status and job.stop_rule in ("", None)
    # The same rules on a job still training do fire: the test can fail.
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TRAINING)
    run(w)
    fired = set(AlarmTransition.objects.filter(job=job, to_state=RuleState.ALARM).values_list("rule__name", flat=True))
    assert fired == {"stalled", "budget"}, fired


def test_a_rule_that_never_gets_data_says_so_when_the_job_ends(project, watcher):
    job = running_job(project, [{"type": "custom", "name": "val", "parameters": {"metric": "validation_loss",
                                                                                 "threshold": 1, "comparison": ">"}}])
    w = watcher()
    send(job, [("train_loss", 1, 1.0)])
    run(w)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now())
    run(w)
    rule = JobRule.objects.get(job=job, name="val")
    assert rule.state == RuleState.INSUFFICIENT_DATA
    assert "validation_loss" in rule.state_reason and "train_loss" in rule.state_reason, rule.state_reason
    assert AlarmTransition.objects.filter(rule=rule).exists()


def test_a_rule_added_while_the_job_runs_is_picked_up(project, watcher):
    job = running_job(project, [])
    w = watcher()
    send(job, [("loss", 1, 1.0)])
    run(w)
    from jobs.rules.store import add_rule

    add_rule(job.pk, {"type": "custom", "name": "big", "parameters": {"metric": "loss", "threshold": 10,
                                                                       "comparison": ">"}, "actions": ["stop"]},
             job_finished=False, project_id=job.project_id)
    run(w)
    send(job, [("loss", 2, 50.0)])
    run(w)
    job.refresh_from_db()
    assert job.stop_rule == "big"


def test_low_gpu_utilization_names_the_host_and_gpu_from_the_system_stream(project, watcher):
    from trainyard.protocol import SYSTEM_STREAM

    job = running_job(project, [{"type": "low_gpu_utilization",
                                 "parameters": {"window": 20, "warmup_samples": 0, "threshold_p95": 70, "threshold_p5": 10}}])
    w = watcher()
    run(w)
    now = time.time()
    for i in range(25):  # GPU 0 busy, GPU 1 idling behind a slow loader
        redis_client().xadd(key(SYSTEM_STREAM, job.pk), {"n": "gpu-node-1", "t": f"{now + i:.3f}", "cpu": "50", "mem": "1",
                                                          "gpu": "50.0", "gpu_mem": "1", "gpus": "95.0,5.0"})
    run(w)
    rule = JobRule.objects.get(job=job, name="low_gpu_utilization")
    assert rule.state == RuleState.ALARM, rule.state_reason
    assert "gpu-node-1" in rule.state_reason and "1" in str(rule.state_values.get("gpu_index")), rule.state_values


def test_a_budget_rule_stops_a_job_whose_cost_passes_its_limit(project, watcher, settings):
    from datetime import timedelta

    from jobs.models import JobAttempt, Node

    settings.STUDIO_INSTANCE_PRICES = '{"cpu": 36.0}'  # a cent a second
    job = running_job(project, [{"type": "budget", "parameters": {"limit": 0.5, "projected": False}}],
                      resources={"instance_type": "cpu", "instance_count": 1})
    node = Node.objects.create(name="priced", hostname="h", queue="node.priced")
    started = timezone.now() - timedelta(seconds=120)
    JobAttempt.objects.create(job=job, attempt=1, node_rank=0, node=node, started_at=started, price_per_hour="36.0",
                              currency="USD")
    TrainingJob.objects.filter(pk=job.pk).update(attempt=1, started_at=started)
    w = watcher()
    send(job, [("loss", 1, 1.0)])
    run(w)
    job.refresh_from_db()
    assert (job.status, job.stop_rule) == (JobStatus.STOPPING, "budget"), JobRule.objects.get(job=job, name="budget").state_reason
    alarm = AlarmTransition.objects.get(job=job, to_state=RuleState.ALARM)
    assert "0.5" in alarm.reason, alarm.reason


def test_the_flusher_keeps_entries_the_watcher_has_not_evaluated(project, watcher, monkeypatch):
    from jobs.metrics import ingest

    job = running_job(project, [])
    stream = key(METRICS_STREAM, job.pk)
    w = watcher()
    run(w)  # the watcher's group exists
    for step in range(1, 301):  # whole macro-nodes of the stream, which an approximate XTRIM removes
        send(job, [("loss", step, 1.0)], at=time.time() - 3600 * 2)
    flusher = ingest.Flusher(redis_client(), discover_running=False)
    flusher._running = {job.pk}
    while flusher.flush_once(block_ms=0):
        pass
    monkeypatch.setattr(ingest, "STREAM_RETENTION_MS", 0)
    flusher._trim([job.pk])
    assert redis_client().xlen(stream) == 300, "written, but not evaluated yet: kept"
    run(w, 10)
    flusher._trim([job.pk])
    assert redis_client().xlen(stream) < 300, "evaluated too: trimmed"


def test_the_fast_parsers_agree_with_json_on_odd_payloads():
    """Whatever payload_rows accepts, columns_of / points_of / first_points_of give what
    json.loads gives (parse_points), for the payloads the SDK and the log capture write (any
    name, negative steps, tiny and huge floats, another spacing); whatever it refuses the
    watcher reads with parse_points itself — the SDK's own payloads are never refused."""
    import random

    from jobs.rules.watcher import columns_of, first_points_of, parse_points, payload_rows, points_of, span_rows
    from trainyard.protocol import metric_payload

    rng = random.Random(7)
    names = ["loss", 'va"l/loss', "accuracy é", "loss_2", "l", 'x["loss", 1]', "val_loss"]
    raw = [[rng.choice(names), rng.randint(-5, 10**12), rng.choice([0.0, -0.0, 1e-300, 1e300, rng.random(), 12.5]),
            1764620000.0 + rng.random() * 1000] for _ in range(500)]
    sdk = [json.dumps(raw).encode(), json.dumps(raw, separators=(",", ":")).encode(), metric_payload(raw).encode()]
    # Rows of other shapes mixed in: each such payload is read as json.loads reads it.
    odd_rows = [["loss", 1, 2, 3, 4], ["loss", True, 1.0, 2.0], ["loss", 3, "2.5", 2.0], ["loss", 4, 1e400, 2.0],
                ["loss", 10**30, 1.0, 2.0], {"name": "loss"}, "loss", ["loss", 5.0, 1.0, 2.0], [["loss"], 1, 1.0, 2.0],
                ["loss", 6, 1, 2.0]]
    payloads = [*sdk, *(json.dumps(raw[:50] + [odd] + raw[50:100]).encode() for odd in odd_rows)]
    payloads += [b'[["loss", 1, 1.0, 2.0], ', b"not json", b'{"loss": 1}', b"[]", b"", b"[" * 100_000]
    accepted = 0
    for payload in payloads:
        every = parse_points(payload, rank=b"3")
        for name in names:
            # One metric's span: the rows json.loads reads of it, or None (decode it whole).
            picked = span_rows(payload, b"[" + json.dumps(name).encode() + b",", json.dumps(name).encode())
            if picked is None:
                assert payload not in sdk, name
                continue
            columns = {}
            columns_of(picked, name, 3, columns)
            want = [p for p in every if p.name == name]
            if every or payload == b"[]":  # JSON json.loads reads: the same points
                assert columns.get(3, ([], [], []))[0] == [p.step for p in want], name
                assert columns.get(3, ([], [], []))[1] == [p.value for p in want], name
            if payload == sdk[2]:
                assert {row.name for row in picked} <= {name}, "grouped by name: only its own rows are decoded"
        rows = payload_rows(payload)
        if rows is None:
            assert payload not in sdk
            continue
        accepted += 1
        for name in names:
            want = [p for p in every if p.name == name]
            columns: dict = {}
            columns_of(rows, name, 3, columns)
            got = columns.get(3, ([], [], []))
            assert got == ([p.step for p in want], [p.value for p in want], [p.time for p in want]), name
            assert points_of(rows, frozenset({name}), 3) == want, name
        firsts = {p.name: p for p in reversed(every)}
        assert sorted(first_points_of(rows, 3)) == sorted(firsts.values())
    assert accepted >= 4, "the SDK's payloads, an int value among floats, the empty list"
    assert parse_points(sdk[0], rank=b"x") == [], "a rank that is not a number"


def test_a_cycles_transitions_are_stored_together_and_a_failing_batch_falls_back_rule_by_rule(project, watcher,
                                                                                           monkeypatch):
    """The watcher stores what one cycle caused in one transaction (store.record_many), then
    acks; when that transaction fails (a database error), each rule's transitions are stored
    on their own, and the entries are acked."""
    from django.db import DatabaseError

    from jobs.rules import watcher as watcher_module

    jobs = [running_job(project, [], name=f"job-{i}") for i in range(2)]
    w = watcher()
    run(w, 1)  # both jobs discovered
    batches = []

    def batch_fails(changes):
        batches.append([(rule.job_id, rule.name, len(ts)) for rule, ts in changes])
        raise DatabaseError("could not serialize access")

    monkeypatch.setattr(watcher_module, "record_many", batch_fails)
    for job in jobs:
        send(job, [("train_loss", 1, 0.9)])
    run(w, 1)

    assert [sorted(batch) for batch in batches] == [[(jobs[0].pk, "non_finite", 1), (jobs[1].pk, "non_finite", 1)]], \
        "one batch for the cycle"
    for job in jobs:
        rule = JobRule.objects.get(job=job, name="non_finite")
        assert rule.state == RuleState.OK and rule.state_changed_at is not None, rule.state_reason
        assert list(AlarmTransition.objects.filter(job=job).values_list("from_state", "to_state")) == [
            (RuleState.INSUFFICIENT_DATA, RuleState.OK)]
        assert redis_client().xpending(key(METRICS_STREAM, job.pk), RULES_GROUP)["pending"] == 0, "acked"


def test_record_many_stores_each_rules_last_state_and_changes_its_time_only_on_a_change(project):
    from jobs.rules.engine import Transition
    from jobs.rules.store import record_many

    job = running_job(project, [{"type": "stalled", "name": "quiet"}])
    first, second = JobRule.objects.filter(job=job).order_by("name")  # non_finite, quiet
    changed_at = first.state_changed_at
    t0 = time.time() - 60
    stored = record_many([
        (first, [Transition("INSUFFICIENT_DATA", "OK", t0, "ok", {"v": float("nan")}, 1)]),
        (second, [Transition("INSUFFICIENT_DATA", "INSUFFICIENT_DATA", t0 + 1, "still nothing", {}, None)]),
        (first, [Transition("OK", "ALARM", t0 + 2, "alarm", {}, 2)])])
    assert [r.to_state for r in stored] == ["OK", "INSUFFICIENT_DATA", "ALARM"]
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, first.state_reason) == ("ALARM", "alarm")
    assert abs(first.state_changed_at.timestamp() - (t0 + 2)) < 0.01 and first.state_changed_at != changed_at
    assert (second.state, second.state_reason, second.state_changed_at) == ("INSUFFICIENT_DATA", "still nothing", None)
    assert AlarmTransition.objects.get(pk=stored[0].pk).values == {"v": "NaN"}
    job.refresh_from_db()
    assert (job.status, job.stop_rule) == (JobStatus.STOPPING, "non_finite"), "the ALARM's stop action ran"


def test_a_notify_action_with_on_sends_only_the_transitions_into_those_states(project, watcher):
    """Without `on` a notify action sends every transition, INSUFFICIENT_DATA → OK at the
    job's start included; `on: ["ALARM"]` sends the alarm alone (CloudWatch's alarm actions)."""
    from studio.models import Delivery, NotificationChannel

    NotificationChannel.objects.create(project=project, name="ops", kind="webhook", url="http://127.0.0.1:9/hook")
    custom = {"metric": "loss", "threshold": 2, "comparison": ">"}
    job = running_job(project, [
        {"type": "custom", "name": "every", "parameters": custom, "actions": ["notify"]},
        {"type": "custom", "name": "alarms", "parameters": custom, "actions": [{"type": "notify", "on": ["ALARM"]}]},
        {"type": "custom", "name": "both", "parameters": custom, "actions": [{"type": "notify", "on": ["OK", "ALARM"]}]}])
    w = watcher()
    for step, value in enumerate([1.0, 5.0, 1.0], start=1):  # → OK, → ALARM, → OK
        send(job, [("loss", step, value)])
        run(w)
    sent = {}
    for name in ("every", "alarms", "both"):
        taken = [(t.from_state, t.to_state, bool(t.actions_taken))
                 for t in AlarmTransition.objects.filter(job=job, rule__name=name).order_by("at", "pk")]
        sent[name] = [(a, b) for a, b, notified in taken if notified]
        assert [(a, b) for a, b, _ in taken] == [("INSUFFICIENT_DATA", "OK"), ("OK", "ALARM"), ("ALARM", "OK")], taken
    assert sent == {"every": [("INSUFFICIENT_DATA", "OK"), ("OK", "ALARM"), ("ALARM", "OK")],
                    "alarms": [("OK", "ALARM")],
                    "both": [("INSUFFICIENT_DATA", "OK"), ("OK", "ALARM"), ("ALARM", "OK")]}, sent
    assert Delivery.objects.count() == 3 + 1 + 3
    assert JobRule.objects.get(job=job, name="both").actions == [{"type": "notify", "channels": None,
                                                                  "on": ["OK", "ALARM"]}]


@pytest.mark.parametrize(("on", "field", "words"), [
    ("ALARM", "actions[0].on", "non-empty list"), ([], "actions[0].on", "non-empty list"),
    (["ALARM", "alarm"], "actions[0].on[1]", "one of"), (["OK", "OK"], "actions[0].on[1]", "twice")])
def test_a_bad_notify_on_is_refused_naming_the_item(on, field, words):
    from jobs.rules.engine import RuleError, check_rule

    with pytest.raises(RuleError) as refused:
        check_rule({"type": "stalled", "actions": [{"type": "notify", "on": on}]})
    assert refused.value.field == field and words in refused.value.message, (refused.value.field, refused.value.message)


def test_a_notify_that_reaches_no_channel_says_so_on_the_transition(project, watcher):
    from studio.models import Delivery, NotificationChannel

    job = running_job(project, [{"type": "custom", "name": "big", "parameters": {"metric": "loss", "threshold": 10,
                                                                                 "comparison": ">"},
                                 "actions": ["notify", {"type": "notify", "channels": ["ops"]}]}])
    NotificationChannel.objects.create(project=project, name="ops", kind="webhook", url="http://127.0.0.1:9/hook",
                                       enabled=False)  # named, but turned off
    w = watcher()
    send(job, [("loss", 1, 50.0)])
    run(w)
    alarm = AlarmTransition.objects.get(job=job, rule__name="big", to_state=RuleState.ALARM)
    assert alarm.actions_taken == [
        {"type": "notify", "deliveries": [], "result": "not sent: the project has no enabled channel"},
        {"type": "notify", "deliveries": [], "result": "not sent: ops is not an enabled channel of the project"},
    ], alarm.actions_taken
    assert not Delivery.objects.exists()


def test_a_watcher_taking_up_a_long_running_job_does_not_read_its_age_as_silence(project, watcher):
    """A restarted studio (or a new leader) found a job two hours in whose rules were OK:
    stalled called the two hours since the start 'no metric or log line for 7200 s',
    max_init_time 'no first step 7200 s after the start', and a custom rule's missing data
    counted every period since the start — false alarms, with a stop as their action. Their
    clocks now resume at the job's newest log line or metric entry."""
    job = running_job(project, [
        {"type": "stalled", "parameters": {"threshold_seconds": 2}, "actions": ["stop"]},
        {"type": "max_init_time", "parameters": {"threshold_seconds": 600}, "actions": ["stop"]},
        {"type": "custom", "name": "loss-gone", "parameters": {"metric": "loss", "threshold": 5, "missing_after_seconds": 60,
                                                              "treat_missing_data": "breaching"}},
    ])
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=2))
    JobRule.objects.filter(job=job).update(state=RuleState.OK, state_changed_at=timezone.now() - timedelta(hours=2))
    redis_client().xadd(key(LOGS_STREAM, job.pk), {"r": 0, "t": f"{time.time():.3f}", "s": "out", "l": "epoch 41"})
    w = watcher()
    run(w, 1)
    send(job, [("loss", 9000, 1.0)])
    run(w)
    assert not AlarmTransition.objects.filter(job=job).exists(), list(
        AlarmTransition.objects.filter(job=job).values_list("rule__name", "reason"))
    # A real silence is still caught, counted from the last activity.
    time.sleep(2.5)
    run(w)
    fired = list(AlarmTransition.objects.filter(job=job, to_state="ALARM").values_list("rule__name", flat=True))
    assert fired == ["stalled"], fired
    job.refresh_from_db()
    assert job.stop_rule == "stalled"


def test_a_stalled_rule_added_to_a_job_hours_in_counts_from_its_last_activity(project, watcher):
    job = running_job(project, [])
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=2))
    w = watcher()
    send(job, [("loss", 1, 1.0)])
    run(w)
    from jobs.rules.store import add_rule

    add_rule(job.pk, {"type": "stalled", "parameters": {"threshold_seconds": 600}, "actions": ["stop"]},
             job_finished=False, project_id=job.project_id)
    run(w)
    rule = JobRule.objects.get(job=job, name="stalled")
    assert rule.state != RuleState.ALARM, rule.state_reason
    job.refresh_from_db()
    assert job.stop_rule == ""


def test_an_m_of_n_rule_keeps_its_window_across_a_watcher_restart(project, watcher):
    """3 of 3 points over 5: two came before the watcher restarted, the third after. The new
    watcher refills the window from the entries the old one acked (without firing on them
    again) and alarms on the third; it waited for three more."""
    job = running_job(project, [{"type": "custom", "name": "high", "actions": ["tag"],
                                 "parameters": {"metric": "loss", "threshold": 5, "datapoints_to_alarm": 3,
                                                "evaluation_periods": 3}}])
    first = watcher(consumer="first")
    for step, value in ((1, 1.0), (2, 9.0), (3, 9.0)):
        send(job, [("loss", step, value)])
        run(first, 2)
    rule = JobRule.objects.get(job=job, name="high")
    assert rule.state == RuleState.OK, rule.state_reason
    before = AlarmTransition.objects.filter(job=job).count()
    first.resign()

    second = watcher(consumer="second")
    run(second)
    assert AlarmTransition.objects.filter(job=job).count() == before  # the refill fires nothing
    send(job, [("loss", 4, 9.0)])
    run(second)
    rule.refresh_from_db()
    assert rule.state == RuleState.ALARM, rule.state_reason
    alarm = AlarmTransition.objects.get(job=job, to_state="ALARM")
    assert alarm.step == 4 and alarm.values["datapoints"] == [9.0, 9.0, 9.0], alarm.values


def test_a_max_init_time_rule_added_after_a_restart_judges_the_attempts_real_first_step(project, watcher):
    """The job's first point came a minute in and was stored; the studio restarted and a
    max_init_time rule was added an hour in. The next point is not the first step: the rule
    is OK ('first step 60 s after the start'), not ALARM ('first step only 3600 s after')."""
    from jobs.models import MetricPoint
    from jobs.rules.store import add_rule

    job = running_job(project, [])
    started = timezone.now() - timedelta(hours=1)
    TrainingJob.objects.filter(pk=job.pk).update(started_at=started)
    MetricPoint.objects.create(job=job, name="loss", step=1, value=2.0, time=started + timedelta(seconds=60))
    w = watcher()
    add_rule(job.pk, {"type": "max_init_time", "parameters": {"threshold_seconds": 600}, "actions": ["stop"]},
             job_finished=False, project_id=job.project_id)
    send(job, [("loss", 500, 1.0)])
    run(w)
    rule = JobRule.objects.get(job=job, type="max_init_time")
    assert rule.state == RuleState.OK, rule.state_reason
    assert rule.state_reason.startswith("first step 60 s after the start"), rule.state_reason
    job.refresh_from_db()
    assert job.stop_rule == ""


def test_a_rule_turned_off_is_not_evaluated_after_the_patch_returns(project, watcher, django_capture_on_commit_callbacks):
    """It was for up to a discovery (~1.5 s): the watcher now hears of the change in its next
    cycle, and a verdict reached under a definition changed since is dropped at the commit."""
    from jobs.rules.engine import Transition
    from jobs.rules.store import record_many, update_rule

    job = running_job(project, [{"type": "custom", "name": "high", "parameters": {"metric": "loss", "threshold": 2,
                                                                                  "comparison": ">"}}])
    w = RuleWatcher(redis_client(), discover_seconds=1e9, tick_seconds=0.0)
    try:
        assert w.lead()
        w.discover()
        w._last_discover = time.monotonic()
        w._rules_changed()
        send(job, [("loss", 1, 1.0)])
        run(w)
        rule = JobRule.objects.get(job=job, name="high")
        assert rule.state == RuleState.OK
        watched_rule = next(r.rule for r in w.jobs[job.pk].rules.values() if r.rule.name == "high")
        with django_capture_on_commit_callbacks(execute=True):
            update_rule(rule, {"enabled": False}, job_finished=False, project_id=project.pk)
        send(job, [("loss", 2, 5.0)])
        run(w)
        assert not AlarmTransition.objects.filter(rule=rule, to_state=RuleState.ALARM).exists()
        assert rule.pk not in w.jobs[job.pk].rules, "dropped at the next cycle, not the next discovery"
    finally:
        w.resign()
    # The watcher's copy of the rule, read before the PATCH: what it found is not stored.
    stale = Transition(from_state="OK", to_state="ALARM", at=time.time(), step=3, reason="loss 5 > 2", values={})
    assert record_many([(watched_rule, [stale])]) == []
    rule.refresh_from_db()
    assert rule.state == RuleState.OK and rule.state_reason.startswith("Turned off")
