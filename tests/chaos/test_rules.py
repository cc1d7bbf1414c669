"""Rules on the live metric stream, with real workers (docs/SPEC.md §10): the cluster's
flusher runs the rule watcher, its control worker sends the notifications.

- a loss that turns NaN is stopped by the default rule, RuleTriggered, checkpoint kept;
- a script that goes silent is caught by `stalled`;
- a custom "M of N" rule fires, and clears, exactly where its definition says, and each
  transition reaches a webhook receiver once, signed; a receiver that is down gets its
  retries, the delivery is recorded as failed, and the job is unaffected.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from datasets.storage import store_for
from jobs.models import AlarmTransition, JobRule, JobStatus, RuleState, TrainingJob
from jobs.rules.engine import check_rules
from jobs.rules.store import waiting_reason
from studio.models import Delivery, NotificationChannel
from studio.notify import SIGNATURE_HEADER, verify
from tests.cluster import wait_job
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def with_rules(job: TrainingJob, raw: list) -> TrainingJob:
    """The job's rules as submit_job makes them (the default non_finite included)."""
    for spec in check_rules(raw):
        JobRule.objects.create(job=job, name=spec["name"], type=spec["type"], parameters=spec["parameters"],
                               actions=spec["actions"], enabled=spec["enabled"], state_reason=waiting_reason(spec))
    return job


def _checkpoint_steps(job: TrainingJob) -> list[int]:
    uri = job.checkpoint["uri"]
    try:
        names = [info.relative_path.rsplit("/", 1)[-1] for info in store_for(uri).list(uri)]
    except Exception:  # noqa: BLE001 - nothing stored
        return []
    return sorted(int(match.group(1)) for name in names if (match := re.match(r"checkpoint-(\d+)\.pt$", name)))


def test_a_nan_loss_is_stopped_by_the_default_rule_and_its_checkpoint_kept(cluster, submit):
    job = with_rules(submit("curve.py", hyperparameters={"shape": "nan", "at": 8, "steps": 400, "delay": 0.2}), [])
    job.checkpoint = {"uri": f"{job.output_uri}/checkpoints"}
    job.save(update_fields=["checkpoint"])

    job = wait_job(cluster, job, timeout=90)

    assert job.status == JobStatus.STOPPED, (job.status, job.failure_reason)
    assert (job.stop_reason, job.stop_rule) == ("RuleTriggered", "non_finite")
    alarm = AlarmTransition.objects.get(job=job, to_state=RuleState.ALARM)
    assert alarm.rule.name == "non_finite" and alarm.step == 8, (alarm.step, alarm.reason)
    assert "NaN" in alarm.reason and "loss" in alarm.reason
    assert [a["type"] for a in alarm.actions_taken] == ["stop"] and alarm.actions_taken[0]["result"] == "requested"
    # The stop was asked for within 10 s of the NaN point (its time is the point's own).
    assert job.stop_requested_at is not None
    assert (job.stop_requested_at - alarm.at).total_seconds() < 10
    # It did not train on: at most a few steps past the NaN (the SDK sends about once a second).
    assert job.metric_points.filter(name="loss").order_by("-step").values_list("step", flat=True).first() < 8 + 60
    # The newest checkpoint was synced to the store: at least the step where it diverged.
    assert _checkpoint_steps(job) and max(_checkpoint_steps(job)) >= 8
    messages = [m for _, m in job.events.values_list("status", "message")]
    assert any("rule non_finite" in m for m in messages), messages


def test_a_printed_nan_loss_read_by_a_metric_definition_is_stopped_too(cluster, submit):
    job = submit("curve.py", hyperparameters={"shape": "nan", "at": 8, "steps": 400, "delay": 0.2, "via": "print"},
                 metric_definitions=[{"name": "val_loss", "regex": r"step (?P<step>\d+) loss (?P<value>\S+)"}])
    job = wait_job(cluster, with_rules(job, []), timeout=90)

    assert (job.status, job.stop_reason, job.stop_rule) == (JobStatus.STOPPED, "RuleTriggered", "non_finite"), (
        job.status, job.failure_reason)
    alarm = AlarmTransition.objects.get(job=job, to_state=RuleState.ALARM)
    assert alarm.step == 8 and "val_loss" in alarm.reason and "NaN" in alarm.reason, (alarm.step, alarm.reason)
    assert not job.metric_points.filter(name="loss").exists()  # it came from the log, not the SDK
    assert job.metric_points.filter(name="val_loss", step__lt=8).count() == 7


