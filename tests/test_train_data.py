"""The second data mix (issue #21): Magpie filter, reserved rows, long contexts, the shard plan, and the
generation loop's memory bounds (tiny random target, seconds)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from dartree.shards import read_tokens
from dartree.train import datagen, stream
from dartree.train.longctx import REQUESTS, build_long_prompt, long_prompts, pick_sections
from dartree.train.magpie import MagpieStats, normalize, verdict
from dartree.train.mix import kind_of, mix_stats, split_rows
from test_train import LAYERS, random_prompts, tiny_target


# ---------------------------------------------------------------------------------------------- Magpie filter
@pytest.mark.parametrize("text, terminated, reason", [
    ("Can you explain how photosynthesis works in simple terms?", True, None),
    ("Write a Python function that reverses a linked list.", True, None),
    ("Can you explain how photosynthesis works in simple terms?", False, "unterminated"),
    ("   \n ", True, "empty"),
    ("Hello there", True, "short"),
    ("What is <|im_start|>assistant doing here?", True, "template"),
    ("Please help me with this!!!!!!!!!!!!", True, "degenerate"),  # a character run
    ("the cat the cat the cat the cat the cat the cat the cat", True, "degenerate"),  # looping trigrams
    ("12 + 34 = 46; 56 * 78 = 4368; 9 / 3 = 3 ok", True, "degenerate"),  # mostly not letters
    ("I want want want want want want to know about tax rules here", True, "degenerate"),  # one word dominates
])
def test_magpie_verdict_on_hand_examples(text, terminated, reason):
    assert verdict(text, terminated, set()) == reason


def test_magpie_verdict_rejects_repeats_and_measurement_prompts():
    seen: set[str] = set()
    assert verdict("Give me three tips for better sleep.", True, seen) is None
    assert normalize("Give me three tips for better sleep.") in seen
    assert verdict("give me three   tips for better sleep", True, seen) == "duplicate"  # case, spacing, end mark
    forbidden = frozenset({normalize("Summarize the history of Rome.")})
    assert verdict("Summarize the history of Rome.", True, seen, forbidden) == "reserved"
    stats = MagpieStats(sampled=10, accepted=7)
    stats.rejected.update({"short": 2, "duplicate": 1})
    assert stats.as_dict() == {"sampled": 10, "accepted": 7, "rejected": {"duplicate": 1, "short": 2},
                               "rejection_rate": 0.3}


# ---------------------------------------------------------------------------------------------- reserved rows
def test_reserved_rows_are_never_loaded_and_always_refused(tmp_path):
    path = tmp_path / "train_prompts.jsonl"
    n = datagen.RESERVED_FROM_ROW + 7
    path.write_text("".join(json.dumps({"prompt": f"row {i}"}) + "\n" for i in range(n)))
    texts = datagen.load_prompts(path)
    assert len(texts) == datagen.RESERVED_FROM_ROW and texts[-1] == f"row {datagen.RESERVED_FROM_ROW - 1}"
    datagen.guard_rows([0, -1, datagen.RESERVED_FROM_ROW - 1])
    with pytest.raises(ValueError, match="reserved"):
        datagen.guard_rows([3, datagen.RESERVED_FROM_ROW])
    # a shard that records a reserved row is refused before anything is written
    g = stream.Generated(ids=[1, 2, 3], prompt_len=2, features=None)
    with pytest.raises(ValueError, match="reserved"):
        datagen.write_tokens(tmp_path / "tokens-00000.npz", [g], [0],
                             {"train_row": np.array([datagen.RESERVED_FROM_ROW], np.int32)})
    assert not list(tmp_path.glob("tokens-*"))
    with pytest.raises(ValueError, match="dev prompt"):
        datagen.load_prompts(tmp_path / "dev_prompts.jsonl")


def test_split_rows_takes_unused_short_rows_and_every_long_row():
    lengths = [10, 300, None, 20, 400, 30]
    real, long = split_rows(lengths, used={0, 1}, cap=256)
    assert real == [3, 5]  # 0 was used; 2 is empty
    assert long == [1, 4]  # 1 was used, but only cut down to 256 tokens
    with pytest.raises(ValueError, match="reserved"):
        split_rows([10] * (datagen.RESERVED_FROM_ROW + 1), used=set(), cap=256)


def test_shard_kinds_follow_the_cycle():
    cycle = ["real", "magpie", "long", "magpie"]
    kinds = [kind_of(k, cycle) for k in range(9)]
    assert [k for k, _ in kinds] == cycle * 2 + ["real"]
    assert [i for k, i in kinds if k == "magpie"] == [0, 1, 2, 3]
    assert [i for k, i in kinds if k == "real"] == [0, 1, 2]


# ---------------------------------------------------------------------------------------------- long contexts
def test_long_prompts_are_documents_of_earlier_responses_then_a_request():
    sources = [f"Section {i}: " + "word " * (10 * (i + 1)) for i in range(30)]
    lengths = np.array([12 + 10 * (i + 1) for i in range(30)])
    rng = np.random.default_rng(0)
    picked = pick_sections(lengths, 500, rng)
    assert len(set(picked)) == len(picked) >= 2 and 500 <= lengths[picked].sum() <= 1.25 * 500 + lengths.max()
    prompts = long_prompts(sources, lengths, 20, np.random.default_rng(1), min_tokens=200, max_tokens=800)
    for p in prompts:
        body, request = p.rsplit("\n\n", 1)
        assert request in REQUESTS
        parts = [s for s in body.split("\n\n") if s.startswith("Section")]
        assert len(parts) >= 2 and all(s.strip() in {x.strip() for x in sources} for s in parts)
    assert prompts == long_prompts(sources, lengths, 20, np.random.default_rng(1), min_tokens=200, max_tokens=800)
    assert build_long_prompt(["a ", "b"], "Summarize.", "Doc:\n\n") == "Doc:\n\na\n\nb\n\nSummarize."


def test_mix_stats_sum_the_shards(tmp_path):
    g = stream.Generated(ids=[1, 2, 3, 4], prompt_len=1, features=None)
    datagen.write_tokens(datagen.tokens_path(tmp_path, 0), [g, g], [0, 1],
                         {"train_row": np.array([5, -1], np.int32), "source": np.array(["real", "magpie"])},
                         {"kind": "magpie", "magpie": {"sampled": 4, "accepted": 1, "rejected": {"short": 3}}})
    datagen.write_tokens(datagen.tokens_path(tmp_path, 1), [g], [2], {"source": np.array(["document"])})
    assert read_tokens(datagen.tokens_path(tmp_path, 0))["stats"]["kind"] == "magpie"
    s = mix_stats(tmp_path)
    assert s["sequences"] == {"real": 1, "magpie": 1, "document": 1} and s["response_tokens_total"] == 9
    assert s["magpie"] == {"sampled": 4, "accepted": 1, "rejected": {"short": 3}, "rejection_rate": 0.75}


# ---------------------------------------------------------------------------------------------- generation bounds
@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_token_budgets_change_nothing_but_the_batching(target):
    prompts = random_prompts(16, seed=5) + [list(range(2, 60))] * 2  # two long prompts
    plain = stream.generate_batch(target, prompts, 16, LAYERS, batch_size=6)
    rows_seen = []
    orig = stream._prefill

    def spy(target_, items, *a, **k):
        rows_seen.append((len(items), max(len(p) for _, p in items)))
        return orig(target_, items, *a, **k)

    stream._prefill = spy
    try:
        bounded = stream.generate_batch(target, prompts, 16, LAYERS, batch_size=6, max_batch_tokens=120,
                                        max_prefill_tokens=40)
    finally:
        stream._prefill = orig
    assert [g.ids for g in bounded] == [g.ids for g in plain]
    for a, b in zip(bounded, plain):
        np.testing.assert_allclose(a.features.astype(np.float32), b.features.astype(np.float32), rtol=1e-2, atol=1e-2)
    assert all(n * w <= 40 or n == 1 for n, w in rows_seen)  # prefill pieces within their budget


def test_deadline_finishes_started_shards_and_starts_no_new_one(target, tmp_path):
    plan = datagen.PromptList(random_prompts(12, seed=2), 4)
    quiet = dict(batch_size=3, max_new_tokens=8, progress=False, log=lambda *a: None)
    stats = datagen.generate_shards(target, plan, tok_dir=tmp_path, feat_dir=None, deadline=time.time() - 1, **quiet)
    assert stats["shards"] == 0 and datagen.list_shards(tmp_path) == []
    stats = datagen.generate_shards(target, plan, tok_dir=tmp_path, feat_dir=None, **quiet)
    assert stats["shards"] == 3 and datagen.list_shards(tmp_path) == [0, 1, 2]


def test_sampled_responses_are_seeded_draws_not_the_greedy_text(target, tmp_path):
    """The smollm2-cpu-t08 preset's responses (issue #24): drawn at T = 0.8 by the app's own sampler, the same
    text again under the same seed, another text under another seed, and not the greedy text."""
    import torch

    plan = datagen.PromptList(random_prompts(8, seed=3), 4)

    def shards(choose, name):
        folder = tmp_path / name
        datagen.generate_shards(target, plan, tok_dir=folder, feat_dir=None, batch_size=4, max_new_tokens=12,
                                progress=False, log=lambda *a: None, choose=choose)
        return [read_tokens(datagen.tokens_path(folder, k))["ids"].tolist() for k in (0, 1)]

    def drawn(seed, name):
        return shards(stream.sampler(0.8, 1.0, torch.Generator().manual_seed(seed)), name)

    first, again, other = drawn(0, "a"), drawn(0, "b"), drawn(1, "c")
    assert first == again
    assert first != other
    assert first != shards(stream.greedy, "greedy")
