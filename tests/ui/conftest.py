"""The browser for the explorer's tests: Debian's Chromium (`make chromium`), headless, driven by
Playwright (its own browser download is not used), one per module.

`Watched` pages record every console error, uncaught exception, failed request and 4xx/5xx
response, so a test can require that a whole session with the page had none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from tests.hub import HubEnv, hub_environment

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@dataclass
class Watched:
    """A page and what went wrong on it."""

    page: Page
    problems: list[str] = field(default_factory=list)

    def idle(self) -> None:
        """Wait until the page has no request of its own in flight (`aria-busy` gone)."""
        # a selector, not a script: the page's Content-Security-Policy forbids eval
        self.page.locator("body:not([aria-busy])").wait_for(state="attached", timeout=60_000)


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1200, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    out = Watched(page)
    page.on(
        "console",
        lambda m: out.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: out.problems.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: out.problems.append(f"failed: {r.method} {r.url}"))
    page.on(
        "response",
        lambda r: (
            out.problems.append(f"{r.status}: {r.request.method} {r.url}")
            if r.status >= 400
            else None
        ),
    )
    yield out
    context.close()


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEnv]:
    """The server's huggingface_hub offline on a local cache of the real configs (`tests.hub`)."""
    yield from hub_environment(tmp_path, monkeypatch)
