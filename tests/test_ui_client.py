"""The running app through its HTTP API (gradio_client): a full round step by step, then to the end."""

import statistics
import time

import pytest

from dartree.ui.testing import start_server, stop_server

pytestmark = [pytest.mark.real]

PROMPT = "What is the capital of France?"
WIDTH, BUDGET, DEPTH, CANDIDATES, TOKENS = 4, 12, 7, 32, 12
CONTROLS = dict(prompt=PROMPT, method="dartree", width=WIDTH, budget=BUDGET, depth=DEPTH, candidates=CANDIDATES,
                temperature=0.0, seed=0, max_new_tokens=TOKENS, auto_budget=False, depth_bonus=0.0,
                retrieval="none", continuity=0.0)  # a fixed B, no retrieval, no n-gram term (it settles the cut
# before depth 7 on this prompt, and this round steps all seven depths)


@pytest.fixture(scope="module")
def server():
    proc, url, log = start_server(example_tokens=8)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def plain_tokens():
    import torch

    from dartree.engine import DecodeSettings, generate
    from dartree.models.loading import load_models

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = load_models().target
        return generate(target, None, target.chat_ids(PROMPT), DecodeSettings(method="ar", max_new_tokens=TOKENS)).token_ids
    finally:
        torch.set_num_threads(before)


def call(client, endpoint, controls=CONTROLS):
    """A stage endpoint, the controls passed by name; returns (status, summary)."""
    out = client.predict(api_name=endpoint, **controls)
    return out[0], out[1]


def test_full_round_through_the_api(server, plain_tokens):
    from gradio_client import Client

    client = Client(server, verbose=False)
    status, s = call(client, "/reset")
    assert s["next_stage"] == "prefill" and "Reset" in status
    status, s = call(client, "/draft")
    assert s["next_stage"] == "depth" and "Round 0" in status
    timings = []
    for d in range(1, DEPTH + 1):
        t0 = time.perf_counter()
        status, s = call(client, "/depth")
        timings.append(time.perf_counter() - t0)
        assert s["depths_built"] == d and f"Depth {d}:" in status
    print(f"depth step over HTTP: median {statistics.median(timings):.3f} s, max {max(timings):.3f} s")
    assert s["next_stage"] == "prune" and s["supertree_nodes"] == WIDTH * DEPTH
    status, s = call(client, "/prune")
    assert s["tree_nodes"] == BUDGET
    status, s = call(client, "/verify")
    assert s["next_stage"] == "commit" and s["accepted"] is not None and "bonus" in status
    status, s = call(client, "/commit")
    assert s["round"] == 1 and s["output_ids"] == plain_tokens[: len(s["output_ids"])]
    status, s = call(client, "/run_to_end")
    assert s["finished"] in ("eos", "length") and s["output_ids"] == plain_tokens
    assert s["settings"]["budget"] == BUDGET and s["drafter"].startswith("trained on")
    trace = client.predict(fmt="json", api_name="/trace")
    assert open(trace).read().lstrip().startswith("{")


def test_sessions_are_separate_and_errors_are_messages(server):
    from gradio_client import Client

    a, b = Client(server, verbose=False), Client(server, verbose=False)
    parameters = a.view_api(return_format="dict")["named_endpoints"]["/step"]["parameters"]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in parameters}
    assert set(defaults) == set(CONTROLS)  # the endpoint's parameters are the controls, by name
    _, sa = call(a, "/step", defaults)  # both start from the canonical first round
    assert sa["round"] == 1 and sa["next_stage"] == "depth"
    _, sa = call(a, "/step", defaults)
    _, sb = call(b, "/step", defaults)
    assert sb["depths_built"] == 0 and sa["depths_built"] == 1
    status, _ = call(b, "/draft", dict(CONTROLS, prompt="  "))
    assert status.startswith("⚠️") and "empty" in status
    status, _ = call(b, "/draft", dict(CONTROLS, prompt="word " * 9000))
    assert status.startswith("⚠️") and "context" in status
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="minimum"):  # out-of-range sliders are refused with a message
        call(b, "/draft", dict(CONTROLS, budget=0))
    _, sb2 = call(b, "/step", defaults)
    assert sb2["depths_built"] == 1  # errors left the session's decoder untouched
