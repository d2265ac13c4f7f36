"""The speed panel's machine reference: the committed bench row for the shape on show (dartree.ui.reference)."""

from dataclasses import replace

from dartree.engine import DecodeSettings
from dartree.ui.reference import bench_reference, bench_results


def result(date, device, rows, temperature=0.0, n=30):
    return {"file": f"assets/benchmarks/{date}.json", "date": date, "device": device, "command": "bench",
            "settings": {"temperature": temperature, "candidates": 64, "max_new_tokens": 128},
            "rows": [dict(r, n_prompts=n, tau=2.0) for r in rows]}


def row(method, width, budget, bonus, speedup):
    return {"method": method, "width": width, "budget": budget, "depth_bonus": bonus, "speedup_vs_ar": speedup}


def test_the_newest_row_of_the_same_shape_and_device_wins():
    s = DecodeSettings(method="dartree", width=4, budget=8, depth_bonus=-0.2, retrieval="none",
                       continuity=0.0).resolved("cpu")
    old = result("2026-11-01", "cpu", [row("dartree", 4, 8, -0.2, 1.1)])
    new = result("2026-12-01", "cpu", [row("dartree", 4, 8, -0.2, 1.5), row("dartree", 4, 8, 0.0, 1.7)])
    gpu = result("2026-12-24", "cuda:0", [row("dartree", 4, 8, -0.2, 3.0)])
    hot = result("2026-12-24", "cpu", [row("dartree", 4, 8, -0.2, 0.5)], temperature=0.7)
    other = result("2026-12-24", "cpu", [row("dartree", 8, 8, -0.2, 0.9), row("dartree", 4, 16, -0.2, 0.8)])
    ref = bench_reference(s, "cpu", (old, new, gpu, hot, other))
    assert ref["speedup"] == 1.5 and ref["date"] == "2026-12-01" and ref["n_prompts"] == 30
    assert bench_reference(s, "cuda", (old, new, gpu))["speedup"] == 3.0
    # a row from before the depth bonus existed (None) ran without one
    legacy = result("2026-10-01", "cpu", [row("dartree", 4, 8, None, 1.3)])
    assert bench_reference(DecodeSettings(depth_bonus=0.0, retrieval="none", continuity=0.0).resolved("cpu"), "cpu",
                           (legacy,))["speedup"] == 1.3
    assert bench_reference(s, "cpu", (legacy,)) is None
    # ddtree has no W and no depth bonus: they do not have to match
    dd = result("2026-12-01", "cpu", [row("ddtree", None, 8, None, 1.4)])
    assert bench_reference(DecodeSettings(method="ddtree", budget=8).resolved("cpu"), "cpu", (dd,))["speedup"] == 1.4
    assert bench_reference(DecodeSettings(method="ar").resolved("cpu"), "cpu", (dd,)) is None


def test_retrieval_mode_and_weight_path_must_match():
    s = DecodeSettings(method="dartree", width=4, budget=8, depth_bonus=-0.2, retrieval="ngram",
                       continuity=0.0).resolved("cpu")
    plain = result("2026-12-05", "cpu", [row("dartree", 4, 8, -0.2, 1.6)])  # no retrieval field: none
    ngram = result("2026-12-04", "cpu", [dict(row("dartree", 4, 8, -0.2, 2.2), retrieval="ngram")])
    blocks = dict(result("2026-12-03", "cpu", [dict(row("dartree", 4, 8, -0.2, 1.2), retrieval="ngram")]),
                  weights="gguf")
    assert bench_reference(s, "cpu", (plain, ngram, blocks))["speedup"] == 2.2  # the newest match, any path
    assert bench_reference(s, "cpu", (plain, ngram, blocks), weights="fp32")["speedup"] == 2.2
    assert bench_reference(s, "cpu", (plain, ngram, blocks), weights="gguf")["speedup"] == 1.2
    assert bench_reference(replace(s, retrieval="none"), "cpu", (ngram, blocks)) is None


