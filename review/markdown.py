"""Flow instructions: Markdown as written → sanitised HTML (studio/markdown.py holds the
renderer and its allow-list; datasets use it too)."""

from __future__ import annotations

from studio.markdown import ALLOWED_ATTRIBUTES, ALLOWED_TAGS, URL_SCHEMES, render_markdown

__all__ = ["ALLOWED_ATTRIBUTES", "ALLOWED_TAGS", "URL_SCHEMES", "render_instructions"]


def render_instructions(text: str) -> str:
    return render_markdown(text)
