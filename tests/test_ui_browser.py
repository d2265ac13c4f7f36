"""The explorer in headless Chromium: panels on first load, then one round clicked through, with screenshots.

The README's screenshot (assets/screenshots/explorer.png) is written when missing or when
DARTREE_UPDATE_SCREENSHOT=1. Needs the `playwright` Python package and a system Chromium at /usr/bin/chromium (never
`playwright install`). Without them the test skips, except under CI=true where they are required.
"""

import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from dartree.ui.testing import (CHROMIUM, REPO_ROOT, launch_chromium, save_screenshot, start_server, stop_server,
                                wait_text)

pytestmark = [pytest.mark.real]

SHOTS = REPO_ROOT / "artifacts" / "screenshots"
README_SHOT = REPO_ROOT / "assets" / "screenshots" / "explorer.png"
PROMPT = "What is the capital of France?"


def _playwright():
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("the playwright package (pip install playwright)")
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but the browser test lacks " + " and ".join(missing))
        pytest.skip("browser test needs " + " and ".join(missing))
    return sync_playwright


@pytest.fixture(scope="module")
def server():
    proc, url, log = start_server(example_tokens=8)
    yield url
    stop_server(proc)


def _wait_status(page, text: str, timeout: float = 90_000):
    wait_text(page, "#status", text, timeout)


def test_page_loads_filled_and_a_round_clicks_through(server):
    sync_playwright = _playwright()
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server, wait_until="domcontentloaded", timeout=60_000)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=60_000)
            assert page.locator(".js-plotly-plot").count() >= 3
            banner = page.locator(".dt-banner").inner_text()
            assert "trained on" in banner and "UNTRAINED" not in banner  # the shipped drafter
            assert "round 1" in page.locator("#status").inner_text()  # the canonical first round is on show
            save_screenshot(page, SHOTS / "explorer-first-load.png")

            page.locator("#prompt textarea").fill(PROMPT)
            page.locator("#btn-draft").click()
            _wait_status(page, "Round 0:")
            for d in (1, 2):
                page.locator("#btn-depth").click()
                _wait_status(page, f"Depth {d}:")
            page.locator("#btn-prune").click()  # runs the remaining depths, then prunes
            _wait_status(page, "Deferred pruning")
            page.locator("#btn-verify").click()
            _wait_status(page, "Verify:")
            page.locator("#btn-commit").click()
            _wait_status(page, "Commit:")
            assert "next stage: draft" in page.locator("#status").inner_text()
            assert page.locator("#text").inner_text().strip()
            assert page.locator(".js-plotly-plot").count() >= 9
            page.locator("#btn-measure").click()  # whole runs of plain decoding and the method, for the speed panel
            _wait_status(page, "whole runs each of plain decoding")
            shot = SHOTS / "explorer-round.png"
            save_screenshot(page, shot)
            assert Image.open(shot).mode == "P"  # palette-reduced, as the README's copy must be
            page.locator("#btn-play").click()  # autoplay: one real engine step per timer tick
            _wait_status(page, "Round 1:")
            _wait_status(page, "Depth 1:")
            page.locator("#btn-play").click()
            page.wait_for_function("document.querySelector('#btn-play').innerText.includes('Play')")
            assert not errors, errors
        finally:
            browser.close()
    if not README_SHOT.exists() or os.environ.get("DARTREE_UPDATE_SCREENSHOT") == "1":
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, README_SHOT)
