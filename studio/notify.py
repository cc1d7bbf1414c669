"""Project notification channels and their deliveries: a webhook (a signed JSON POST) or an
e-mail list (Django's mail backend).

Senders call `notify(project_id, event, payload)`: one Delivery row per enabled channel,
sent by `deliver_task` once the caller's transaction commits, retried with back-off by the
beat sweep (`retry_due`, every 5 s). Nothing here raises into the sender: an alarm must not
fail because a channel is broken.

Receivers check the `X-Trainyard-Signature` header (Stripe's scheme)::

    t=<unix seconds>,v1=<hex HMAC-SHA256(secret, b"<t>." + raw body)>

with `verify(secret, raw_body, header)` or the same five lines in their own language: split
the header on commas, recompute the HMAC over the timestamp, a dot and the raw bytes, compare
in constant time, and refuse a timestamp more than five minutes away (a replay)."""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import mail
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from studio.errors import ActionError, FieldError
from studio.models import Delivery, NotificationChannel, Project
from studio.networks import Network, in_networks, networks
from studio.version import VERSION
from trainyard.webhooks import (  # noqa: F401 - re-exported: studio.notify.verify and its headers as before
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    SIGNATURE_TOLERANCE_SECONDS,
    STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER,
    STANDARD_TIMESTAMP_HEADER,
    sign,
    standard_signature,
    standard_webhooks_secret,
    verify,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)

LOST_MESSAGE_SECONDS = 10  # a delivery never tried after this long lost its task message
SWEEP_BUDGET_SECONDS = 4.0  # under the beat period (5 s): the rest waits for the next sweep
SWEEP_BATCH = 100
MAX_EMAILS = 20
ERROR_BODY_CHARS = 200


# --- signatures (trainyard.webhooks, Django-free, for receivers too) ---------------------------
def new_secret() -> str:
    return secrets.token_urlsafe(32)


# --- what a channel may hold (the API's serializer and the page's form both ask) ------------
def webhook_url_problem(url: str) -> str | None:
    """Why `url` cannot be a webhook's address, or None: http(s) with a host, no spaces or
    control characters, no user:password@ (credentials would be logged with the URL)."""
    if not url:
        return "A webhook needs a URL."
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "The URL cannot contain spaces or control characters."
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when it is not a number in 0–65535
    except ValueError:
        return "Not a valid URL."
    if parts.scheme.lower() not in ("http", "https"):
        return "Use an http:// or https:// URL."
    if not parts.hostname:
        return "The URL needs a host name, e.g. https://hooks.example.com/trainyard."
    if parts.username is not None or parts.password is not None:
        return "Leave credentials out of the URL; receivers check the signature header instead."
    if port == 0:
        return "Not a valid port."
    if in_networks(parts.hostname, denied_networks()):
        return f"{parts.hostname} is in STUDIO_WEBHOOK_DENIED_NETWORKS: the studio sends no webhook there."
    address = ipv4_literal(parts.hostname)
    if address is not None and in_networks(address, denied_networks()):
        return (f"{parts.hostname} is the address {address}, in STUDIO_WEBHOOK_DENIED_NETWORKS: the studio sends no "
                f"webhook there.")
    return None


IPV4_SHORTHAND = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


def ipv4_literal(host: str) -> str | None:
    """The dotted IPv4 address a host written as a number stands for — 2852039166,
    0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518 are all 169.254.169.254 to the resolver
    (inet_aton's forms) — or None for a name or an address already in dotted form."""
    if not IPV4_SHORTHAND.match(host):
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def denied_networks() -> tuple[Network, ...]:
    return networks(tuple(getattr(settings, "STUDIO_WEBHOOK_DENIED_NETWORKS", ())), "STUDIO_WEBHOOK_DENIED_NETWORKS")


