"""The preallocated caches and the tree attention without repeated K/V give exactly what the plain ones give, without
the per-forward copies whose cost grows with the context; the bench's end-to-end fields add up."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from dartree import TREE_METHODS
from dartree.attention import TREE_SDPA, use_tree_sdpa
from dartree.bench import BenchConfig, format_table, run_bench
from dartree.cache import PrefixCache, PrefixLayer, compact_cache, new_cache, truncate_cache
from dartree.context_costs import context_curve, context_ids, format_context_curve
from dartree.draft import DrafterContext
from dartree.engine import Decoder, DecodeSettings, generate
from dartree.models.target import Target
from dartree.prompts import DEV_LONG_PROMPTS, read_prompt_file
from dartree.verify import verify_tree
from test_verify import path_of, random_tree
from tiny import tiny_drafter, tiny_target


def gqa_target(**kw):
    """A tiny target whose query heads share key/value heads three to one, like SmolLM2's 9 / 3."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
                         max_position_embeddings=4096, attn_implementation="sdpa", **kw)
    return Target(model=LlamaForCausalLM(config).eval(), tokenizer=None, name="gqa", device=torch.device("cpu"),
                  dtype=torch.float32, eos_token_ids=(63,))


def rounds_of_verify_and_compact(target, cache, prefix, n_rounds=4, seed=0, n_nodes=10):
    """Prefill, then rounds of verify + compact to each tree's deepest node; returns every round's logits."""
    target.forward(torch.tensor([prefix]), torch.arange(len(prefix))[None], cache)
    length, logits = len(prefix), []
    for r in range(n_rounds):
        tree = random_tree(n_nodes, seed=seed + r)
        logits.append(verify_tree(target, tree, cache, length).logits)
        length = compact_cache(cache, length, torch.tensor(path_of(tree, int(tree.depths.argmax()))))
    return logits, length


