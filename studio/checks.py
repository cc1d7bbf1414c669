"""System checks for mistakes across settings, run by `manage.py check` and at start-up."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.compatibility, deploy=False)
def object_store_configured(app_configs, **kwargs):
    from datasets.storage import LocalStore, StorageError, default_store, split_uri

    errors = []
    try:
        split_uri(settings.STUDIO_OBJECT_STORE)
        store = default_store()
        if isinstance(store, LocalStore):
            store.check_writable()
    except (StorageError, OSError) as exc:
        errors.append(Error(f"STUDIO_OBJECT_STORE={settings.STUDIO_OBJECT_STORE!r} is not usable: {exc}", id="studio.E001"))
    for root in settings.STUDIO_DATA_ROOTS:
        if root == root.parent:
            errors.append(Error(f"STUDIO_DATA_ROOTS contains the file-system root {root}; name narrower folders.", id="studio.E002"))
    return errors
