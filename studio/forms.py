"""How pages run actions: a form's valid data goes to the action, and an ActionError
comes back as the form's own errors (each field message on its field, the rest above
the form) or, for a button with no form to redraw, as a message on the next page."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.contrib import messages
from django.http import HttpRequest

from studio.errors import ActionError

T = TypeVar("T")


class ActionFormMixin:
    """For a Django form whose cleaned data a page hands to an action.

    `run_action(lambda: action(...))` returns the action's result, or None when it refused;
    then its field messages are on the form (`action_field_for` maps an action's field
    name to the form field that shows it) and a message with no field of the form is a
    non-field error, so the page redraws the form as it does for any invalid input."""

    action_field_for: Mapping[str, str] = {}

    # Provided by django.forms.Form, which this mixin is combined with.
    fields: dict[str, Any]
    add_error: Callable[..., None]

    def add_action_error(self, exc: ActionError) -> None:
        if not exc.fields:
            self.add_error(None, exc.message)
        for name, message in exc.fields.items():
            field = self.action_field_for.get(name, name)
            self.add_error(field if field in self.fields else None, message)

    def run_action(self, action: Callable[[], T]) -> T | None:
        try:
            return action()
        except ActionError as exc:
            self.add_action_error(exc)
            return None


def run_or_message(request: HttpRequest, action: Callable[[], T], *, failed: str) -> T | None:
    """Run a button's action; when it refuses, "<failed>: <its message>" goes to the next
    page's messages and None comes back (the view then redirects)."""
    try:
        return action()
    except ActionError as exc:
        messages.error(request, f"{failed}: {exc.message}")
        return None
