"""The pages' side of deleting (studio.deletion): one view body for every kind.

GET  <object>/delete/ → the confirm dialog's body (htmx swaps it into the page's
     <dialog>): what goes with the object, with counts, or what blocks it, with links.
POST <object>/delete/ → the delete action; back to the list with what happened, or back
     to the object with what blocks it (linked)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.html import format_html, format_html_join

from studio.deletion import DeletionBlocked, DeletionPlan


def blocked_message(plan: DeletionPlan) -> str:
    return format_html_join(" ", "{}{}", (
        (b.message, format_html(' <a href="{}">Open {}</a>', b.url, b.name) if b.url else "") for b in plan.blockers))


def confirm_or_delete(request: HttpRequest, *, plan: Callable[[], DeletionPlan], delete: Callable[[], Any],
                      back_url: str, done_url: str, noun: str) -> HttpResponse:
    """`plan()` builds the confirm's plan; `delete()` runs the action (DeletionBlocked when
    refused) and returns "archived" when the object was kept as archived."""
    if request.method != "POST":
        return render(request, "includes/delete_confirm.html", {"plan": plan(), "action": request.path, "noun": noun})
    has_files = bool(plan().uris)
    try:
        outcome = delete()
    except DeletionBlocked as exc:
        messages.error(request, blocked_message(exc.plan))
        return redirect(back_url)
    if outcome == "archived":
        messages.success(request, f"Archived {noun}: it is kept for the model it made, and hidden from lists.")
        return redirect(back_url)
    messages.success(request, f"Deleted {noun}." + (" Its stored files are being removed in the background." if has_files else ""))
    return redirect(done_url)