def test_the_continuity_weight_must_match_and_older_rows_ran_without_the_term():
    s = DecodeSettings(method="dartree", width=4, budget=8, depth_bonus=-0.2, retrieval="none",
                       continuity=0.1).resolved("cpu")
    old = result("2026-12-06", "cpu", [row("dartree", 4, 8, -0.2, 1.5)])  # no continuity field: 0
    new = result("2026-12-01", "cpu", [dict(row("dartree", 4, 8, -0.2, 1.6), continuity=0.1)])
    assert bench_reference(s, "cpu", (old, new))["speedup"] == 1.6
    assert bench_reference(replace(s, continuity=0.0), "cpu", (old, new))["speedup"] == 1.5


def test_a_result_of_the_loaded_drafter_wins_over_a_newer_one_of_another():
    s = DecodeSettings(method="dartree", width=4, budget=8, depth_bonus=-0.2, retrieval="none",
                       continuity=0.0).resolved("cpu")
    ours = dict(result("2026-12-01", "cpu", [row("dartree", 4, 8, -0.2, 1.6)]), drafter="ours")
    theirs = dict(result("2026-12-02", "cpu", [row("dartree", 4, 8, -0.2, 2.0)]), drafter="theirs")
    same_day = dict(result("2026-12-01", "cpu", [row("dartree", 4, 8, -0.2, 1.9)]), drafter="theirs")
    for order in ((ours, theirs, same_day), (same_day, theirs, ours)):  # not by the order files are listed in
        ref = bench_reference(s, "cpu", order, drafter="ours")
        assert ref["speedup"] == 1.6 and ref["same_drafter"]
    ref = bench_reference(s, "cpu", (theirs, same_day), drafter="ours")  # none of ours: the newest, flagged
    assert ref["speedup"] == 2.0 and not ref["same_drafter"]
    assert bench_reference(s, "cpu", (ours, theirs))["speedup"] == 2.0  # no drafter given: the newest


def test_the_committed_benchmarks_hold_a_reference_for_the_cpu_default():
    assert bench_results(), "no bench result under assets/benchmarks"
    ref = bench_reference(DecodeSettings().resolved("cpu"), "cpu")
    assert ref is not None and ref["n_prompts"] >= 10 and ref["file"].startswith("assets/benchmarks/")


def test_the_shipped_drafter_has_its_own_reference_for_the_cpu_default():
    from dartree.models.loading import SHIPPED_DRAFTER, describe_checkpoint

    shipped = describe_checkpoint(SHIPPED_DRAFTER)
    for weights in ("fp32", "gguf"):
        ref = bench_reference(DecodeSettings().resolved("cpu"), "cpu", weights=weights, drafter=shipped)
        assert ref is not None and ref["same_drafter"], f"no {weights} bench of the shipped drafter's default shape"


def test_a_bench_file_says_its_weight_path_and_older_files_are_read_from_their_description(tmp_path):
    import json

    root = tmp_path / "assets" / "benchmarks"
    root.mkdir(parents=True)
    rows = [dict(row("dartree", 4, 8, -0.2, 1.5), n_prompts=30, tau=2.0)]
    machines = {"new-gguf": {"device": "cpu", "weights": "gguf", "cpu_linears": "CPU linears: the row kernel"},
                "new-fp32": {"device": "cpu", "weights": "fp32", "cpu_linears": "the GGUF's blocks (ignored)"},
                "old-gguf": {"device": "cpu", "cpu_linears": "the row kernel, the GGUF's Q4_1/Q8_0 blocks"},
                "old-fp32": {"device": "cpu", "cpu_linears": "the row kernel, fp32 panels"}}
    for name, machine in machines.items():
        (root / f"{name}.json").write_text(json.dumps({"rows": rows, "machine": machine, "command": "bench"}))
    found = {r["file"].split("/")[-1]: r["weights"] for r in bench_results(root)}
    assert found == {"new-gguf.json": "gguf", "new-fp32.json": "fp32", "old-gguf.json": "gguf",
                     "old-fp32.json": "fp32"}
