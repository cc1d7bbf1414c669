"""API authentication. Kept apart from studio.api because DRF imports these classes while
rest_framework.views is still loading."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header

from studio.models import ApiToken


class BearerTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <token>` with tokens stored hashed (studio.models.ApiToken)."""

    keyword = b"bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        try:
            raw = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.") from exc
        token = ApiToken.authenticate(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        now = timezone.now()
        # Throttled so that a busy client does not write a row on every request.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return (token.user, token)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class CsrfSessionAuthentication(SessionAuthentication):
    """The browser's session, with CSRF enforced for unsafe methods (DRF's default)."""
