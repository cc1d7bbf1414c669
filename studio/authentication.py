"""API authentication. Kept apart from studio.api because DRF imports these classes while
rest_framework.views is still loading."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header

from studio.models import ApiToken

INVALID_TOKEN = "Invalid, expired or revoked token."


class BearerTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <token>` with tokens stored hashed (studio.models.ApiToken)."""

    keyword = b"bearer"

    def presented_token(self, request) -> str | None:
        """The raw token of an `Authorization: Bearer` header; None without one."""
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        try:
            return header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.") from exc

    @staticmethod
    def note_use(token_id: int, last_used_at) -> None:
        now = timezone.now()
        # Throttled so that a busy client does not write a row on every request.
        if last_used_at is None or (now - last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token_id).update(last_used_at=now)

    def authenticate(self, request):
        raw = self.presented_token(request)
        if raw is None:
            return None
        token = ApiToken.authenticate(raw)
        if token is None:
            raise exceptions.AuthenticationFailed(INVALID_TOKEN)
        self.note_use(token.pk, token.last_used_at)
        return (token.user, token)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class CsrfSessionAuthentication(SessionAuthentication):
    """The browser's session, with CSRF enforced for unsafe methods (DRF's default)."""
