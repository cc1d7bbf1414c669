"""What a person gets from an alarm: a webhook's top-level `text` (as Slack-style incoming
webhooks read a message) and an e-mail that reads as words, each with a link to the job when
STUDIO_PUBLIC_URL says where the studio is; the JSON after them for machines."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.core import mail
from django.test import override_settings
from django.utils import timezone

from jobs.models import AlarmTransition, JobRule, JobStatus, RuleState
from jobs.rules.actions import take_actions
from jobs.rules.evaluation import Transition
from studio import notify
from studio.embedded_redis import free_port
from studio.models import Delivery
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def _fire(project, **rule_fields):
    job = make_job(project, name="charlm", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    rule = JobRule.objects.create(job=job, name="loss-nan", type="non_finite", state=RuleState.ALARM,
                                  actions=[{"type": "notify", "channels": None}], **rule_fields)
    at = datetime(2026, 12, 7, 1, 40, 12, tzinfo=UTC)
    t = Transition(from_state="OK", to_state="ALARM", at=at.timestamp(), reason="train_loss is NaN at step 3000",
                   values={"metric": "train_loss", "value": "NaN"}, step=3000)
    row = AlarmTransition.objects.create(rule=rule, job=job, from_state="OK", to_state="ALARM", at=at, step=3000,
                                         reason=t.reason, values=t.values)
    [taken] = take_actions(rule, row, t)
    return job, taken["deliveries"]


@override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend", STUDIO_PUBLIC_URL="https://ty.example.com")
def test_an_alarm_reads_as_words_with_a_link_to_the_job(project):
    notify.create_channel(project=project, user=None, name="team", kind="email", emails=["a@example.com"])
    job, [delivery_id] = _fire(project)
    mail.outbox.clear()
    assert notify.deliver(delivery_id) == "delivered"
    [message] = mail.outbox
    text = str(message.body).split("\n\n-- \n")[0]
    assert text.splitlines() == [
        f"ALARM: rule loss-nan (non_finite) on job charlm (#{job.pk}, project acme)",
        "Why: train_loss is NaN at step 3000",
        "OK → ALARM at 2026-12-07 01:40:12 UTC, step 3000; the job is Training.",
        f"https://ty.example.com/jobs/{job.pk}/",
    ]
    payload = Delivery.objects.get(pk=delivery_id).payload
    assert payload["text"] == text and payload["data"]["url"] == f"https://ty.example.com/jobs/{job.pk}/"
    assert payload["data"]["transition"]["values"] == {"metric": "train_loss", "value": "NaN"}
    assert json.loads(str(message.body).split("\n\n-- \n")[1].split("\n", 1)[1]) == payload


@override_settings(STUDIO_PUBLIC_URL="")
def test_without_the_studios_address_an_alarm_carries_no_link(project):
    notify.create_channel(project=project, user=None, name="hook", kind="webhook", url="http://127.0.0.1:9/x")
    _, [delivery_id] = _fire(project)
    payload = Delivery.objects.get(pk=delivery_id).payload
    assert payload["data"]["url"] is None
    assert "http" not in payload["text"] and payload["text"].startswith("ALARM: rule loss-nan")


def test_an_alarm_e_mail_goes_through_a_real_smtp_server_and_reads_the_same(project):
    """Django's SMTP backend to aiosmtpd on a free port: the message arrives to every
    address, its subject and UTF-8 text (the "→") intact."""
    import email
    import email.policy

    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Sink

    class Keep(Sink):
        def __init__(self) -> None:
            self.got: list[tuple[list[str], bytes]] = []

        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
            self.got.append((list(envelope.rcpt_tos), envelope.original_content or envelope.content))
            return "250 OK"

    handler = Keep()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        with override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
                               EMAIL_PORT=controller.port, EMAIL_TIMEOUT=10, DEFAULT_FROM_EMAIL="ty@example.com",
                               STUDIO_PUBLIC_URL="http://studio.lan:8000"):
            notify.create_channel(project=project, user=None, name="team", kind="email",
                                  emails=["a@example.com", "b@example.com"])
            job, [delivery_id] = _fire(project)
            assert notify.deliver(delivery_id) == "delivered"
    finally:
        controller.stop()
    [(recipients, raw)] = handler.got
    assert sorted(recipients) == ["a@example.com", "b@example.com"]
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert message["Subject"].startswith("[Trainyard acme] charlm: rule loss-nan is ALARM")
    body = message.get_content()
    assert "OK → ALARM at 2026-12-07 01:40:12 UTC, step 3000" in body
    assert f"http://studio.lan:8000/jobs/{job.pk}/" in body
