"""System check that the object store is usable, run by `manage.py check` and at start-up
(registered by DatasetsConfig.ready())."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register

from datasets.storage import LocalStore, StorageError, default_store, split_uri


@register(Tags.compatibility, deploy=False)
def object_store_configured(app_configs, **kwargs):
    try:
        split_uri(settings.STUDIO_OBJECT_STORE)
        store = default_store()
        if isinstance(store, LocalStore):
            store.check_writable()
    except (StorageError, OSError) as exc:
        return [Error(f"STUDIO_OBJECT_STORE={settings.STUDIO_OBJECT_STORE!r} is not usable: {exc}", id="studio.E001")]
    return []
