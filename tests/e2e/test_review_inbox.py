"""The reviewer inbox in a real browser (Debian chromium through Playwright) against the live
server: a reviewer labels three items with the keyboard (and skips one with S), the items
come without a page load and the loops complete; a scientist exports them from the flow
page and the export shows up as a dataset version on the dataset page (validated by a real
Celery worker). And `<script>` in instructions or content never runs: it shows as text.
Screenshots: /tmp/trainyard-review-*.png."""

from __future__ import annotations

import base64
import re

import pytest

from datasets.models import DatasetVersion, SourceKind
from review.models import AssignmentStatus, HumanLoop, LoopStatus
from tests.e2e import test_dataset_upload as dataset_pages
from tests.e2e.conftest import SCREENSHOTS
from tests.review.conftest import make_flow, make_loops, reviewers, team  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# A 1×1 transparent PNG.
PIXEL_PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()


def sign_in_as(page, base_url: str, username: str, landing: str) -> None:
    page.context.clear_cookies()
    page.goto(base_url + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(base_url + landing)


def content_text(page) -> str:
    return page.locator("#work-content").inner_text().strip()


def wait_for_item(page, text: str) -> None:
    page.wait_for_function("(text) => document.getElementById('work-content').innerText.trim() === text", arg=text)


def test_reviewer_labels_three_items_by_keyboard_then_the_export_is_a_dataset_version(
        live_server, celery_worker, reviewer, teammate, make_flow, make_loops, browser_page):  # noqa: F811
    flow = make_flow(name="animals", title="Which animal is it?", task_count=1,
                     instructions="Pick the animal the sentence is about. **Skip** when unsure.")
    loops = make_loops(flow, 4, content=lambda i: {"text": ["a purring cat", "a barking dog", "something unclear",
                                                            "a singing bird"][i]},
                       confidence=lambda i: 0.41 + i / 100)
    page = browser_page
    base = live_server.url
    sign_in_as(page, base, "reviewer", "/review/")  # a reviewer-only user lands in the inbox
    assert page.locator(".nav-item").all_inner_texts() == ["Review"]
    row = page.locator(f'#inbox-table tr[data-flow="{flow.pk}"]')
    assert row.locator('[data-count="available"]').inner_text() == "4"
    page.click("#start-all")
    wait_for_item(page, "a purring cat")
    # A reload while holding an item: Start resumes that item rather than leaving it locked.
    page.reload()
    page.click("#start-all")
    wait_for_item(page, "a purring cat")
    page.evaluate("window.__sameDocument = true")
    assert page.locator("#work-title").inner_text() == "Which animal is it?"
    assert "Skip" in page.locator("#work-instructions strong").inner_text()
    assert page.locator("#work-prediction").inner_text() == "The model says: cat (confidence 41 %)"
    assert re.fullmatch(r"[0-5]:\d\d", page.locator("#lease-left").inner_text())
    buttons = page.locator("#work-labels button")
    assert buttons.all_text_contents() == ["1cat", "2dog", "3bird"]
    assert buttons.nth(0).get_attribute("aria-keyshortcuts") == "1"
    page.screenshot(path=str(SCREENSHOTS / "trainyard-review-inbox-item.png"), full_page=True)

    page.keyboard.press("1")
    assert buttons.nth(0).get_attribute("aria-pressed") == "true"
    page.keyboard.press("Enter")
    wait_for_item(page, "a barking dog")
    page.keyboard.press("3")  # a slip: change the pick before submitting
    page.keyboard.press("2")
    assert page.locator('#work-labels button[aria-pressed="true"]').text_content() == "2dog"
    page.keyboard.press("Enter")
    wait_for_item(page, "something unclear")
    page.keyboard.press("s")
    wait_for_item(page, "a singing bird")
    page.keyboard.press("3")
    page.keyboard.press("Enter")
    page.locator("#done").wait_for()
    assert "Nothing is waiting for you" in page.locator("#done").inner_text()
    assert page.evaluate("window.__sameDocument") is True  # every item came without a page load
    page.click("#done-close")
    page.wait_for_function(
        f"""() => document.querySelector('#inbox-table tr[data-flow="{flow.pk}"] [data-count="answered_today"]')
                 .textContent === '3'""")
    assert row.locator('[data-count="available"]').inner_text() == "0"  # the skipped item is not offered again

    by_name = {loop.name: loop for loop in HumanLoop.objects.filter(flow_definition=flow)}
    answers = [(by_name[loop.name].status, by_name[loop.name].consolidated_label) for loop in loops]
    assert answers == [(LoopStatus.COMPLETED, "cat"), (LoopStatus.COMPLETED, "dog"), (LoopStatus.IN_PROGRESS, ""),
                       (LoopStatus.COMPLETED, "bird")]
    skipped = by_name[loops[2].name]
    assert list(skipped.assignments.values_list("status", flat=True)) == [AssignmentStatus.RELEASED]
    assert skipped.open_slots == 1  # back in the queue for the rest of the team
    assert not page.console_errors, page.console_errors

    # A scientist exports the labels from the flow page; the export is a dataset version.
    sign_in_as(page, base, "teammate", "/")
    page.goto(f"{base}/review/flows/{flow.pk}/")
    assert page.locator("#stat-completed .stat-value").inner_text() == "3"
    page.locator("#confusion-chart .main-svg").first.wait_for()
    page.once("dialog", lambda dialog: dialog.accept())  # the confirm that says what the export holds
    page.click("#export-button")
    page.wait_for_url(re.compile(rf"/review/flows/{flow.pk}/\?exported=\d+#exports$"))
    version = DatasetVersion.objects.get(source_kind=SourceKind.REVIEW)
    link = page.locator(f'#exports-table tr[data-version="{version.pk}"] a')
    assert link.inner_text() == "animals-reviewed v1"
    page.screenshot(path=str(SCREENSHOTS / "trainyard-review-flow.png"), full_page=True)
    link.click()
    page.wait_for_url(re.compile(rf"/datasets/{version.dataset_id}/\?version=1$"))
    dataset_pages.wait_for_status(page, "ready")
    assert "animals-reviewed" in page.locator("h1").inner_text()
    version.refresh_from_db()
    assert version.num_records == 3
    page.screenshot(path=str(SCREENSHOTS / "trainyard-review-export-dataset.png"), full_page=True)
    assert not page.console_errors, page.console_errors


def test_script_in_instructions_and_content_never_runs(live_server, reviewer, teammate, make_flow, make_loops,  # noqa: F811
                                                       browser_page):
    flow = make_flow(
        name="unsafe", title="<script>window.__pwned = 'title'</script>Careful", task_count=1, labels=["<b>ok</b>", "bad"],
        instructions="Read **carefully**.\n\n<script>window.__pwned = 'instructions'; alert('instructions')</script>\n\n"
                     "<img src=x onerror=\"window.__pwned = 'instructions-img'\">")
    contents = [
        {"text": "<script>window.__pwned = 'content'; alert('content')</script><img src=x onerror=\"window.__pwned = 'img'\">"},
        {"row": {"name": "<img src=x onerror=\"window.__pwned = 'row'\">", "size": 3}},
        {"image": PIXEL_PNG, "media_type": "image/png"},
        {"image": "PHN2ZyBvbmxvYWQ9ImFsZXJ0KDEpIj4=", "media_type": "image/svg+xml"},
    ]
    make_loops(flow, len(contents), content=lambda i: contents[i])
    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    base = live_server.url
    sign_in_as(page, base, "reviewer", "/review/")
    page.click(f'[data-start="{flow.pk}"]')

    wait_for_item(page, contents[0]["text"])  # the markup is shown as the literal text it is
    assert page.locator("#work-content script, #work-content img").count() == 0
    assert page.locator("#work-title").inner_text() == "<script>window.__pwned = 'title'</script>Careful"
    assert page.locator("#work-instructions strong").inner_text() == "carefully"
    assert page.locator("#work-instructions script").count() == 0
    assert page.locator("#work-instructions img[onerror]").count() == 0
    assert page.locator("#work-labels button").nth(0).text_content() == "1<b>ok</b>"
    page.keyboard.press("s")

    page.locator("#work-content table").wait_for()
    cells = page.locator("#work-content tr").all_inner_texts()
    assert cells == ["name\t<img src=x onerror=\"window.__pwned = 'row'\">", "size\t3"]
    page.keyboard.press("s")

    page.locator("#work-content img.review-image").wait_for()
    assert page.locator("#work-content img").get_attribute("src") == f"data:image/png;base64,{PIXEL_PNG}"
    page.keyboard.press("s")

    page.locator("#work-content pre").wait_for()  # an svg is not an allowed image type: shown as JSON
    assert '"media_type": "image/svg+xml"' in content_text(page)
    assert page.locator("#work-content img").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "trainyard-review-unsafe.png"), full_page=True)
    page.keyboard.press("s")
    page.locator("#done").wait_for()
    assert page.evaluate("window.__pwned") is None and dialogs == []

    # The flow page renders the same instructions for the team's scientists.
    sign_in_as(page, base, "teammate", "/")
    page.goto(f"{base}/review/flows/{flow.pk}/")
    assert page.locator("#flow-instructions strong").inner_text() == "carefully"
    assert page.locator("#flow-instructions script").count() == 0
    page.wait_for_timeout(300)  # give any injected handler the chance to fire
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []


