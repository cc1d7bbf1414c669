"""Seeded record splits: which channel (train / validation / test) each record goes to.

A record's channel depends only on (seed, record index), never on its content or on
what came before it, so a training runner that streams the same records in the same
order reproduces the split that validation counted, without storing it anywhere.
Records are numbered from 0 across the version's files that have no channel of their
own, in path order.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Mapping

CHANNELS = ("train", "validation", "test")
DEFAULT_SEED = 0
_TOLERANCE = 1e-6
_TWO_TO_64 = float(2**64)


def parse_split(raw: Mapping[str, object]) -> dict:
    """Check a split such as {"train": 0.8, "validation": 0.1, "test": 0.1, "seed": 42}.

    Returns {"train", "validation", "test" (floats, missing ones 0.0), "seed" (int)}.
    Raises ValueError with one clear message for the first problem found.
    """
    if not isinstance(raw, Mapping):
        raise ValueError("split must be an object like {\"train\": 0.8, \"validation\": 0.2, \"seed\": 42}")
    unknown = sorted(str(key) for key in raw if key not in CHANNELS and key != "seed")
    if unknown:
        raise ValueError(
            f"split has unknown keys {', '.join(unknown)}; use {', '.join(CHANNELS)} and seed"
        )
    parsed: dict = {}
    for channel in CHANNELS:
        ratio = raw.get(channel, 0.0)
        # bool is an int subclass; "true" as a ratio is a mistake, not 1.0.
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise ValueError(f"split {channel} must be a number between 0 and 1, got {ratio!r}")
        if not math.isfinite(ratio) or ratio < 0 or ratio > 1:
            raise ValueError(f"split {channel} must be between 0 and 1, got {ratio!r}")
        parsed[channel] = float(ratio)
    total = sum(parsed[channel] for channel in CHANNELS)
    if abs(total - 1.0) > _TOLERANCE:
        raise ValueError(f"split ratios must add up to 1, they add up to {total:g}")
    seed = raw.get("seed", DEFAULT_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"split seed must be an integer, got {seed!r}")
    parsed["seed"] = seed
    return parsed


def unit_interval(seed: int, record_index: int) -> float:
    """A uniform number in [0, 1) from (seed, index) alone; the same on every machine."""
    digest = hashlib.blake2b(f"{seed}:{record_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _TWO_TO_64


def _thresholds(split: Mapping) -> list[tuple[float, str]]:
    cumulative = 0.0
    bounds = []
    for channel in CHANNELS:
        ratio = split.get(channel, 0.0)
        if ratio > 0:
            cumulative += ratio
            bounds.append((cumulative, channel))
    # Ratios that sum to 0.9999999 must not leave a sliver of records unassigned or
    # hand them to a channel whose ratio is zero: the last non-empty channel takes it.
    bounds[-1] = (math.inf, bounds[-1][1])
    return bounds


def assign_channel(record_index: int, split: Mapping) -> str:
    """The channel of record `record_index` under a split returned by parse_split."""
    point = unit_interval(split["seed"], record_index)
    for bound, channel in _thresholds(split):
        if point < bound:
            return channel
    raise AssertionError("unreachable: the last threshold is infinite")


def count_channels(first_index: int, count: int, split: Mapping) -> Counter:
    """How many of records first_index .. first_index+count-1 land in each channel."""
    seed = split["seed"]
    bounds = _thresholds(split)
    counts: Counter = Counter()
    for record_index in range(first_index, first_index + count):
        point = unit_interval(seed, record_index)
        for bound, channel in bounds:
            if point < bound:
                counts[channel] += 1
                break
    return counts
