"""Addresses against lists of networks from settings (CIDRs): who may scrape /metrics
(trainyard_site.prometheus), where webhooks may not go (studio.notify)."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=16)
def networks(cidrs: tuple[str, ...], setting: str) -> tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{setting}: {exc}") from exc


def in_networks(address: str, among: tuple[Network, ...]) -> bool:
    """Whether `address` (text) is in one of `among`; an IPv4-mapped IPv6 address (a
    dual-stack socket's ::ffff:10.0.0.5) counts as its IPv4 address. Not an address: False."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])  # fe80::1%eth0: the zone is not the address
    except ValueError:
        return False
    candidates = [parsed]
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        candidates.append(parsed.ipv4_mapped)
    return any(candidate in network for candidate in candidates for network in among
               if candidate.version == network.version)