def test_lease_runs_out_on_the_timer_and_on_the_server(live_server, reviewer, make_flow, make_loops,  # noqa: F811
                                                       browser_page):
    flow = make_flow(name="quick", title="Quick", task_count=1, task_time_limit_seconds=3)
    make_loops(flow, 1, content=lambda i: {"text": "only item"})
    page = browser_page
    base = live_server.url
    sign_in_as(page, base, "reviewer", "/review/")
    page.click("#start-all")
    wait_for_item(page, "only item")
    assert "is-ending" in page.locator("#lease-timer").get_attribute("class")  # the last minute is amber
    # The timer reaches 0: the item is gone, the page says so and offers the next one.
    page.locator("#work-next").wait_for(timeout=10_000)
    assert page.locator("#work-error").inner_text() == "This item's time ran out; it went back to the queue."
    assert page.locator("#lease-left").inner_text() == "0:00" and page.locator("#work-submit").is_disabled()
    page.keyboard.press("1")
    page.keyboard.press("Enter")  # Enter now fetches the next item: the same one, back in the queue
    page.locator("#work-next").wait_for(state="hidden")
    wait_for_item(page, "only item")
    assert not page.locator("#work-submit").is_disabled()

    # The server ends the lease before the page does (a clock that lies): the answer gets a
    # 409 and the page explains it inline instead of failing silently.
    from review.models import Assignment
    from tests.review.conftest import backdate_leases

    backdate_leases(*Assignment.objects.filter(worker=reviewer, status=AssignmentStatus.HELD))
    page.keyboard.press("2")
    page.keyboard.press("Enter")
    page.locator("#work-next").wait_for()
    assert page.locator("#work-error").inner_text() == "This item's time ran out; it went back to the queue."
    assert HumanLoop.objects.get(flow_definition=flow).answers_count == 0
    # chromium logs the 409 response itself; nothing else went wrong.
    assert [e for e in page.console_errors if "status of 409" not in e] == [], page.console_errors


