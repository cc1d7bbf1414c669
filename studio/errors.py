"""The one error an action raises when it refuses: a message for people, the request
fields at fault with a message each, the HTTP status the API answers with and, where the
status alone does not say it, the error code.

Every app's action errors subclass ActionError. The API's exception handler
(studio.api.error_envelope_handler) turns one into the error envelope of docs/SPEC.md §6;
pages run actions through studio.forms.ActionFormMixin, which puts the field messages on
the form's fields and the rest above the form. Views never translate one by hand."""

from __future__ import annotations

from collections.abc import Mapping


class ActionError(Exception):
    """An action's refusal: `message` for people, `fields` {request field: message}, the
    HTTP `status` (400 bad input, 404 missing, 409 a state conflict) and an optional
    `code` for the envelope (by default the status's own: invalid, not_found, conflict)."""

    def __init__(self, message: str, *, fields: Mapping[str, str] | None = None, status: int = 400,
                 code: str | None = None):
        super().__init__(message)
        self.message = message
        self.fields = dict(fields or {})
        self.status = status
        self.code = code

    @property
    def field(self) -> str | None:
        """The first field at fault, or None when the refusal concerns no one field."""
        return next(iter(self.fields), None)

    def envelope_message(self) -> str:
        """The envelope's message: for bad input (400) the first field as "name: message",
        so a client that prints only the message still learns which field; for a missing
        thing or a conflict the message alone."""
        if self.status == 400 and self.fields:
            name, message = next(iter(self.fields.items()))
            return f"{name}: {message}"
        return self.message


class FieldError(ActionError):
    """An ActionError about one request field: `field`, `message`, optional `status`."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(message, fields={field: message}, status=status)

    @property
    def field(self) -> str:
        """The field at fault: a FieldError always names one."""
        return next(iter(self.fields))
