"""Greedy output of every method equals plain decoding on the real SmolLM2 target (fp32).

Device-agnostic: DARTREE_TEST_DEVICE=cuda runs them on a GPU (scripts/device_check.sh), still in fp32.

Correctness must not depend on the drafter being good: these run with a random drafter, and with an
"oracle" tree that contains the true continuation so that long accepted paths cross EOS and
max_new_tokens inside one round.
"""

import pytest
import torch

from dartree import TREE_METHODS
from dartree.engine import Decoder, DecodeSettings, generate
from dartree.methods import METHODS as REGISTRY
from dartree.tree import Tree

pytestmark = pytest.mark.real

PROMPTS = ["What is 12 times 7?", "Write a Python function that reverses a string.",
           "Give me two tips for sleeping better."]


@pytest.fixture(scope="module")
def references(real_models):
    target = real_models.target
    out = {}
    for p in PROMPTS:
        ids = target.chat_ids(p)
        out[p] = (ids, generate(target, None, ids, DecodeSettings(method="ar", max_new_tokens=24)).token_ids)
    return out


def test_ar_equals_transformers_generate(real_models, references):
    target = real_models.target
    ids, ref = references[PROMPTS[0]]
    hf = target.model.generate(torch.tensor([ids], device=target.device), max_new_tokens=24,
                               do_sample=False)[0, len(ids):].tolist()
    assert ref == hf[:len(ref)]


RETRIEVAL_METHODS = [m for m in TREE_METHODS if REGISTRY[m].retrieval]


# every method at its defaults (retrieval: RETRIEVAL_DEFAULT, ngram), and the retrieval methods without it
@pytest.mark.parametrize("method,retrieval", [(m, None) for m in TREE_METHODS] + [(m, "none") for m in RETRIEVAL_METHODS])
def test_every_method_equals_ar_with_a_random_drafter(real_models, references, method, retrieval):
    for prompt, (ids, ref) in references.items():
        settings = DecodeSettings(method=method, width=4, budget=12, candidates=16, max_new_tokens=24,
                                  retrieval=retrieval)
        got = generate(real_models.target, real_models.drafter, ids, settings)
        assert got.token_ids == ref, prompt


@pytest.mark.parametrize("method", [m for m in TREE_METHODS if REGISTRY[m].continuity])
def test_the_n_gram_continuity_term_keeps_the_output_of_ar(real_models, references, method):
    """DART's term only reorders the tree (here at its heaviest weight, with and without retrieval); the
    target still verifies every node, so the output stays plain decoding's."""
    for prompt, (ids, ref) in references.items():
        for retrieval in ("none", "ngram"):
            settings = DecodeSettings(method=method, width=4, budget=12, candidates=16, max_new_tokens=24,
                                      retrieval=retrieval, continuity=2.0)
            got = generate(real_models.target, real_models.drafter, ids, settings)
            assert got.settings["continuity"] == 2.0 and got.token_ids == ref, (prompt, retrieval)


@pytest.mark.parametrize("retrieval", ("ngram", "table", "both"))
@pytest.mark.parametrize("method", RETRIEVAL_METHODS)
def test_every_retrieval_method_equals_ar(real_models, references, method, retrieval):
    """Retrieved branches in the tree keep the output equal to plain decoding, and (with a random drafter,
    whose own guesses are rarely right) retrieved nodes are really accepted: the walk crosses them."""
    accepted = 0
    for prompt, (ids, ref) in references.items():
        settings = DecodeSettings(method=method, width=4, budget=12, candidates=16, max_new_tokens=24,
                                  retrieval=retrieval)
        got = generate(real_models.target, real_models.drafter, ids, settings)
        assert got.token_ids == ref, prompt
        accepted += sum(c["accepted"] for r in got.round_records for s, c in r.sources.items() if s != "draft")
    assert accepted > 0


def oracle_draft_block(real_draft_block, sequence: list[int]):
    """`draft_block` whose first candidate at every depth is the true continuation of `sequence`.

    After the real drafter pass, depth d's column 0 becomes sequence[position + d] (swapped with its
    column if it was already a candidate), with a base logit 1000 above the rest and a marginal log-prob
    of 0: every builder's best child at every depth. The builders, the cut and the walk are the real ones,
    so a walk that accepts nothing, or a builder that drops its best child, fails the test.
    """
    def draft_block(drafter, target, context, anchor, position, depth, candidates, siblings=0):
        block = real_draft_block(drafter, target, context, anchor, position, depth, candidates, siblings)
        d = block.draft
        assert d.sibling_tokens is None, "oracle test: keep B <= C (no siblings beyond the candidates)"
        for row in range(d.depth):
            if position + row + 1 >= len(sequence):
                break
            true = sequence[position + row + 1]
            hit = (d.cand_tokens[row] == true).nonzero()
            if len(hit):
                d.cand_tokens[row, int(hit[0])] = d.cand_tokens[row, 0]
            d.cand_tokens[row, 0] = true
            d.cand_base_logits[row, 0] = d.cand_base_logits[row].max() + 1000.0
            d.cand_marginal_lp[row, 0] = 0.0
        return block
    return draft_block


