"""System checks for mistakes across settings, run by `manage.py check` and at start-up.
The object store's own check lives with the store, in datasets/checks.py."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.compatibility, deploy=False)
def data_roots_narrow(app_configs, **kwargs):
    return [Error(f"STUDIO_DATA_ROOTS contains the file-system root {root}; name narrower folders.", id="studio.E002")
            for root in settings.STUDIO_DATA_ROOTS if root == root.parent]
