"""Do the Explorer's speed figures agree with `bench`? Reads the page in Chromium, then runs bench. Not a CI test.

Starts the app (dartree.ui.testing.start_server), opens it in headless Chromium and reads the speed ratio (DARTree
over plain decoding) three times: on first load (the worked example, timed at start-up), after Run to end (timed
again) and in the Race. Then stops the app and, in this process with the app's thread setting, runs `bench`
(dartree.bench.run_bench) on the same prompt, shape and token count, the prompt repeated --repeats times. Prints
and writes a comparison (JSON and Markdown): each page figure against bench's, with the checks of issue #26
(each within 25 % of bench's, and none below 0.75x on first load). Timings need a quiet machine.

    python scripts/measure_explorer.py                        # the app's worked example, 32 tokens
    python scripts/measure_explorer.py --tokens 64 --repeats 5 --out artifacts/measure_explorer

Needs the `playwright` package and a system Chromium at /usr/bin/chromium (never `playwright install`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from app import set_threads  # noqa: E402  (the repository root is on the path only now)
from dartree.ui.testing import launch_chromium, start_server, stop_server, wait_text  # noqa: E402

RATIO = re.compile(r"speed ratio ([0-9.]+)×")
WITHIN, FLOOR = 0.25, 0.75  # the checks: within 25 % of bench, and not below 0.75x on first load


def page_ratio(page) -> float | None:
    found = RATIO.search(page.locator("#speed").inner_text())
    return float(found.group(1)) if found else None


def read_page(url: str, timeout_ms: int) -> dict:
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url, wait_until="domcontentloaded", timeout=timeout_ms)
            wait_text(page, "#speed", "Whole runs", timeout_ms)
            out["first_load"] = page_ratio(page)
            out["controls"] = page.evaluate("() => document.querySelector('#prompt textarea').value")
            page.locator("#btn-end").click()
            wait_text(page, "#status", "Ran to the end", timeout_ms)
            page.wait_for_timeout(500)
            out["run_to_end"] = page_ratio(page)
            page.get_by_role("tab", name="Race").click()
            page.locator("#btn-race").click()
            page.wait_for_function("document.body.innerText.includes('Finished: tokens/s')", timeout=timeout_ms)
            ratio = page.locator(".dt-lane[data-method='dartree']").get_attribute("data-ratio")
            out["race"] = float(ratio) if ratio else None
        finally:
            browser.close()
    return out


def run_bench_like_the_page(prompt: str, tokens: int, repeats: int) -> dict:
    """bench on the page's prompt and shape (the app's defaults for this device), the prompt repeated."""
    from dartree.bench import BenchConfig, run_bench
    from dartree.models.loading import load_models
    from dartree.ui.session import default_controls

    threads = set_threads()
    models = load_models()
    controls = default_controls(models, prompt=prompt, max_new_tokens=tokens)
    s = controls.settings()
    configs = [BenchConfig("ar", None, None), BenchConfig(s.method, s.width, s.budget, s.depth_bonus)]
    results = run_bench(models, [prompt] * repeats, configs, s, progress=False)
    row = results["rows"][1]
    return {"ratio": row["speedup_vs_ar"], "median_ratio": row["median_speedup"], "tau": row["tau"],
            "runs": row["n_prompts"], "identical_to_ar": row["identical_to_ar"], "threads": threads,
            "settings": asdict(s), "machine": results["machine"]}


def compare(page: dict, bench: dict) -> list[dict]:
    rows = []
    for name in ("first_load", "run_to_end", "race"):
        value = page.get(name)
        off = value / bench["ratio"] - 1 if value else None
        ok = off is not None and abs(off) <= WITHIN and (name != "first_load" or value >= FLOOR)
        rows.append({"figure": name, "page_ratio": value, "bench_ratio": bench["ratio"], "off": off, "ok": ok})
    return rows


def markdown(result: dict) -> str:
    b = result["bench"]
    lines = [f"Explorer speed figures against `bench` ({result['date']}, {b['machine']['processor']}, "
             f"{b['machine']['cpu_count']} CPUs, {b['threads']} torch thread(s); {result['tokens']} tokens; "
             f"bench: the same prompt {b['runs']} times, τ {b['tau']:.2f}, {b['identical_to_ar']}/{b['runs']} "
             "identical to plain decoding). App start-up: " + result["startup"] + ".", "",
             "| figure | page ratio | bench ratio | off | within 25 % (first load also ≥ 0.75×) |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        page = "—" if r["page_ratio"] is None else f"{r['page_ratio']:.2f}×"
        off = "—" if r["off"] is None else f"{100 * r['off']:+.0f} %"
        lines.append(f"| {r['figure']} | {page} | {r['bench_ratio']:.2f}× | {off} | {'yes' if r['ok'] else 'NO'} |")
    lines += ["", f"Command: `{result['command']}`"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="max new tokens (the worked example's: 32)")
    ap.add_argument("--repeats", type=int, default=5, help="bench runs of the prompt (each: plain, then the method)")
    ap.add_argument("--threads", type=int, default=0, help="DARTREE_THREADS for the app and bench (0: the app's rule)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each page step")
    ap.add_argument("--out", default=str(REPO_ROOT / "artifacts" / "measure_explorer"),
                    help="writes OUT.json and OUT.md")
    args = ap.parse_args()
    import os

    os.environ["DARTREE_THREADS"] = str(args.threads)
    t0 = time.monotonic()
    proc, url, log = start_server(example_tokens=args.tokens, threads=args.threads, timeout=args.timeout)
    try:
        up = time.monotonic() - t0
        page = read_page(url, int(args.timeout * 1000))
    finally:
        stop_server(proc)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("[dartree]")]
    startup = "; ".join(ln.removeprefix("[dartree] ") for ln in lines if "warmed" in ln or "ready" in ln)
    bench = run_bench_like_the_page(page["controls"], args.tokens, args.repeats)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": args.tokens,
              "startup": f"{startup or 'no log line'} (page answered after {up:.1f} s)", "page": page,
              "bench": bench, "command": "python " + " ".join([f"scripts/{Path(__file__).name}"] + sys.argv[1:])}
    result["rows"] = compare(page, bench)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    md = markdown(result)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0 if all(r["ok"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
