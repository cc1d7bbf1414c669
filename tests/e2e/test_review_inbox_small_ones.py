"""The review inbox's small things in Debian chromium against the live
server: the work view says "Item n of N" and keeps it true as items are answered and
skipped without a page load; the counts (the table and the heading's total) are re-read
after every answer, skip and release, so an item a teammate took meanwhile is not still
counted; Start has a key (N) shown on the button; at 390 px the page is no wider than the
window, in the list and in the work view."""

from __future__ import annotations

import pytest

from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot
from tests.e2e import test_review_inbox as inbox_pages
from tests.review.conftest import make_flow, make_loops, reviewers, team  # noqa: F401 - fixtures

sign_in_as = inbox_pages.sign_in_as
wait_for_item = inbox_pages.wait_for_item

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def position(page) -> str:
    return page.locator("#work-position").inner_text().strip()


def wait_for_position(page, text: str) -> None:
    page.wait_for_function("(text) => document.getElementById('work-position').innerText.trim() === text", arg=text)


def test_item_n_of_n_fresh_counts_and_the_start_key(live_server, reviewer, teammate, reviewers, make_flow,  # noqa: F811
                                                     make_loops, browser_page):  # noqa: F811
    flow = make_flow(name="animals", title="Which animal is it?", task_count=1)
    make_loops(flow, 4, content=lambda i: {"text": ["a purring cat", "a barking dog", "a howling wolf",
                                                    "a singing bird"][i]})
    page = browser_page
    base = live_server.url
    sign_in_as(page, base, "reviewer", "/review/")
    start = page.locator("#start-all")
    assert start.locator("kbd").inner_text() == "N"
    assert start.get_attribute("aria-keyshortcuts") == "N"
    assert "4 items wait for you" in page.locator(".lede").inner_text()

    page.evaluate("window.__sameDocument = true")
    page.keyboard.press("n")  # Start by its key
    wait_for_item(page, "a purring cat")
    wait_for_position(page, "Item 1 of 4")
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    wait_for_item(page, "a barking dog")
    wait_for_position(page, "Item 2 of 4")

    # A teammate answers an item meanwhile: the next count the page reads says so.
    other = reviewers(1)[0]  # reviewer-1, on the flow's team
    taken = claim_next_slot(other, flow)
    assert taken is not None and taken.loop.input_content == {"text": "a howling wolf"}
    answer_slot(taken.pk, other, {"label": "cat"})
    page.keyboard.press("s")  # skip
    wait_for_item(page, "a singing bird")
    wait_for_position(page, "Item 3 of 3")

    page.click("#work-close")  # a release (as a skip): the counts are re-read after it
    page.locator("#inbox-flows").wait_for()
    row = page.locator(f'#inbox-table tr[data-flow="{flow.pk}"]')
    page.wait_for_function(  # the released item is no longer held
        f"""() => document.querySelector('#inbox-table tr[data-flow="{flow.pk}"] [data-count="held"]')
                 .textContent === '0'""")
    assert row.locator('[data-count="available"]').inner_text() == "0"  # two skipped, one answered by each of us
    assert row.locator('[data-count="answered_today"]').inner_text() == "1"
    page.wait_for_function("() => document.querySelector('.lede').innerText.includes('0 items wait for you')")
    assert "you answered 1 today" in page.locator(".lede").inner_text()
    assert page.evaluate("window.__sameDocument") is True
    assert not page.console_errors, page.console_errors


def test_the_inbox_fits_a_390px_window(live_server, reviewer, make_flow, make_loops, browser_page):  # noqa: F811
    flow = make_flow(name="a-flow-with-a-rather-long-name", title="A flow whose title is long enough to wrap",
                     task_count=1)
    make_loops(flow, 2, content=lambda i: {"row": {"sepal_length_in_centimetres": 5.1 + i, "species_guess": "setosa"}})
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in_as(page, live_server.url, "reviewer", "/review/")
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, f"the inbox list is {width} px wide at 390 px"
    page.click("#start-all")
    page.locator("#work-content table").wait_for()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, f"the work view is {width} px wide at 390 px"
    assert not page.console_errors, page.console_errors
