"""Screenshots of every tab at a desktop and a projector size, for looking at the layout (and for the README).

Starts the app (dartree.ui.testing.start_server) and, in headless Chromium at 1440 x 900 and 1024 x 768, shoots
the Explorer on first load, after each stage of a round and after Run to end, the Race when finished, and the
Sweep while running and when finished. Full-page PNGs, reduced to a 64-colour palette to stay small.

    python scripts/screenshots.py --out assets/screenshots

Needs the `playwright` package and a system Chromium at /usr/bin/chromium (never `playwright install`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from dartree.ui.testing import (launch_chromium, save_screenshot, start_server,  # noqa: E402  (the repo root
                                stop_server, wait_text)                          # is on the path only now)

SIZES = {"1440x900": (1440, 900), "1024x768": (1024, 768)}
STAGES = (("draft", "Round 1:"), ("depth", "Depth 1:"), ("prune", "next stage: verify"), ("verify", "Verify:"),
          ("commit", "Commit:"), ("end", "Ran to the end"))  # (button, what the status then says)


def shoot(page, path: Path) -> None:
    save_screenshot(page, path)
    print(f"{path} ({path.stat().st_size // 1024} KiB)", flush=True)


def tour(browser, url: str, size: str, out: Path, timeout: float) -> None:
    w, h = SIZES[size]
    page = browser.new_page(viewport={"width": w, "height": h})
    page.goto(url, wait_until="domcontentloaded", timeout=timeout)
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 9", timeout=timeout)
    shoot(page, out / f"explorer-first-load-{size}.png")
    for button, said in STAGES:
        page.locator(f"#btn-{button}").click()
        wait_text(page, "#status", said, timeout)
        shoot(page, out / f"explorer-{button}-{size}.png")
    page.get_by_role("tab", name="Race").click()
    page.locator("#btn-race").click()
    page.wait_for_function("document.body.innerText.includes('Finished: tokens/s')", timeout=timeout)
    shoot(page, out / f"race-{size}.png")
    page.get_by_role("tab", name="Sweep").click()
    page.get_by_role("button", name="Run sweep").click()
    page.wait_for_timeout(2500)
    shoot(page, out / f"sweep-running-{size}.png")
    page.wait_for_function("document.body.innerText.includes('Replayed ')", timeout=timeout)
    shoot(page, out / f"sweep-finished-{size}.png")
    page.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "artifacts" / "screenshots"))
    ap.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, from " + ", ".join(SIZES))
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each step")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc, url, _ = start_server(example_tokens=32, timeout=args.timeout)
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                for size in args.sizes.split(","):
                    tour(browser, url, size, out, args.timeout * 1000)
            finally:
                browser.close()
    finally:
        stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
