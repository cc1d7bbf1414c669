"""Notification channels and signed deliveries (studio.notify) against a real HTTP receiver
(http.server in a thread), Django's locmem and SMTP mail backends, a real Celery worker for
the on-commit path, and the API's roles, validation and one-time secrets."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.db import transaction
from django.test import override_settings
from standardwebhooks.webhooks import Webhook as StandardWebhook
from standardwebhooks.webhooks import WebhookVerificationError

from studio import notify
from studio.embedded_redis import free_port
from studio.errors import FieldError
from studio.models import Delivery, NotificationChannel
from studio.version import VERSION
from tests.conftest import wait_for


# --- a webhook receiver -------------------------------------------------------------------------
@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    url: str
    requests: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered in order; 200 once they run out
    answer_body: bytes = b"ok"
    hold: threading.Event | None = None  # when set, each request waits for it before answering
    extra_headers: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append(Received(self.path, dict(self.headers.items()), body, time.monotonic()))
            if state.hold is not None:
                state.hold.wait(10)
            code = state.statuses.pop(0) if state.statuses else 200
            self.send_response(code)
            for name, value in state.extra_headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(state.answer_body)))
            self.end_headers()
            self.wfile.write(state.answer_body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/trainyard"
    yield state
    if state.hold is not None:
        state.hold.set()
    server.shutdown()
    server.server_close()


def webhook(project, url: str, name: str = "on-call") -> tuple[NotificationChannel, str]:
    return notify.create_channel(project=project, user=None, name=name, kind="webhook", url=url)


QUICK = {"STUDIO_WEBHOOK_ATTEMPTS": 3, "STUDIO_WEBHOOK_BACKOFF_SECONDS": 0.5, "STUDIO_WEBHOOK_TIMEOUT_SECONDS": 5}


# --- signatures ----------------------------------------------------------------------------------
def test_sign_and_verify_follow_the_documented_scheme():
    body, secret, now = b'{"a":1}', "s3cret", 1_700_000_000
    header = notify.sign(secret, body, now)
    expected = hmac.new(b"s3cret", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    assert notify.verify(secret, body, header, now=now + 299)
    assert not notify.verify(secret, body, header, now=now + 301)  # a replay, too old
    assert not notify.verify("other", body, header, now=now)
    assert not notify.verify(secret, body, "t=\u00b2,v1=ab", now=now)  # "²".isdigit(), but no int: False, not a raise
    assert not notify.verify(secret, body + b" ", header, now=now)
    for malformed in ("", "t=abc,v1=00", f"v1={expected}", "t=1700000000", "garbage"):
        assert not notify.verify(secret, body, malformed, now=now)


# --- webhooks -----------------------------------------------------------------------------------
def test_a_delivery_arrives_once_signed_and_its_body_is_the_stored_payload(project, receiver):
    channel, secret = webhook(project, receiver.url)
    ids = notify.notify(project.pk, "alarm.transition", {"summary": "loss is NaN", "value": float("nan"), "step": 3000})
    assert len(ids) == 1
    assert notify.deliver(ids[0]) == "delivered"

    assert len(receiver.requests) == 1
    got = receiver.requests[0]
    assert got.path == "/hooks/trainyard"
    header = got.headers["X-Trainyard-Signature"]
    assert notify.verify(secret, got.body, header)
    timestamp, v1 = (part.split("=", 1)[1] for part in header.split(","))
    assert v1 == hmac.new(secret.encode(), f"{timestamp}.".encode() + got.body, hashlib.sha256).hexdigest()
    assert got.headers["X-Trainyard-Event"] == "alarm.transition"
    assert got.headers["X-Trainyard-Delivery"] == str(ids[0])
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["User-Agent"] == f"Trainyard/{VERSION}"
    # The same delivery verifies with the Standard Webhooks library, given the secret in its form.
    hook = StandardWebhook(notify.standard_webhooks_secret(secret))
    assert hook.verify(got.body, got.headers) == json.loads(got.body)
    lower = {name.lower(): value for name, value in got.headers.items()}  # urllib sends "Webhook-id"
    assert lower["webhook-id"] == str(ids[0]) and lower["webhook-timestamp"] == timestamp
    with pytest.raises(WebhookVerificationError):
        hook.verify(got.body.replace(b"NaN", b"0.5"), got.headers)
    with pytest.raises(WebhookVerificationError):
        StandardWebhook(notify.standard_webhooks_secret("another")).verify(got.body, got.headers)

    delivery = Delivery.objects.get(pk=ids[0])
    assert json.loads(got.body) == delivery.payload
    assert delivery.payload["event"] == "alarm.transition" and delivery.payload["project"] == "acme"
    assert delivery.payload["delivery"] == delivery.pk
    assert delivery.payload["data"] == {"summary": "loss is NaN", "value": "NaN", "step": 3000}
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("delivered", 1, 200)
    assert delivery.delivered_at is not None and delivery.last_error == ""

    assert notify.deliver(ids[0]) == "skipped"  # settled: never sent twice
    assert notify.retry_due() == 0
    assert len(receiver.requests) == 1


@override_settings(**QUICK)
def test_a_receiver_answering_500_is_retried_with_back_off_then_the_delivery_fails(project, receiver):
    receiver.statuses = [500, 500, 500]
    receiver.answer_body = b"upstream exploded " + b"x" * 500
    webhook(project, receiver.url)
    [delivery_id] = notify.notify(project.pk, "alarm.transition", {"summary": "stalled"})

    assert notify.deliver(delivery_id) == "pending"
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempts == 1 and delivery.response_status == 500
    assert delivery.last_error.startswith("HTTP 500: upstream exploded x")
    assert len(delivery.last_error) == len("HTTP 500: ") + 200
    assert notify.retry_due() == 0  # not due yet: its back-off has not passed

    wait_for(lambda: notify.retry_due() == 1, timeout=5, interval=0.05, message="the second try")
    wait_for(lambda: notify.retry_due() == 1, timeout=5, interval=0.05, message="the third try")
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.next_attempt_at) == ("failed", 3, None)
    assert delivery.last_error.startswith("HTTP 500: upstream exploded")
    assert len(receiver.requests) == 3
    gaps = [later.at - earlier.at for earlier, later in zip(receiver.requests, receiver.requests[1:], strict=False)]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, gaps  # backoff · 2^(attempts - 1)
    # Each try is signed afresh, over the same stored bytes.
    assert len({r.body for r in receiver.requests}) == 1
    assert notify.retry_due() == 0 and notify.deliver(delivery_id) == "skipped"


@override_settings(**QUICK)
def test_a_receiver_that_is_down_ends_failed_with_connection_refused(project):
    webhook(project, f"http://127.0.0.1:{free_port()}/nobody-listens")
    with transaction.atomic():  # the sender's own work goes on and commits
        [delivery_id] = notify.notify(project.pk, "alarm.transition", {"summary": "x"})
    assert notify.deliver(delivery_id) == "pending"
    wait_for(lambda: (notify.retry_due(), Delivery.objects.get(pk=delivery_id).status)[1] == "failed",
             timeout=8, interval=0.05, message="the delivery to fail")
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("failed", 3, "connection refused")
    assert delivery.response_status is None and delivery.delivered_at is None


def test_redirects_are_recorded_not_followed(project, receiver):
    receiver.statuses = [302]
    receiver.extra_headers = {"Location": "http://127.0.0.1:1/elsewhere"}
    webhook(project, receiver.url)
    [delivery_id] = notify.notify(project.pk, "test", {})
    assert notify.deliver(delivery_id) == "pending"
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.response_status == 302 and "not followed" in delivery.last_error
    assert len(receiver.requests) == 1


def test_a_try_in_flight_is_not_started_again_by_another_worker(transactional_db, project, receiver):
    receiver.hold = threading.Event()
    webhook(project, receiver.url)
    [delivery_id] = notify.notify(project.pk, "alarm.transition", {})
    outcome: list[str] = []
    first = threading.Thread(target=lambda: outcome.append(notify.deliver(delivery_id)))
    first.start()
    wait_for(lambda: receiver.requests, timeout=5, interval=0.02, message="the first try to reach the receiver")
    # A second message for the same delivery, and the sweep, while the first try waits:
    assert notify.deliver(delivery_id) == "skipped"
    assert notify.retry_due() == 0
    receiver.hold.set()
    first.join(10)
    assert outcome == ["delivered"]
    assert len(receiver.requests) == 1


def test_the_sweep_sends_a_delivery_whose_task_message_was_lost(project, receiver):
    from datetime import timedelta

    from django.utils import timezone

    webhook(project, receiver.url)
    [delivery_id] = notify.notify(project.pk, "alarm.transition", {})
    assert notify.retry_due() == 0  # a fresh one is its task's to send
    Delivery.objects.filter(pk=delivery_id).update(created_at=timezone.now() - timedelta(seconds=11))
    assert notify.retry_due() == 1
    assert Delivery.objects.get(pk=delivery_id).status == "delivered" and len(receiver.requests) == 1


def test_notify_picks_named_enabled_channels_and_never_raises(project, other_project, receiver, caplog):
    webhook(project, receiver.url, name="a")
    webhook(project, receiver.url, name="b")
    disabled, _ = webhook(project, receiver.url, name="off")
    notify.update_channel(disabled, {"enabled": False})
    webhook(other_project, receiver.url, name="a")

    assert len(notify.notify(project.pk, "e", {})) == 2
    named = notify.notify(project.pk, "e", {}, channels=["b", "off", "missing"])
    assert [Delivery.objects.get(pk=pk).channel.name for pk in named] == ["b"]
    assert "missing" in caplog.text and "off" in caplog.text
    assert notify.notify(project.pk, "e", {}, channels=[]) == []

    with transaction.atomic():
        before = Delivery.objects.count()
        assert notify.notify(project.pk, "e", {"not json": object()}) == []  # logged, not raised
        assert Delivery.objects.count() == before  # the caller's transaction is still usable
    assert "deliveries not recorded" in caplog.text


def test_a_channel_disabled_before_its_delivery_goes_stops_it(project, receiver):
    channel, _ = webhook(project, receiver.url)
    [delivery_id] = notify.notify(project.pk, "alarm.transition", {})
    notify.update_channel(channel, {"enabled": False})
    assert notify.deliver(delivery_id) == "failed"
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempts == 0 and "disabled" in delivery.last_error and receiver.requests == []
    [test_id] = [notify.send_test(channel, None).pk]  # a test still goes to a disabled channel
    assert notify.deliver(test_id) == "delivered" and len(receiver.requests) == 1


@override_settings(STUDIO_WEBHOOK_DENIED_NETWORKS=["127.0.0.0/8", "::1/128"])
def test_a_host_that_resolves_into_a_denied_network_is_not_sent_to(project, receiver):
    # The name passes when saved; each try resolves it and refuses a denied address (a name
    # can be pointed at the metadata service after the channel was saved).
    # No retry would reach it: failed at once, saying why (it was retried 5 times over an hour).
    channel, _ = webhook(project, receiver.url.replace("127.0.0.1", "localhost"))
    [delivery_id] = notify.notify(project.pk, "e", {})
    assert notify.deliver(delivery_id) == "failed"
    delivery = Delivery.objects.get(pk=delivery_id)
    error = delivery.last_error
    assert "localhost resolves to" in error and "STUDIO_WEBHOOK_DENIED_NETWORKS" in error, error
    assert delivery.attempts == 1 and delivery.next_attempt_at is None
    assert receiver.requests == []
    with override_settings(STUDIO_WEBHOOK_DENIED_NETWORKS=[]):
        [allowed_id] = notify.notify(project.pk, "e", {})
        assert notify.deliver(allowed_id) == "delivered" and len(receiver.requests) == 1
    # A literal address in a denied network is refused when the channel is saved.
    assert "STUDIO_WEBHOOK_DENIED_NETWORKS" in notify.webhook_url_problem("http://127.0.0.1:9/x")
    assert notify.webhook_url_problem("http://[::ffff:127.0.0.1]:9/x") is not None


def test_a_row_that_is_not_http_is_never_fetched(project):
    channel, _ = webhook(project, "http://example.invalid/")
    NotificationChannel.objects.filter(pk=channel.pk).update(url="file:///etc/passwd")
    [delivery_id] = notify.notify(project.pk, "e", {})
    assert notify.deliver(delivery_id) == "failed", "no retry fetches it either"
    assert "http" in Delivery.objects.get(pk=delivery_id).last_error


@pytest.mark.parametrize("host", ["2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518", "0xA9.254.169.254"])
def test_a_denied_address_written_as_a_number_is_refused_when_saved(project, host):
    """Seen in a walk: http://2852039166/ (169.254.169.254, the metadata service, as one
    number) was accepted, then refused at each of five tries over an hour."""
    problem = notify.webhook_url_problem(f"http://{host}/latest/meta-data/")
    assert problem is not None and "169.254.169.254" in problem and "STUDIO_WEBHOOK_DENIED_NETWORKS" in problem, problem
    channel, _ = webhook(project, "http://hooks.example.com/x")
    with pytest.raises(FieldError) as refused:
        notify.update_channel(channel, {"url": f"http://{host}/"})
    assert refused.value.field == "url" and "169.254.169.254" in str(refused.value), vars(refused.value)


def test_numbers_outside_the_denied_networks_and_names_that_look_numeric_pass():
    assert notify.ipv4_literal("2130706433") == "127.0.0.1"
    assert notify.webhook_url_problem("http://2130706433:9/x") is None, "loopback is not denied by default"
    assert notify.ipv4_literal("10.0.0.5") == "10.0.0.5" and notify.ipv4_literal("hooks.example.com") is None
    assert notify.ipv4_literal("123.example") is None and notify.ipv4_literal("1.2.3.4.5") is None
    assert notify.webhook_url_problem("http://169.254.169.254.nip.io/") is None, "a name: checked when resolved"


def test_channel_names_are_unique_without_case(project):
    webhook(project, "http://hooks.example.com/a", name="Ops")
    with pytest.raises(FieldError, match="'Ops' already exists"):
        webhook(project, "http://hooks.example.com/b", name="ops")
    other, _ = webhook(project, "http://hooks.example.com/c", name="pager")
    with pytest.raises(FieldError, match="'Ops' already exists"):
        notify.update_channel(other, {"name": "OPS"})
    notify.update_channel(other, {"name": "Pager"})  # its own name in another case is fine
    assert sorted(NotificationChannel.objects.filter(project=project).values_list("name", flat=True)) == ["Ops", "Pager"]


def test_verify_needs_no_django():
    """A receiver checks a delivery with trainyard.webhooks.verify, which imports no Django
    (studio.notify.verify needed settings configured and django.setup())."""
    import subprocess
    import sys

    code = ("import sys, time; from trainyard.webhooks import sign, verify; now = int(time.time()); "
            "assert verify('s', b'{}', sign('s', b'{}', now)); assert not verify('t', b'{}', sign('s', b'{}', now)); "
            "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules), 'django imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert notify.verify is __import__("trainyard.webhooks", fromlist=["verify"]).verify


# --- e-mail ---------------------------------------------------------------------------------------
@override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend", DEFAULT_FROM_EMAIL="ty@example.com")
def test_an_email_channel_sends_through_the_mail_backend(project):
    notify.create_channel(project=project, user=None, name="team", kind="email", emails=["a@example.com", "b@example.com"])
    [delivery_id] = notify.notify(project.pk, "alarm.transition", {"summary": "loss\nis NaN on job 7", "step": 3})
    mail.outbox.clear()
    assert notify.deliver(delivery_id) == "delivered"
    [message] = mail.outbox
    assert message.to == ["a@example.com", "b@example.com"] and message.from_email == "ty@example.com"
    assert message.subject == "[Trainyard acme] loss is NaN on job 7"
    # A person reads the summary first; the event as a webhook gets it follows the signature line.
    text, _, event = str(message.body).partition("\n\n-- \n")
    assert text == "loss\nis NaN on job 7"
    assert json.loads(event.split("\n", 1)[1]) == Delivery.objects.get(pk=delivery_id).payload
    assert Delivery.objects.get(pk=delivery_id).payload["text"] == "loss\nis NaN on job 7"


@override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
                   EMAIL_PORT=free_port(), EMAIL_TIMEOUT=5, **QUICK)
def test_an_email_channel_whose_mail_server_is_down_is_retried_then_fails(project):
    notify.create_channel(project=project, user=None, name="team", kind="email", emails=["a@example.com"])
    [delivery_id] = notify.notify(project.pk, "alarm.transition", {})
    assert notify.deliver(delivery_id) == "pending"
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempts == 1 and "connection refused" in delivery.last_error
    wait_for(lambda: (notify.retry_due(), Delivery.objects.get(pk=delivery_id).status)[1] == "failed",
             timeout=8, interval=0.05, message="the e-mail delivery to fail")
    assert Delivery.objects.get(pk=delivery_id).attempts == 3


# --- the on-commit path, through a real worker -------------------------------------------------
def test_notify_sends_after_commit_through_a_celery_worker(celery_worker, project, receiver):
    channel, secret = webhook(project, receiver.url)
    with transaction.atomic():
        [delivery_id] = notify.notify(project.pk, "alarm.transition", {"summary": "committed"})
        time.sleep(0.5)
        assert receiver.requests == []  # nothing leaves before the sender's transaction commits
    wait_for(lambda: receiver.requests, timeout=30, message="the worker's delivery")
    assert notify.verify(secret, receiver.requests[0].body, receiver.requests[0].headers["X-Trainyard-Signature"])
    wait_for(lambda: Delivery.objects.get(pk=delivery_id).status == "delivered", timeout=10, message="delivered")
    assert len(receiver.requests) == 1


def test_a_rolled_back_notify_queues_nothing(project, receiver, django_capture_on_commit_callbacks):
    webhook(project, receiver.url)
    with django_capture_on_commit_callbacks() as callbacks:
        try:
            with transaction.atomic():
                notify.notify(project.pk, "e", {})
                raise RuntimeError("the sender's work failed")
        except RuntimeError:
            pass
    assert callbacks == [] and Delivery.objects.count() == 0
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        notify.notify(project.pk, "e", {})
    assert len(callbacks) == 1 and Delivery.objects.count() == 1


# --- the API --------------------------------------------------------------------------------------
BASE = "/api/v1/projects/acme/notification-channels/"


def test_only_admins_create_channels_and_the_secret_is_shown_once(owner, teammate, viewer, client_for, receiver):
    body = {"name": "on-call", "kind": "webhook", "url": receiver.url}
    for user in (teammate, viewer):
        response = client_for(user).post(BASE, body, format="json")
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "permission_denied"
    admin = client_for(owner)
    created = admin.post(BASE, body, format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    secret = data["secret"]
    assert len(secret) >= 40 and data["has_secret"] is True and data["url"] == receiver.url
    assert NotificationChannel.objects.get(pk=data["id"]).secret == secret

    listing = admin.get(BASE).json()
    assert listing["count"] == 1 and "secret" not in listing["results"][0]
    assert listing["results"][0]["url"] == receiver.url
    assert secret not in admin.get(f"{BASE}{data['id']}/").content.decode()
    # Readers see that it exists, not where it sends.
    for user in (teammate, viewer):
        row = client_for(user).get(BASE).json()["results"][0]
        assert row["name"] == "on-call" and row["kind"] == "webhook" and row["enabled"] is True
        assert "url" not in row and "emails" not in row and "secret" not in row
        assert client_for(user).get(f"{BASE}{data['id']}/deliveries/").status_code == 403
        assert client_for(user).patch(f"{BASE}{data['id']}/", {"enabled": False}, format="json").status_code == 403
        assert client_for(user).post(f"{BASE}{data['id']}/test/").status_code == 403

    rotated = admin.post(f"{BASE}{data['id']}/rotate-secret/")
    assert rotated.status_code == 200
    assert rotated.json()["secret"] != secret
    assert NotificationChannel.objects.get(pk=data["id"]).secret == rotated.json()["secret"]
    for shown in (data, rotated.json()):  # the same secret in the form Standard Webhooks libraries take
        assert shown["standard_webhooks_secret"] == notify.standard_webhooks_secret(shown["secret"])
    assert data["standard_webhooks_secret"] not in admin.get(f"{BASE}{data['id']}/").content.decode()


def test_outsiders_and_reviewers_do_not_see_the_channels(project, owner, outsider, reviewer, client_for):
    channel, _ = webhook(project, "https://hooks.example.com/x")
    for user in (outsider, reviewer):
        assert client_for(user).get(BASE).status_code == 404
        assert client_for(user).get(f"{BASE}{channel.pk}/").status_code == 404
    assert client_for(owner).get(f"{BASE}999999/").status_code == 404
    assert client_for(owner).get(f"{BASE}{2**63}/").status_code == 404


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "webhook", "url": "https://x.example/"}, "name"),
    ({"name": "", "kind": "webhook", "url": "https://x.example/"}, "name"),
    ({"name": "n" * 101, "kind": "webhook", "url": "https://x.example/"}, "name"),
    ({"name": "a\x01b", "kind": "webhook", "url": "https://x.example/"}, "name"),
    ({"name": "a\x00b", "kind": "webhook", "url": "https://x.example/"}, "name"),
    ({"name": "n", "kind": "sms"}, "kind"),
    ({"name": "n", "kind": "webhook"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "file:///etc/passwd"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "javascript:alert(1)"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "http:///no-host"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "https://user:pw@x.example/"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "https://x.example:99999/"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "https://x.example/" + "a" * 3000}, "url"),
    ({"name": "n", "kind": "webhook", "url": "http://169.254.169.254/latest/meta-data/"}, "url"),  # cloud metadata
    ({"name": "n", "kind": "webhook", "url": "http://[fd00:ec2::254]/latest/"}, "url"),
    ({"name": "n", "kind": "webhook", "url": "http://[::ffff:169.254.169.254]/"}, "url"),
    ({"name": "n", "kind": "email"}, "emails"),
    ({"name": "n", "kind": "email", "emails": []}, "emails"),
    ({"name": "n", "kind": "email", "emails": ["not-an-address"]}, "emails"),
    ({"name": "n", "kind": "email", "emails": "a@example.com"}, "emails"),
    ({"name": "n", "kind": "email", "emails": [f"u{i}@example.com" for i in range(21)]}, "emails"),
])
def test_bad_channels_are_a_400_naming_the_field(owner, client_for, body, field):
    response = client_for(owner).post(BASE, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert NotificationChannel.objects.count() == 0


def test_names_are_unique_per_project_and_kinds_fixed(owner, client_for):
    admin = client_for(owner)
    first = admin.post(BASE, {"name": "team", "kind": "email", "emails": ["a@example.com"]}, format="json").json()
    assert first["secret"] is None and first["has_secret"] is False and first["emails"] == ["a@example.com"]
    again = admin.post(BASE, {"name": "team", "kind": "webhook", "url": "https://x.example/"}, format="json")
    assert again.status_code == 400 and "name" in again.json()["error"]["fields"]
    other = admin.post(BASE, {"name": "hook", "kind": "webhook", "url": "https://x.example/"}, format="json").json()
    rename = admin.patch(f"{BASE}{other['id']}/", {"name": "team"}, format="json")
    assert rename.status_code == 400 and "name" in rename.json()["error"]["fields"]
    assert admin.patch(f"{BASE}{other['id']}/", {"kind": "email"}, format="json").status_code == 400
    assert "emails" in admin.patch(f"{BASE}{other['id']}/", {"emails": ["a@example.com"]}, format="json").json()["error"]["fields"]
    assert "url" in admin.patch(f"{BASE}{other['id']}/", {"url": ""}, format="json").json()["error"]["fields"]
    assert "url" in admin.patch(f"{BASE}{first['id']}/", {"url": "https://x.example/"}, format="json").json()["error"]["fields"]
    assert admin.patch(f"{BASE}{other['id']}/", ["not", "an", "object"], format="json").status_code == 400
    assert admin.post(f"{BASE}{first['id']}/rotate-secret/").status_code == 409

    changed = admin.patch(f"{BASE}{other['id']}/", {"enabled": False, "url": "https://y.example/h"}, format="json")
    assert changed.status_code == 200 and changed.json()["enabled"] is False and changed.json()["url"] == "https://y.example/h"
    assert admin.delete(f"{BASE}{other['id']}/").status_code == 204
    assert not NotificationChannel.objects.filter(pk=other["id"]).exists()


def test_test_action_and_the_deliveries_list(owner, client_for, receiver, django_assert_max_num_queries):
    admin = client_for(owner)
    channel = admin.post(BASE, {"name": "hook", "kind": "webhook", "url": receiver.url}, format="json").json()
    sent = admin.post(f"{BASE}{channel['id']}/test/")
    assert sent.status_code == 201, sent.content
    assert sent.json()["event"] == "test" and sent.json()["status"] == "pending"
    assert notify.deliver(sent.json()["id"]) == "delivered"
    assert json.loads(receiver.requests[0].body)["data"]["requested_by"] == "owner"
    for _ in range(3):
        notify.deliver(admin.post(f"{BASE}{channel['id']}/test/").json()["id"])
    with django_assert_max_num_queries(8):
        page = admin.get(f"{BASE}{channel['id']}/deliveries/?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2
    newest = page["results"][0]
    assert newest["id"] > page["results"][1]["id"]
    assert {"id", "event", "status", "attempts", "last_error", "response_status", "created_at", "delivered_at"} <= set(newest)
    assert newest["status"] == "delivered" and newest["response_status"] == 200 and newest["attempts"] == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "w", "kind": "webhook", "url": "https://hooks.example.com/x", "emails": ["a@example.com"]}, "emails"),
    ({"name": "e", "kind": "email", "emails": ["a@example.com"], "url": "https://hooks.example.com/x"}, "url")])
def test_a_channel_given_the_other_kinds_field_is_a_400_naming_it(owner, client_for, body, field):
    """It was silently dropped at creation (and a PATCH refused the same field)."""
    response = client_for(owner).post(BASE, body, format="json")
    assert response.status_code == 400 and set(response.json()["error"]["fields"]) == {field}, response.json()
    assert not NotificationChannel.objects.exists()


def test_a_patch_giving_a_channel_the_other_kinds_field_says_so_as_creation_does(owner, client_for):
    admin = client_for(owner)
    made = admin.post(BASE, {"name": "mail", "kind": "email", "emails": ["a@example.com"]}, format="json").json()
    refused = admin.patch(f"{BASE}{made['id']}/", {"url": "https://hooks.example.com/z"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]["url"] == [
        "An e-mail channel sends to its emails; leave url out (or make a webhook channel)."], refused.json()
