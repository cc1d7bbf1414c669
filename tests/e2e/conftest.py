"""Fixtures for the browser tests: a Debian chromium page through Playwright (with its
console-error log), the project "acme" and its scientist "sam", who signs in with PASSWORD."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from studio import actions
from studio.models import Role
from tests.factories import make_member

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path("/tmp")
PASSWORD = "pw-scientist-123"


@pytest.fixture
def project(transactional_db):
    return actions.create_project(slug="acme", name="Acme Research")


@pytest.fixture
def scientist(project):
    return make_member(project, "sam", Role.SCIENTIST, password=PASSWORD)


@pytest.fixture
def browser_page(monkeypatch) -> Iterator:
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium not installed at /usr/bin/chromium")
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # (fixtures, teardown) are synchronous and safe, so tell Django not to refuse them.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
        page = context.new_page()
        page.set_default_timeout(20_000)
        console_errors: list[str] = []
        page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: console_errors.append(str(error)))
        page.console_errors = console_errors  # type: ignore[attr-defined]
        try:
            yield page
        finally:
            context.close()
            browser.close()
