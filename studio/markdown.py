"""User-written Markdown (flow instructions, dataset descriptions) → HTML that pages may
insert as is.

nh3 (ammonia) keeps an allow-list of tags and attributes: no <script>/<style>, no on*
handlers, and links only to http(s)/mailto, so the text can never run code in a reader's
browser. Here in studio/ so every app can use it without importing another app."""

from __future__ import annotations

import markdown as md
import nh3

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em", "h1", "h2", "h3", "h4",
    "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "sup", "table",
    "tbody", "td", "th", "thead", "tr", "ul",
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "td": {"align"},
    "th": {"align"},
    "abbr": {"title"},
}
URL_SCHEMES = {"http", "https", "mailto"}


def render_markdown(text: str) -> str:
    html = md.markdown(text or "", extensions=["extra", "sane_lists"], output_format="html")
    return nh3.clean(html, tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel="noopener noreferrer nofollow")
