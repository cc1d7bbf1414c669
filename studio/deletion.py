"""Deleting things: what a delete takes with it, what blocks it, and the store objects it
leaves to remove in the background.

Each kind's `<app>/deletion.py` builds a DeletionPlan (pages show it in the confirm dialog;
the API answers 409 with its blockers) and a delete action that:

1. locks the row and re-checks the plan inside the transaction (a use that appeared
   since the page was drawn still blocks);
2. deletes (or archives) the rows and records a PendingDeletion with the plan's object
   URIs, in that same transaction: a crash leaves either all the rows or the intent;
3. on commit, sends `studio.tasks.delete_objects_task` to the control queue, which removes
   the objects one URI at a time (idempotent: a missing object is already deleted) and
   drops the intent when none is left. Beat's sweep finishes an intent whose worker died.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from studio.errors import ActionError
from studio.models import PendingDeletion

log = logging.getLogger(__name__)

# An intent untouched this long lost its worker (each removed object touches it).
STALE_AFTER_SECONDS = 60


@dataclass(frozen=True)
class ObjectStoreAccess:
    """How deletion reaches the object store, which the datasets app owns: `store_for(uri)`
    gives the store holding a URI (with `list` and `delete_prefix`), and `error` is what
    the store raises when it cannot be read or written."""

    store_for: Callable[[str], Any]
    error: type[Exception]


_object_store: ObjectStoreAccess | None = None


def register_object_store(store_for: Callable[[str], Any], error: type[Exception]) -> None:
    """Called once by DatasetsConfig.ready(), so this module needs no import of datasets."""
    global _object_store
    _object_store = ObjectStoreAccess(store_for=store_for, error=error)


def object_store() -> ObjectStoreAccess:
    if _object_store is None:
        raise ImproperlyConfigured("No object store is registered: add 'datasets' to INSTALLED_APPS.")
    return _object_store


@dataclass(frozen=True)
class Blocker:
    """Why a delete cannot happen yet, naming the thing in the way (with its page)."""

    message: str
    name: str = ""
    url: str = ""

    def as_json(self) -> dict[str, str]:
        return {"message": self.message, "name": self.name, "url": self.url}


@dataclass
class DeletionPlan:
    """`goes`: one line per kind of thing that is deleted with the object, with its count
    ("3 artifacts", "1,204 metric points"); `archive`: the object is kept but hidden
    (`archive_reason` says why); `uris`: store objects removed in the background."""

    what: str
    goes: list[str] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    archive: bool = False
    archive_reason: str = ""
    archive_links: list[Blocker] = field(default_factory=list)
    uris: list[str] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return bool(self.blockers)

    def as_json(self) -> dict[str, Any]:
        return {"what": self.what, "goes": self.goes, "blocked_by": [b.as_json() for b in self.blockers],
                "archive": self.archive, "archive_reason": self.archive_reason}


class DeletionBlocked(ActionError):
    """The plan has blockers; the message names them (and where to find them). The API
    answers 409 with code in_use."""

    def __init__(self, plan: DeletionPlan):
        self.plan = plan
        super().__init__(" ".join(b.message + (f" ({b.url})" if b.url else "") for b in plan.blockers),
                         status=409, code="in_use")


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    return f"{count:,} {singular if count == 1 else (plural_form or singular + 's')}"


def owned_uri(uri: str) -> bool:
    """Only objects inside the studio's own object store are ever deleted: a dataset
    registered in place (a server path, someone's bucket) is the user's data."""
    if not uri or "\x00" in uri:
        return False
    root = settings.STUDIO_OBJECT_STORE.rstrip("/")
    return uri.rstrip("/").startswith(root + "/") and ".." not in uri.split("/")


def count_objects(uri: str) -> tuple[int, int]:
    """(files, bytes) below `uri` in the store; (0, 0) when it cannot be read."""
    if not uri:
        return 0, 0
    store = object_store()
    try:
        objects = list(store.store_for(uri).list(uri))
    except store.error:
        return 0, 0
    return len(objects), sum(o.size for o in objects)


def record_objects(what: str, uris: list[str]) -> PendingDeletion | None:
    """Record the store objects to remove (call inside the transaction that deletes the
    rows) and send the task once it commits. URIs outside the store are left alone."""
    kept = list(dict.fromkeys(u.rstrip("/") for u in uris if owned_uri(u)))
    if not kept:
        return None
    pending = PendingDeletion.objects.create(what=what[:300], uris=kept, total=len(kept))
    transaction.on_commit(lambda: _send(pending.pk))
    return pending


def _send(pending_id: int) -> None:
    from studio.tasks import delete_objects_task

    try:
        delete_objects_task.delay(pending_id)
    except Exception:  # noqa: BLE001 - the sweep finishes it; the rows are already gone
        log.warning("could not send deletion %s; the periodic sweep will finish it", pending_id, exc_info=True)


def run_deletion(pending_id: int) -> int:
    """Remove a PendingDeletion's objects one URI at a time, shrinking its list after each
    (a worker killed midway leaves the rest recorded), and drop the row when none is left.
    Returns how many URIs were removed. A URI that fails stays, with the reason."""
    store = object_store()
    pending = PendingDeletion.objects.filter(pk=pending_id).first()
    if pending is None:
        return 0
    PendingDeletion.objects.filter(pk=pending_id).update(attempts=pending.attempts + 1, updated_at=timezone.now())
    remaining = list(pending.uris)
    failed: list[str] = []
    errors: list[str] = []
    removed = 0
    while remaining:
        uri = remaining[0]
        try:
            store.store_for(uri).delete_prefix(uri)
            removed += 1
        except store.error as exc:
            failed.append(uri)
            errors.append(str(exc))
            log.warning("could not delete %s (%s): %s", uri, pending.what, exc)
        remaining = remaining[1:]
        PendingDeletion.objects.filter(pk=pending_id).update(uris=failed + remaining, updated_at=timezone.now())
    if failed:
        PendingDeletion.objects.filter(pk=pending_id).update(last_error="; ".join(errors)[:2000])
    else:
        PendingDeletion.objects.filter(pk=pending_id).delete()
    return removed


def sweep_pending_deletions(stale_after_seconds: int = STALE_AFTER_SECONDS) -> list[int]:
    """Finish the intents nobody is working on (a killed worker, a lost message)."""
    cutoff = timezone.now() - timedelta(seconds=stale_after_seconds)
    ids = list(PendingDeletion.objects.filter(updated_at__lte=cutoff).values_list("pk", flat=True)[:100])
    for pending_id in ids:
        run_deletion(pending_id)
    return ids


def destroy_schema(kept=None, description: str = ""):
    """extend_schema for a DELETE: 204 deleted, 200 with the object when it was archived
    instead (`kept`), 409 (the error envelope) when something blocks it."""
    from drf_spectacular.utils import OpenApiResponse, extend_schema

    responses: dict = {204: OpenApiResponse(description="Deleted; its stored objects are removed in the background.")}
    if kept is not None:
        responses[200] = OpenApiResponse(response=kept, description="Archived instead of deleted (history must stay).")
    from studio.schema import ErrorSerializer  # the error envelope's OpenAPI component

    responses[409] = OpenApiResponse(response=ErrorSerializer, description=(
        "Refused, in the error envelope (code in_use): the message names what blocks it (a running job, an "
        "endpoint serving the version, a flow using the team) and where to find it."))
    return extend_schema(request=None, responses=responses, description=description)


def wants_archived(params) -> bool:
    """?archived=true lists archived objects too (lists hide them by default)."""
    from studio.api import ApiError

    value = (params.get("archived") or "").strip().lower()
    if value in ("", "false", "0", "no"):
        return False
    if value in ("true", "1", "yes"):
        return True
    raise ApiError("archived: Use true or false.", fields={"archived": ["Use true or false."]})


def _archived_parameter():
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter("archived", bool, description="Include archived objects (hidden by default).")


ARCHIVED_PARAMETER = _archived_parameter()