@pytest.mark.parametrize("capacity", [4, 200])  # 4: the prefill already overflows it, the cache grows
def test_prefix_cache_equals_dynamic_cache_over_rounds(capacity):
    target = tiny_target()
    prefix = [3, 9, 27, 17, 5, 11, 8, 2]
    want, want_len = rounds_of_verify_and_compact(target, DynamicCache(), prefix)
    cache = new_cache(target, capacity)
    got, got_len = rounds_of_verify_and_compact(target, cache, prefix)
    assert got_len == want_len == cache.get_seq_length()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    ref = DynamicCache()
    rounds_of_verify_and_compact(target, ref, prefix)
    for a, b in zip(cache.layers, ref.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert a.keys.data_ptr() == a.key_buffer.data_ptr()  # still a view of the buffer: nothing was copied
    assert cache.capacity >= got_len and (capacity > 4 or cache.capacity > capacity)


def test_growth_keeps_the_rows_and_compaction_matches_a_sequential_prefill():
    layer = PrefixLayer(capacity=3)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(1, 2, n, 4, generator=g) for n in (2, 3, 4)]
    for k in rows:
        layer.update(k, -k)
    assert torch.equal(layer.keys, torch.cat(rows, dim=2)) and torch.equal(layer.values, -torch.cat(rows, dim=2))
    assert layer.capacity >= 9 and layer.get_seq_length() == 9

    target = tiny_target()
    prefix, tree = [3, 9, 27, 17], random_tree(12, seed=4)
    cache = new_cache(target, 64)
    target.forward(torch.tensor([prefix]), torch.arange(4)[None], cache)
    verify_tree(target, tree, cache, 4)
    path = path_of(tree, int(tree.depths.argmax()))
    assert compact_cache(cache, 4, torch.tensor(path)) == 4 + len(path)
    ref = new_cache(target, 64)
    target.forward(torch.tensor([prefix + tree.tokens[path].tolist()]), torch.arange(4 + len(path))[None], ref)
    for a, b in zip(cache.layers, ref.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
    truncate_cache(cache, 2)
    assert cache.get_seq_length() == 2 and all(layer.keys.shape[2] == 2 for layer in cache.layers)


@pytest.mark.parametrize("make", [tiny_target, gqa_target])
@pytest.mark.parametrize("n_nodes", [10, 40])  # <= 10 x 3 rows a group: packed; 40 x 3: enable_gqa
def test_tree_attention_without_repeated_kv_is_bit_exact_with_sdpa(make, n_nodes):
    target = make()
    prefix = list(range(3, 40))
    want, _ = rounds_of_verify_and_compact(target, DynamicCache(), prefix, seed=5, n_nodes=n_nodes)
    use_tree_sdpa(target.model)
    assert target.model.config._attn_implementation == TREE_SDPA
    got, _ = rounds_of_verify_and_compact(target, new_cache(target, 256), prefix, seed=5, n_nodes=n_nodes)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_packed_tree_attention_decodes_like_plain_decoding():
    target = gqa_target()
    use_tree_sdpa(target.model)
    drafter = tiny_drafter(target)
    prompt = [3, 4, 5, 6, 7]
    ref = generate(target, drafter, prompt, DecodeSettings(method="ar", max_new_tokens=24)).token_ids
    for method in TREE_METHODS:
        got = generate(target, drafter, prompt, DecodeSettings(method=method, width=3, budget=10, candidates=6,
                                                                max_new_tokens=24))
        assert got.token_ids == ref, method


def test_drafter_context_appends_in_place_and_grows():
    target = tiny_target()
    drafter = tiny_drafter(target)
    feats = torch.randn(11, 2 * target.hidden_size, generator=torch.Generator().manual_seed(0))
    whole = DrafterContext.from_prefill(drafter, feats)
    parts = DrafterContext.from_prefill(drafter, feats[:3], capacity=5)
    buffers = parts.buffers
    parts.append(feats[3:5], torch.arange(3, 5))
    assert parts.buffers is buffers  # within the capacity: written in place
    parts.append(feats[5:], torch.arange(5, 11))  # past it: grows once
    assert parts.length == 11 and parts.capacity >= 11
    for (k, v), (wk, wv) in zip(parts.kv, whole.kv):
        assert torch.allclose(k, wk, atol=1e-6) and torch.allclose(v, wv, atol=1e-6)
    view = parts.prefix(4)
    assert all(k.shape[2] == 4 and torch.equal(k, pk[:, :, :4]) for (k, _), (pk, _) in zip(view.kv, parts.kv))


def test_decoding_never_grows_or_copies_the_caches():
    target = tiny_target()
    drafter = tiny_drafter(target)
    dec = Decoder(target, drafter, [3, 4, 5, 6], DecodeSettings(method="dartree", width=3, budget=10, candidates=6,
                                                                max_new_tokens=40))
    dec.prefill()
    buffers = [layer.key_buffer for layer in dec.cache.layers]
    context = dec.context.buffers
    while dec.next_stage != "done":
        dec.step()
    assert [layer.key_buffer for layer in dec.cache.layers] == buffers
    assert dec.context.buffers is context
    assert isinstance(dec.cache, PrefixCache)


def test_bench_rows_carry_consistent_end_to_end_figures():
    target = tiny_target()

    class Models:
        pass

    models = Models()
    models.target, models.drafter, models.drafter_description = target, tiny_drafter(target), "tiny"
    target.chat_ids = lambda prompt: [3 + len(prompt) % 7, 4, 5, 6, 7, 8]  # the tiny target has no tokenizer
    configs = [BenchConfig("ar", None, None), BenchConfig("dartree", 3, 10)]
    base = DecodeSettings(candidates=6, max_new_tokens=12).resolved("cpu")
    results = run_bench(models, ["a", "bb"], configs, base, progress=False, warmup_tokens=2)
    ar, tree = results["rows"]
    assert ar["e2e_speedup_vs_ar"] == 1.0 and ar["prefill_vs_ar"] == 1.0
    for row in (ar, tree):
        # e2e counts every new token (the prefill's first one too) over prefill + decoding
        decode_seconds = (row["new_tokens"] - row["n_prompts"]) / row["tokens_per_second"]
        e2e = row["new_tokens"] / (row["prefill_seconds"] + decode_seconds)
        assert row["e2e_tokens_per_second"] == pytest.approx(e2e, rel=1e-9)
    assert tree["e2e_speedup_vs_ar"] == pytest.approx(tree["e2e_tokens_per_second"] / ar["e2e_tokens_per_second"])
    assert tree["prefill_vs_ar"] == pytest.approx(tree["prefill_seconds"] / ar["prefill_seconds"])
    table = format_table(results)
    assert "e2e tok/s" in table and "prefill x" in table


@pytest.mark.real
def test_context_curve_rows_on_the_real_target(real_models):
    documents = read_prompt_file(DEV_LONG_PROMPTS, limit=3)
    ids = context_ids(real_models.target, documents, 100)
    assert 95 <= len(ids) <= 100 and ids[-3:] == real_models.target.chat_ids("x")[-3:]  # the assistant header
    results = context_curve(real_models, documents, contexts=(48, 96), sizes=(1, 9), repeats=1, rounds=2)
    first, last = results["rows"]
    assert first["context_tokens"] < last["context_tokens"] <= 96
    for row in results["rows"]:
        assert row["round_over_ar"] == pytest.approx(row["t_round"] / row["t_ar"])
        assert set(row["verify_seconds"]) == {1, 9} and row["draft_seconds"] > 0
        assert set(row["round_stage_seconds"]) == {"draft", "tree", "verify", "commit"}
    assert results["round_growth"] == pytest.approx(last["round_over_ar"] / first["round_over_ar"])
    assert results["shape"]["budget"] == 8 and "t_round/t_AR at" in format_context_curve(results)