@pytest.mark.parametrize("method", TREE_METHODS)
def test_every_method_accepts_an_oracle_drafters_path(real_models, references, method, monkeypatch):
    """With the true continuation as every depth's best candidate, output == ar and τ > 1: accepted
    tokens really are committed (a walk that accepted nothing would still match ar, but with τ = 1)."""
    import dartree.draft
    import dartree.engine

    for prompt, (ids, ref) in references.items():
        monkeypatch.setattr(dartree.engine, "draft_block", oracle_draft_block(dartree.draft.draft_block, ids + ref))
        settings = DecodeSettings(method=method, width=4, budget=12, candidates=16, max_new_tokens=24)
        got = generate(real_models.target, real_models.drafter, ids, settings)
        assert got.token_ids == ref, prompt
        assert got.tau > 1.5, (prompt, got.tau)


def oracle_tree(anchor: int, future: list[int], device, distractors: int = 2) -> Tree:
    """Root -> the true next tokens as one chain, plus wrong siblings at every depth."""
    tokens, parents, depths = [anchor], [-1], [0]
    parent = 0
    for d, tok in enumerate(future, start=1):
        for j in range(distractors):
            tokens.append((tok + 101 + j) % 49000)
            parents.append(parent)
            depths.append(d)
        tokens.append(tok)
        parents.append(parent)
        depths.append(d)
        parent = len(tokens) - 1
    n = len(tokens)
    return Tree(torch.tensor(tokens, device=device), torch.tensor(parents, device=device),
                torch.tensor(depths, device=device), torch.zeros(n, device=device), max(depths))


def decode_with_oracle(models, ids, reference, max_new_tokens, depth=6, pad_tokens=(13, 14, 15, 16, 17, 18)):
    """Run the real Decoder, but verify oracle trees; returns the decoder after it finishes."""
    dec = Decoder(models.target, models.drafter, ids, DecodeSettings(method="dartree", max_new_tokens=max_new_tokens))
    while dec.next_stage != "done":
        if dec.next_stage == "verify":
            n = len(dec.output)
            future = (reference[n:] + list(pad_tokens))[:depth]  # past the end: tokens beyond EOS/limit
            dec.tree = oracle_tree(dec.output[-1], future, models.target.device)
        dec.step()
    return dec


def test_eos_inside_an_accepted_path_stops_exactly(real_models):
    target = real_models.target
    ids = target.chat_ids("Reply with only the word yes.")
    ref = generate(target, None, ids, DecodeSettings(method="ar", max_new_tokens=64))
    assert ref.finished == "eos" and ref.token_ids[-1] in target.eos_token_ids
    dec = decode_with_oracle(real_models, ids, ref.token_ids, 64)
    assert dec.output == ref.token_ids
    assert dec.finished == "eos"
    assert max(r.committed for r in dec.rounds) > 1  # long paths were accepted
    last = dec.rounds[-1]
    assert last.committed < 7  # the final round's accepted path was cut at EOS


def test_max_new_tokens_inside_an_accepted_path_stops_exactly(real_models, references):
    ids, ref = references[PROMPTS[1]]
    for limit in (5, 9, 13):
        dec = decode_with_oracle(real_models, ids, ref, limit)
        assert dec.output == ref[:limit]
        assert dec.finished == "length"
        assert len(dec.output) == limit


def test_cache_holds_only_prefix_and_committed_tokens(real_models, references):
    ids, ref = references[PROMPTS[2]]
    dec = Decoder(real_models.target, real_models.drafter, ids, DecodeSettings(method="dartree", max_new_tokens=20))
    dec.prefill()
    while dec.next_stage != "done":
        rec = dec.step()
        if rec.stage == "commit" and not rec.finished:
            assert dec.cache.get_seq_length() == len(ids) + len(dec.output) - 1  # the anchor is not cached yet
        if rec.stage == "verify":
            assert dec.cache.get_seq_length() == dec.prefix_len + dec.tree.num_nodes + 1
