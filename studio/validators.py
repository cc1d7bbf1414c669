"""Validators shared by the API's serializers."""

from __future__ import annotations

import unicodedata

from rest_framework import serializers


def clean_name(value: str) -> str:
    """A display name: trimmed, not blank, no control or invisible formatting characters
    (which make two names look the same). Anything else, `<script>` included, is allowed:
    pages escape it."""
    value = value.strip()
    if not value:
        raise serializers.ValidationError("This field may not be blank.")
    if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value):
        raise serializers.ValidationError("Names cannot contain control characters.")
    return value
