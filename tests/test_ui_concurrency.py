"""Eight visitors at once through gradio_client: each gets its own output, equal to plain decoding.

Every client has its own session; they run concurrently (the app queues engine calls), with different
prompts and settings. No output may cross into another session, and the app must stay up.
"""

import threading

import pytest

from dartree.ui.testing import start_server, stop_server

pytestmark = [pytest.mark.real]

TOKENS = 8
SESSIONS = [
    ("What is the capital of France?", "dartree", 4, 12),
    ("Name a primary colour.", "dartree", 8, 32),
    ("Écris un mot en français 🌊", "dartree-fixed", 4, 16),
    ("What is 3 + 4?", "ddtree", 4, 8),
    ("Say hello in Spanish.", "chain", 1, 7),
    ("List two fruits.", "dartree", 2, 4),
    ("What colour is the sky?", "ddtree", 4, 24),
    ("Write the word yes.", "dartree", 12, 48),
]


@pytest.fixture(scope="module")
def server():
    proc, url, log = start_server(example_tokens=8)
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def plain(server):
    import torch

    from dartree.engine import DecodeSettings, generate
    from dartree.models.loading import load_models

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = load_models().target
        return {p: generate(target, None, target.chat_ids(p), DecodeSettings(method="ar", max_new_tokens=TOKENS)).token_ids
                for p, *_ in SESSIONS}
    finally:
        torch.set_num_threads(before)


def test_eight_concurrent_sessions_get_their_own_lossless_output(server, plain):
    from gradio_client import Client

    proc, url = server
    results, errors = {}, []

    def visitor(i, prompt, method, width, budget):
        try:
            client = Client(url, verbose=False)
            controls = dict(prompt=prompt, method=method, width=width, budget=budget, depth=7, candidates=32,
                            temperature=0.0, seed=i, max_new_tokens=TOKENS)  # the others keep their defaults
            client.predict(api_name="/reset", **controls)
            _, summary = client.predict(api_name="/run_to_end", **controls)[:2]
            results[i] = summary
        except Exception as exc:  # reported below, with the session that failed
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=visitor, args=(i, *s)) for i, s in enumerate(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(results) == list(range(len(SESSIONS)))
    for i, (prompt, method, width, budget) in enumerate(SESSIONS):
        s = results[i]
        assert s["output_ids"] == plain[prompt], (i, prompt)
        assert s["settings"]["method"] == method and s["settings"]["budget"] == budget
    assert proc.poll() is None  # the app is still up
    client = Client(url, verbose=False)
    _, s = client.predict(api_name="/reset", prompt=SESSIONS[0][0], method="dartree", width=4, budget=12,
                          max_new_tokens=TOKENS)[:2]
    assert s["next_stage"] == "prefill"
