"""Webhook signatures, Django-free: what the studio signs each delivery with and what a
receiver checks it with (`python -c "from trainyard.webhooks import verify"` needs no studio).

    verify(secret, raw_body, request.headers["X-Trainyard-Signature"])  → True / False

Two signatures go on every delivery: our header, X-Trainyard-Signature: t=<unix time>,
v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>; and Standard Webhooks' (standardwebhooks.com)
webhook-id, webhook-timestamp and webhook-signature, so that spec's libraries in any language
verify it with the channel's secret in its whsec_ form (standard_webhooks_secret)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Trainyard-Signature"
EVENT_HEADER = "X-Trainyard-Event"
DELIVERY_HEADER = "X-Trainyard-Delivery"
SIGNATURE_TOLERANCE_SECONDS = 300

__all__ = ["DELIVERY_HEADER", "EVENT_HEADER", "SIGNATURE_HEADER", "SIGNATURE_TOLERANCE_SECONDS", "STANDARD_ID_HEADER",
           "STANDARD_SIGNATURE_HEADER", "STANDARD_TIMESTAMP_HEADER", "sign", "standard_signature",
           "standard_webhooks_secret", "verify"]


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The signature header's value for `body` sent at `timestamp` (unix seconds)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, body: bytes, header: str, *, tolerance: int = SIGNATURE_TOLERANCE_SECONDS,
           now: float | None = None) -> bool:
    """True when `header` (X-Trainyard-Signature) signs exactly `body` with `secret` and its
    timestamp is within `tolerance` seconds of `now` (default: the clock). Malformed → False."""
    timestamp: int | None = None
    signatures: list[str] = []
    for part in (header or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isascii() and value.isdigit():  # "²".isdigit(), yet int("²") raises
            timestamp = int(value)
        elif key == "v1" and value:
            signatures.append(value)
    if timestamp is None or not signatures:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = sign(secret, body, timestamp).rpartition("v1=")[2]
    # Every candidate is compared (no early exit), each in constant time.
    return any([hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in signatures])


# Standard Webhooks (standardwebhooks.com), signed beside our own header so a receiver can use
# that spec's libraries in any language: webhook-id (the delivery, the same on every retry),
# webhook-timestamp, webhook-signature "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>", whose
# key is the channel's secret as bytes, handed out base64 with the spec's whsec_ prefix.
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"


def standard_webhooks_secret(secret: str) -> str:
    """The channel's secret as Standard Webhooks libraries take it (Webhook("whsec_…"))."""
    return "whsec_" + base64.b64encode(secret.encode()).decode()


def standard_signature(secret: str, message_id: str, body: bytes, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
