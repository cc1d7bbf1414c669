"""Review statistics API routes (review.stats); included under /api/v1/ by studio.urls."""

from __future__ import annotations

urlpatterns: list = []