def _denied_address(host: str, port: int | None) -> str | None:
    """The first address `host` resolves to that is in STUDIO_WEBHOOK_DENIED_NETWORKS, or
    None (a name that does not resolve is left to the POST, which says so). Checked before
    each try: a name may point somewhere new since the channel was saved."""
    denied = denied_networks()
    if not denied:
        return None
    try:
        found = socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    return next((str(info[4][0]) for info in found if in_networks(str(info[4][0]), denied)), None)


def email_problem(address: str) -> str | None:
    try:
        validate_email(address)
    except ValidationError:
        return f"Not a valid e-mail address: {address[:100]}"
    return None


# --- channels (the page and the API call these) -----------------------------------------------
def create_channel(*, project: Project, user: User | None, name: str, kind: str, url: str = "",
                   emails: list[str] | None = None, enabled: bool = True) -> tuple[NotificationChannel, str]:
    """A new channel and its signing secret (webhooks; "" for e-mail), shown to the caller
    once and never again. The name is unique in the project (a 400 on `name`)."""
    webhook = kind == NotificationChannel.Kind.WEBHOOK
    secret = new_secret() if webhook else ""
    if taken := NotificationChannel.objects.filter(project=project, name__iexact=name).first():
        raise FieldError("name", f"A channel named '{taken.name}' already exists in this project (names are compared "
                                 f"without case: a rule's channels name them).")
    try:
        with transaction.atomic():
            channel = NotificationChannel.objects.create(
                project=project, name=name, kind=kind, url=url if webhook else "",
                emails=[] if webhook else list(emails or []), secret=secret, enabled=enabled, created_by=user)
    except IntegrityError as exc:  # created by someone else since the check above
        raise FieldError("name", f"A channel named '{name}' already exists in this project.") from exc
    return channel, secret


def update_channel(channel: NotificationChannel, changes: dict[str, Any]) -> NotificationChannel:
    """Apply validated `changes` (name, url, emails, enabled); the kind never changes."""
    fields = [name for name in ("name", "url", "emails", "enabled") if name in changes]
    if "name" in changes and changes["name"] != channel.name and (taken := NotificationChannel.objects.filter(
            project_id=channel.project_id, name__iexact=changes["name"]).exclude(pk=channel.pk).first()):
        raise FieldError("name", f"A channel named '{taken.name}' already exists in this project (names are compared "
                                 f"without case).")
    for name in fields:
        setattr(channel, name, changes[name])
    if channel.kind == NotificationChannel.Kind.WEBHOOK and "url" in fields and webhook_url_problem(channel.url):
        raise FieldError("url", webhook_url_problem(channel.url) or "")
    if channel.kind == NotificationChannel.Kind.EMAIL and "emails" in fields and not channel.emails:
        raise FieldError("emails", "An e-mail channel needs at least one address.")
    if fields:
        try:
            with transaction.atomic():
                channel.save(update_fields=fields)
        except IntegrityError as exc:
            raise FieldError("name", f"A channel named '{channel.name}' already exists in this project.") from exc
    return channel


def delete_channel(channel: NotificationChannel) -> None:
    channel.delete()  # its deliveries go with it; a try in flight finds its row gone and stops


def rotate_secret(channel: NotificationChannel) -> str:
    """A new signing secret, in force for the next try of every delivery; the old one stops
    verifying at once (receivers update theirs first, or accept both for a while)."""
    if channel.kind != NotificationChannel.Kind.WEBHOOK:
        raise ActionError("An e-mail channel has no signing secret.", status=409, code="conflict")
    secret = new_secret()
    NotificationChannel.objects.filter(pk=channel.pk).update(secret=secret)
    channel.secret = secret
    return secret


def send_test(channel: NotificationChannel, user: User | None) -> Delivery:
    """A "test" delivery to this channel (enabled or not), sent once the request commits."""
    payload = {"summary": f"Test notification for channel '{channel.name}'",
               "channel": channel.name, "requested_by": user.get_username() if user else None}
    delivery = _create_delivery(channel, "test", payload, timezone.now())
    transaction.on_commit(lambda: _enqueue([delivery.pk]))
    return delivery


