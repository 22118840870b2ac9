"""Browser tests: Playwright (Python) driving Debian's Chromium against pytest-django's
live server with real channels. Each test saves screenshots under WEIR_TEST_OUTPUT
(default test-output/e2e/ in the repo). The test command installs chromium when missing."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# meanwhile are still synchronous (microsoft/playwright-pytest#29).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

import pytest  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.test import override_settings  # noqa: E402
from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

from appliance import channels  # noqa: E402

CHROMIUM = os.environ.get("WEIR_CHROMIUM", "/usr/bin/chromium")
OUTPUT = Path(os.environ.get("WEIR_TEST_OUTPUT",
                             Path(__file__).resolve().parents[2] / "test-output")) / "e2e"
PASSWORD = "a-long-test-password"


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/test.sh installs Debian's chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                             args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


@pytest.fixture()
def root(tmp_path: Path, settings: Any) -> Iterator[Path]:
    settings.WEIR_UI_REFRESH_S = 0.5
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        yield tmp_path
    channels.close_all()


@pytest.fixture()
def operator(transactional_db: None) -> User:
    return User.objects.create_user("ops", password=PASSWORD, is_staff=True)


class Shots:
    """Saves numbered screenshots of a page under OUTPUT/<test name>/."""

    def __init__(self, page: Page, test: str) -> None:
        self.page, self.count = page, 0
        self.directory = OUTPUT / re.sub(r"[^\w.-]+", "_", test)
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in self.directory.glob("*.png"):
            old.unlink()

    def __call__(self, name: str, full_page: bool = True) -> Path:
        self.count += 1
        path = self.directory / f"{self.count:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path


@pytest.fixture()
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture()
def shot(page: Page, request: pytest.FixtureRequest) -> Shots:
    return Shots(page, request.node.name)


# Every Content-Security-Policy violation of every document the page loads: the listener is
# installed before any of the page's own script runs, and reports through a binding that
# outlives navigations.
REPORT_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) =>
    window.weirCspViolation({directive: e.effectiveDirective, blocked: e.blockedURI,
                             sample: e.sample, url: document.URL}));"""


@pytest.fixture()
def csp_violations(page: Page) -> list[dict[str, Any]]:
    """What the browser refused under the CSP while the test ran: securitypolicyviolation
    events and console errors naming the Content Security Policy."""
    seen: list[dict[str, Any]] = []
    page.context.expose_binding("weirCspViolation", lambda source, v: seen.append(v))
    page.context.add_init_script(REPORT_VIOLATIONS)
    page.on("console", lambda message: seen.append({"console": message.text})
            if "Content Security Policy" in message.text else None)
    return seen


def login(page: Page, base: str, user: str = "ops") -> None:
    """Log in through the login form."""
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
