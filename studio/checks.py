"""System checks for mistakes across settings, run by `manage.py check` and at start-up.
The object store's own check lives with the store, in datasets/checks.py."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.compatibility, deploy=False)
def data_roots_narrow(app_configs, **kwargs):
    return [Error(f"STUDIO_DATA_ROOTS contains the file-system root {root}; name narrower folders.", id="studio.E002")
            for root in settings.STUDIO_DATA_ROOTS if root == root.parent]


@register(Tags.compatibility, deploy=False)
def metrics_networks_valid(app_configs, **kwargs):
    """STUDIO_METRICS_ALLOWED_NETWORKS must be CIDRs: a bad one would make every /metrics scrape fail."""
    import ipaddress

    errors = []
    for cidr in settings.STUDIO_METRICS_ALLOWED_NETWORKS:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            errors.append(Error(f"STUDIO_METRICS_ALLOWED_NETWORKS: {cidr!r} is not a network ({exc}); "
                                "use CIDRs such as 10.0.0.0/8, comma-separated.", id="studio.E003"))
    return errors


@register(Tags.compatibility, deploy=False)
def instance_prices_valid(app_configs, **kwargs):
    """STUDIO_INSTANCE_PRICES must be a JSON object of prices (jobs.cost reads it at each launch)."""
    import json

    try:
        prices = json.loads(settings.STUDIO_INSTANCE_PRICES or "{}")
    except ValueError as exc:
        return [Error(f"STUDIO_INSTANCE_PRICES is not JSON ({exc}); e.g. '{{\"cpu\": 0.12, \"gpu\": {{\"node\": 1.0, "
                      f"\"gpu\": 2.5}}}}'.", id="studio.E004")]
    if not isinstance(prices, dict):
        return [Error("STUDIO_INSTANCE_PRICES must be a JSON object of instance type → price.", id="studio.E004")]
    return []