# --- notify: rows first, sent after commit ------------------------------------------------------
def notify(project_id: int, event: str, payload: dict, *, channels: Iterable[str] | None = None) -> list[int]:
    """One Delivery per enabled channel of the project (those named in `channels`, or all),
    sent after the caller's transaction commits. Returns their ids; never raises (a failure
    is logged and whatever was not recorded is lost, not the caller's work)."""
    try:
        with transaction.atomic():  # a savepoint: a database error here leaves the caller's transaction usable
            found = list(NotificationChannel.objects.filter(project_id=project_id, enabled=True).select_related("project"))
            # Names are compared without case, as they are unique (create_channel).
            wanted = None if channels is None else {name.casefold() for name in channels}
            if wanted is not None:
                found = [channel for channel in found if channel.name.casefold() in wanted]
            if wanted is not None and (missing := wanted - {channel.name.casefold() for channel in found}):
                log.warning("notify(%s, %s): no enabled channel named %s in project %s; skipped",
                            project_id, event, ", ".join(sorted(missing)), project_id)
            now = timezone.now()
            ids = [_create_delivery(channel, event, payload, now).pk for channel in found]
    except Exception:  # noqa: BLE001 - by contract nothing reaches the sender
        log.exception("notify(%s, %s): deliveries not recorded", project_id, event)
        return []
    if ids:
        transaction.on_commit(lambda: _enqueue(ids))
    return ids


def _json_ready(value: Any) -> Any:
    """JSON with no NaN or Infinity (neither JSON nor a jsonb column holds them): a NaN
    loss is sent as the string "NaN" — exactly what an alarm about it wants to say."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


def public_link(path: str) -> str | None:
    """`path` on the studio as its users reach it (STUDIO_PUBLIC_URL), None when unset."""
    base = getattr(settings, "STUDIO_PUBLIC_URL", "")
    return f"{base}{path}" if base else None


def _text(event: str, payload: dict) -> str:
    """What a person reads: the sender's own `text`, else its summary, else the event."""
    for key in ("text", "summary"):
        if isinstance(payload.get(key), str) and payload[key].strip():
            return payload[key]
    return f"Trainyard event {event}"


def _create_delivery(channel: NotificationChannel, event: str, payload: dict, now) -> Delivery:
    event = event[:64]
    delivery = Delivery.objects.create(channel=channel, event=event, payload={}, created_at=now)
    # `text` on top, as Slack-style incoming webhooks read a message; the e-mail's body.
    body = {"event": event, "delivery": delivery.pk, "project": channel.project.slug,
            "sent_at": now.isoformat(), "text": _text(event, payload), "data": payload}
    # Through DjangoJSONEncoder and back: datetimes, decimals and UUIDs as JSON writes them,
    # so what is stored is exactly what is sent.
    delivery.payload = json.loads(json.dumps(_json_ready(body), cls=DjangoJSONEncoder, allow_nan=False))
    Delivery.objects.filter(pk=delivery.pk).update(payload=delivery.payload)
    return delivery


def _enqueue(ids: list[int]) -> None:
    from studio.tasks import deliver_task

    for delivery_id in ids:
        try:
            # retry=False: a broker that is down must not stall the sender; the sweep
            # finds the delivery (never tried, LOST_MESSAGE_SECONDS old) and sends it.
            deliver_task.apply_async((delivery_id,), retry=False)
        except Exception:  # noqa: BLE001 - the sweep retries it
            log.warning("delivery %s: could not be queued; the retry sweep will send it", delivery_id, exc_info=True)