def test_free_text_enter_submits_shift_enter_adds_a_line_and_s_types_in_the_box(
        live_server, reviewer, make_flow, make_loops, browser_page):  # noqa: F811
    flow = make_flow(name="notes", title="Describe it", task_type="free_text", task_count=1)
    make_loops(flow, 2, content=lambda i: {"text": f"picture {i}"})
    page = browser_page
    sign_in_as(page, live_server.url, "reviewer", "/review/")
    page.click("#start-all")
    wait_for_item(page, "picture 0")
    assert page.locator("#work-labels").is_hidden()
    assert page.evaluate("document.activeElement.id") == "work-text"  # ready to type
    page.keyboard.type("small sleepy dog")  # the "s" letters type, they do not skip
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("on a sofa")
    page.keyboard.press("Enter")
    wait_for_item(page, "picture 1")
    page.keyboard.press("Escape")  # leave the box: now S skips
    page.keyboard.press("s")
    page.locator("#done").wait_for()
    loops = {loop.input_content["text"]: loop for loop in HumanLoop.objects.filter(flow_definition=flow)}
    answer = loops["picture 0"].assignments.get()
    assert answer.status == AssignmentStatus.ANSWERED and answer.answer == {"text": "small sleepy dog\non a sofa"}
    assert loops["picture 0"].status == LoopStatus.COMPLETED
    assert loops["picture 1"].assignments.get().status == AssignmentStatus.RELEASED
    assert not page.console_errors, page.console_errors