def test_a_script_that_goes_silent_is_caught_by_stalled(cluster, submit):
    job = with_rules(submit("curve.py", hyperparameters={"shape": "sleep", "at": 3, "sleep": 300, "delay": 0.1}),
                     [{"type": "stalled", "parameters": {"threshold_seconds": 4}, "actions": ["stop"]}])

    job = wait_job(cluster, job, timeout=90)

    assert (job.status, job.stop_reason, job.stop_rule) == (JobStatus.STOPPED, "RuleTriggered", "stalled")
    alarm = AlarmTransition.objects.get(job=job, rule__name="stalled", to_state=RuleState.ALARM)
    assert "4" in alarm.reason, alarm.reason
    states = list(AlarmTransition.objects.filter(job=job, rule__name="stalled").values_list("from_state", "to_state"))
    # (The stop's own log lines, "stopping: SIGTERM…", may then clear it: that is activity.)
    assert states[:2] == [("INSUFFICIENT_DATA", "OK"), ("OK", "ALARM")], states


class Receiver:
    """A webhook receiver on a free loopback port that keeps every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_m_of_n_rule_fires_where_its_definition_says_and_each_transition_is_delivered_signed(cluster, submit, project):
    receiver = Receiver()
    try:
        up = NotificationChannel.objects.create(project=project, name="ops", kind="webhook", url=receiver.url,
                                                secret="s3cret-for-the-test")
        down = NotificationChannel.objects.create(project=project, name="down", kind="webhook",
                                                  url=f"http://127.0.0.1:{free_port()}/nobody", secret="other")
        # loss > 2 in 2 of the last 3 points: breaching at steps 5, 7, 8 → ALARM at 7; the
        # last three are (b, n, n) first at step 10 → OK there.
        values = [1, 1, 1, 1, 5, 1, 5, 5, 1, 1, 1, 1]
        rule = {"name": "loss-high", "type": "custom",
                "parameters": {"metric": "loss", "statistic": "last", "window": 1, "comparison": ">", "threshold": 2,
                               "datapoints_to_alarm": 2, "evaluation_periods": 3},
                "actions": [{"type": "notify", "channels": ["ops", "down"]}]}
        job = with_rules(submit("curve.py", hyperparameters={"shape": "series", "values": ",".join(map(str, values)),
                                                             "delay": 0.3}), [rule])

        job = wait_job(cluster, job, timeout=90)
        assert job.status == JobStatus.COMPLETED, (job.status, job.failure_reason)  # the dead receiver changes nothing

        wait_for(lambda: AlarmTransition.objects.filter(job=job, rule__name="loss-high", to_state="OK",
                                                        from_state="ALARM").exists(), timeout=20,
                 message="the rule to clear")
        transitions = list(AlarmTransition.objects.filter(job=job, rule__name="loss-high").order_by("at", "pk"))
        changes = [(t.from_state, t.to_state, t.step) for t in transitions]
        assert ("OK", "ALARM", 7) in changes and ("ALARM", "OK", 10) in changes, changes
        assert [c for c in changes if c[1] == "ALARM"] == [("OK", "ALARM", 7)], changes

        # One signed delivery per transition to the live receiver, none lost, none doubled.
        wait_for(lambda: len(receiver.requests) >= len(transitions), timeout=30, message="the deliveries")
        assert len(receiver.requests) == len(transitions)
        seen = []
        for headers, body in receiver.requests:
            assert verify("s3cret-for-the-test", body, headers[SIGNATURE_HEADER.lower()])
            assert not verify("wrong-secret", body, headers[SIGNATURE_HEADER.lower()])
            data = json.loads(body)["data"]
            seen.append((data["transition"]["from"], data["transition"]["to"], data["transition"]["step"]))
        assert sorted(seen, key=str) == sorted(changes, key=str)
        assert Delivery.objects.filter(channel=up, status="delivered").count() == len(transitions)

        # The dead receiver: every delivery retried, then recorded as failed, saying why.
        attempts = int(cluster.env["STUDIO_WEBHOOK_ATTEMPTS"])
        wait_for(lambda: Delivery.objects.filter(channel=down, status="failed").count() == len(transitions),
                 timeout=60, message="the dead channel's deliveries to fail")
        for delivery in Delivery.objects.filter(channel=down):
            assert delivery.attempts == attempts, delivery.attempts
            assert delivery.last_error, delivery
    finally:
        receiver.close()
