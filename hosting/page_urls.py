"""The hosting pages; included by studio.page_urls."""

from __future__ import annotations

urlpatterns: list = []
