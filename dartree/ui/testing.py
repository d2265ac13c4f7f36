"""Helpers for the UI tests and scripts: start `app.py` in a subprocess on a free localhost port and wait for it;
open headless Chromium on it (the system browser: never `playwright install`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch_chromium(playwright):
    """Headless system Chromium from a `sync_playwright()` context."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def wait_text(page, selector: str, text: str, timeout_ms: float) -> None:
    """Wait until the element's visible text contains `text`."""
    page.wait_for_function("([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)",
                           arg=[selector, text], timeout=timeout_ms)


def save_screenshot(page, path: Path, settle_ms: int = 600) -> None:
    """A full-page PNG of `page`, reduced to a 64-colour palette (a fifth of the size; the UI's flat colours
    survive it). The one place the README's and the scripts' screenshots are written."""
    from PIL import Image  # Pillow comes with Gradio; imported here so the server helpers do not need it

    page.wait_for_timeout(settle_ms)  # let Plotly finish drawing
    page.screenshot(path=str(path), full_page=True)
    Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(example_tokens: int = 12, threads: int = 1, timeout: float = 240.0, log_path: Path | None = None):
    """Launch the explorer; returns (process, url, log file path). Raises if it does not come up."""
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
               DARTREE_EXAMPLE_TOKENS=str(example_tokens), DARTREE_THREADS=str(threads),
               GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    log_path = Path(log_path or (REPO_ROOT / "artifacts" / f"ui-server-{port}.log"))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "app.py")], cwd=REPO_ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            log.close()
            raise RuntimeError(f"the app exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return proc, url, log_path
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"the app did not answer within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop_server(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