# --- one try ---------------------------------------------------------------------------------------
def body_bytes(payload: dict) -> bytes:
    """The exact bytes sent (and signed) for a stored payload."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def backoff_seconds(attempts: int) -> float:
    """How long after its `attempts`-th failed try a delivery is tried again."""
    return float(settings.STUDIO_WEBHOOK_BACKOFF_SECONDS) * 2 ** max(0, attempts - 1)


def _lease_seconds() -> float:
    # While a try runs, next_attempt_at is pushed past it, so the sweep leaves it alone;
    # a worker that dies mid-try frees it when the lease runs out.
    return 2 * float(settings.STUDIO_WEBHOOK_TIMEOUT_SECONDS) + 30


def deliver(delivery_id: int) -> str:
    """One try of a delivery; returns its status afterwards, or "skipped" when it is not
    due, already settled, gone, or being tried by another worker.

    1. Claim: a compare-and-set on (status pending, attempts, due) that pushes
       next_attempt_at past the try — a second worker's claim matches no row.
    2. Send: the webhook POST (signed, redirects not followed) or the e-mail.
    3. Record the outcome with a compare-and-set on the claimed attempts count."""
    now = timezone.now()
    delivery = Delivery.objects.select_related("channel", "channel__project").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != Delivery.Status.PENDING:
        return "skipped"
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    claimed = Delivery.objects.filter(due, pk=delivery_id, status=Delivery.Status.PENDING,
                                      attempts=delivery.attempts).update(
        next_attempt_at=now + timedelta(seconds=_lease_seconds()))
    if not claimed:
        return "skipped"
    channel = delivery.channel
    if not channel.enabled and delivery.event != "test":  # an admin switched it off: stop, do not retry for ever
        Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING).update(
            status=Delivery.Status.FAILED, next_attempt_at=None,
            last_error="The channel was disabled before this delivery was sent.")
        return str(Delivery.Status.FAILED)
    if channel.kind == NotificationChannel.Kind.EMAIL:
        response_status, error = _send_email(channel, delivery)
    elif refused := _refused_address(channel):
        # Not a try: no retry would reach it (a URL the studio does not fetch, an address it
        # does not send to); failed at once, saying why, instead of five times over an hour.
        return _record(delivery, None, refused, permanent=True)
    else:
        response_status, error = _post_webhook(channel, delivery)
    return _record(delivery, response_status, error)


def _refused_address(channel: NotificationChannel) -> str | None:
    """Why the studio will not POST to the channel's URL, or None."""
    if problem := webhook_url_problem(channel.url):
        return f"{problem} Not sent; fix the channel's URL."
    parts = urlsplit(channel.url)
    if address := _denied_address(parts.hostname or "", parts.port):
        return (f"{parts.hostname} resolves to {address}, which is in STUDIO_WEBHOOK_DENIED_NETWORKS: not sent; "
                f"point the channel at another host.")
    return None


def _record(delivery: Delivery, response_status: int | None, error: str | None, *, permanent: bool = False) -> str:
    now = timezone.now()
    mine = Delivery.objects.filter(pk=delivery.pk, status=Delivery.Status.PENDING, attempts=delivery.attempts)
    if error is None:
        mine.update(status=Delivery.Status.DELIVERED, attempts=delivery.attempts + 1, response_status=response_status,
                    delivered_at=now, next_attempt_at=None, last_error="")
        return str(Delivery.Status.DELIVERED)
    attempts = delivery.attempts + 1
    failed = permanent or attempts >= int(settings.STUDIO_WEBHOOK_ATTEMPTS)
    mine.update(attempts=attempts, response_status=response_status, last_error=error,
                status=Delivery.Status.FAILED if failed else Delivery.Status.PENDING,
                next_attempt_at=None if failed else now + timedelta(seconds=backoff_seconds(attempts)))
    log.info("delivery %s to channel %s: try %s failed: %s", delivery.pk, delivery.channel_id, attempts, error)
    return str(Delivery.Status.FAILED if failed else Delivery.Status.PENDING)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None  # the 3xx comes back as an HTTPError: recorded, not followed


