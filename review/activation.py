"""When a prediction goes to people (docs/SPEC.md §5): the flow's activation conditions.

`activation` is {"confidence_below": float | None, "sample_percent": float 0–100,
"combine": "any" | "all"}. A condition that is not configured (no threshold, a 0 %
sample) takes no part: "all" over one configured condition is that condition alone.
"""

from __future__ import annotations

import random
from typing import Any

CONFIDENCE_BELOW = "confidence_below"
SAMPLED = "sampled"
COMBINE_CHOICES = ("any", "all")


def check_activation(activation: Any) -> tuple[dict, dict[str, str]]:
    """The activation, normalised, and {field: message} for what is wrong with it."""
    if activation is None:
        activation = {}
    if not isinstance(activation, dict):
        return {}, {"activation": "Must be an object {\"confidence_below\", \"sample_percent\", \"combine\"}."}
    errors: dict[str, str] = {}
    unknown = sorted(set(activation) - {"confidence_below", "sample_percent", "combine"})
    if unknown:
        errors["activation"] = f"Unknown keys: {', '.join(unknown)}."
    threshold = activation.get("confidence_below")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0 <= threshold <= 1):
        errors["activation.confidence_below"] = "Must be a number from 0 to 1."
    sample = activation.get("sample_percent", 0)
    if sample is None:
        sample = 0
    if isinstance(sample, bool) or not isinstance(sample, (int, float)) or not 0 <= sample <= 100:
        errors["activation.sample_percent"] = "Must be a number from 0 to 100."
    combine = activation.get("combine", "any")
    if combine not in COMBINE_CHOICES:
        errors["activation.combine"] = "Must be \"any\" or \"all\"."
    if errors:
        return {}, errors
    clean = {"confidence_below": float(threshold) if threshold is not None else None,
             "sample_percent": float(sample), "combine": combine}
    return clean, {}


def activation_reason(activation: dict, confidence: float | None, rng: random.Random | None = None) -> str | None:
    """Why this prediction goes to people ("confidence_below" | "sampled"), or None.

    The sample draw is made only when it can change the outcome, so a seeded rng gives
    the same decisions for the same predictions."""
    threshold = activation.get("confidence_below")
    sample = float(activation.get("sample_percent") or 0)
    combine = activation.get("combine") or "any"
    has_threshold = threshold is not None
    has_sample = sample > 0
    if not has_threshold and not has_sample:
        return None
    below = threshold is not None and confidence is not None and confidence < threshold
    draw = rng.random if rng is not None else random.random
    if combine == "all":
        if has_threshold and not below:
            return None
        if has_sample and not draw() * 100 < sample:
            return None
        return CONFIDENCE_BELOW if has_threshold else SAMPLED
    if below:
        return CONFIDENCE_BELOW
    if has_sample and draw() * 100 < sample:
        return SAMPLED
    return None