def _opener() -> urllib.request.OpenerDirector:
    # Only http(s): no file:, ftp: or data: handler, whatever a row holds.
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(context=ssl.create_default_context()),
                    urllib.request.HTTPDefaultErrorHandler(), _NoRedirects(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def _post_webhook(channel: NotificationChannel, delivery: Delivery) -> tuple[int | None, str | None]:
    """The signed POST (the URL was checked by _refused_address just before)."""
    body = body_bytes(delivery.payload)
    now = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"Trainyard/{VERSION}",
        EVENT_HEADER: delivery.event,
        DELIVERY_HEADER: str(delivery.pk),
        SIGNATURE_HEADER: sign(channel.secret, body, now),
        STANDARD_ID_HEADER: str(delivery.pk),
        STANDARD_TIMESTAMP_HEADER: str(now),
        STANDARD_SIGNATURE_HEADER: standard_signature(channel.secret, str(delivery.pk), body, now),
    }
    request = urllib.request.Request(channel.url, data=body, headers=headers, method="POST")
    timeout = float(settings.STUDIO_WEBHOOK_TIMEOUT_SECONDS)
    try:
        with _opener().open(request, timeout=timeout) as response:
            response.read(64 * 1024)
            code = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, _http_error(exc)
    except (urllib.error.URLError, OSError) as exc:
        return None, _connection_error(exc, timeout)
    if 200 <= code < 300:
        return code, None
    return code, f"HTTP {code}"


def _http_error(exc: urllib.error.HTTPError) -> str:
    if 300 <= exc.code < 400:
        return f"HTTP {exc.code}: a redirect to {str(exc.headers.get('Location', '?'))[:200]} (not followed)"
    try:
        text = exc.read(4096).decode("utf-8", "replace")
    except OSError:
        text = ""
    text = " ".join(text.split())[:ERROR_BODY_CHARS]
    return f"HTTP {exc.code}: {text}" if text else f"HTTP {exc.code}"


def _connection_error(exc: BaseException, timeout: float) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s (timed out)"
    if isinstance(reason, socket.gaierror):
        return f"host not found ({reason.strerror or reason})"
    if isinstance(reason, ssl.SSLError):
        return f"TLS error: {reason}"[:300]
    if isinstance(reason, ConnectionResetError):
        return "connection reset by the receiver"
    return f"connection failed: {reason}"[:300]


def _send_email(channel: NotificationChannel, delivery: Delivery) -> tuple[int | None, str | None]:
    if not channel.emails:
        return None, "The channel has no e-mail addresses."
    data = delivery.payload.get("data") if isinstance(delivery.payload.get("data"), dict) else {}
    summary = str((data or {}).get("summary") or delivery.event)
    subject = " ".join(f"[Trainyard {delivery.payload.get('project', '')}] {summary}".split())[:200]
    text = delivery.payload.get("text") or _text(delivery.event, data or {})  # a delivery stored before `text`
    message = (f"{text}\n\n-- \nThe event as a webhook gets it (delivery {delivery.pk}):\n"
               + json.dumps(delivery.payload, indent=2, sort_keys=True, ensure_ascii=False))
    try:
        mail.send_mail(subject, message, None, list(channel.emails), fail_silently=False)
    except ConnectionRefusedError:
        return None, "connection refused (the mail server)"
    except Exception as exc:  # noqa: BLE001 - any backend's failure is this try's outcome
        return None, f"e-mail not sent: {type(exc).__name__}: {exc}"[:300]
    return None, None


# --- the sweep ----------------------------------------------------------------------------------
def retry_due() -> int:
    """Try every pending delivery that is due (its back-off passed) or was never tried and
    is LOST_MESSAGE_SECONDS old (its task message was lost); returns how many were tried.
    Stops after SWEEP_BUDGET_SECONDS so the next beat finds the rest."""
    now = timezone.now()
    due = Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True,
                                          created_at__lte=now - timedelta(seconds=LOST_MESSAGE_SECONDS))
    ids = list(Delivery.objects.filter(due, status=Delivery.Status.PENDING)
               .order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:SWEEP_BATCH])
    started = time.monotonic()
    tried = 0
    for delivery_id in ids:
        if time.monotonic() - started > SWEEP_BUDGET_SECONDS:
            break
        try:
            if deliver(delivery_id) != "skipped":
                tried += 1
        except Exception:  # noqa: BLE001 - one broken delivery must not stop the sweep
            log.exception("delivery %s: the retry sweep's try failed", delivery_id)
    return tried
