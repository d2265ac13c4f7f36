"""Edge cases on the real SmolLM2 target: odd prompts, extreme settings, long runs, missing or broken files.

The drafter is the seeded random one: correctness must not depend on it. Wherever decoding is greedy the
output is compared with plain decoding (`method="ar"`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dartree import METHODS, TREE_METHODS
from dartree.engine import MAX_BUDGET, MAX_CANDIDATES, MAX_TEMPERATURE, MAX_WIDTH, Decoder, DecodeSettings, generate
from dartree.errors import UserError
from dartree.models import target as target_mod
from dartree.models.drafter import DominoDrafter
from dartree.models.gguf_panels import CACHE_FILE
from dartree.models.loading import load_drafter, load_models
from dartree.models.rows_kernel import use_rows_kernel
from dartree.prompts import fit_to_context
from dartree.retrieval import max_retrieved
from dartree.sampling import processed_probs
from tiny import tiny_drafter, tiny_target

pytestmark = pytest.mark.real

SHORT = 4  # new tokens for the many small runs: each dartree round with a random drafter commits ~1 token
PROMPT = "Give me two tips for sleeping better."


def ar(target, ids, n):
    return generate(target, None, ids, DecodeSettings(method="ar", max_new_tokens=n))


def teacher_forced_logits(target, ids: list[int], chunk: int = 512) -> torch.Tensor:
    """Logits [len(ids), V] of one causal pass over `ids`, the lm head applied chunk by chunk."""
    with torch.inference_mode():
        hidden = target.model.model(input_ids=torch.tensor([ids], device=target.device)).last_hidden_state[0]
        return torch.cat([target.lm_head(hidden[i:i + chunk]) for i in range(0, hidden.shape[0], chunk)])


@pytest.fixture(scope="module")
def prompt_ids(real_models):
    return real_models.target.chat_ids(PROMPT)


@pytest.fixture(scope="module")
def reference(real_models, prompt_ids):
    return ar(real_models.target, prompt_ids, SHORT).token_ids


# ---------------------------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("prompt", ["", "   ", "\n\t \n", None])
def test_empty_or_blank_prompt_is_a_user_error(real_models, prompt):
    with pytest.raises(UserError, match="the prompt is empty"):
        real_models.target.chat_ids(prompt)


def test_decoder_refuses_an_empty_prompt(real_models):
    for method in METHODS:
        with pytest.raises(UserError, match="the prompt is empty"):
            Decoder(real_models.target, real_models.drafter, [], DecodeSettings(method=method))


def test_fit_to_context_drops_the_oldest_tokens_and_says_how_many(real_models):
    target, drafter = real_models.target, real_models.drafter
    assert target.max_context == 8192
    reserve = 64 + drafter.block_size
    ids = [1000 + (i % 40000) for i in range(10_000)]  # built, not tokenized: 10k valid token ids
    kept, dropped = fit_to_context(ids, target.max_context, reserve)
    assert len(kept) == target.max_context - reserve and dropped == len(ids) - len(kept)
    assert kept == ids[dropped:]  # truncated from the left: the end of the prompt survives
    short = ids[:100]
    assert fit_to_context(short, target.max_context, reserve) == (short, 0)
    with pytest.raises(UserError, match="cannot hold"):
        fit_to_context(ids, target.max_context, target.max_context)
    settings = DecodeSettings(method="dartree", max_new_tokens=64)
    Decoder(target, drafter, kept, settings)  # exactly at the limit: accepted
    for too_long in (kept + [5], ids):
        with pytest.raises(UserError, match=r"the prompt has \d+ tokens; with 64 new tokens it exceeds .* 8192"):
            Decoder(target, drafter, too_long, settings)
    ar_settings = DecodeSettings(method="ar", max_new_tokens=64)
    Decoder(target, None, ids[:target.max_context - 65], ar_settings)
    with pytest.raises(UserError, match="exceeds the target's context"):
        Decoder(target, None, ids[:target.max_context - 64], ar_settings)


@pytest.mark.slow
def test_a_prompt_at_the_edge_of_the_context_decodes_like_ar(real_models):
    """Positions up to the last one the context allows: both methods run and agree."""
    target, drafter = real_models.target, real_models.drafter
    n = 4
    story = target.tokenizer.encode("Once upon a time, a dragon learned to cook. " * 900, add_special_tokens=False)
    ids, dropped = fit_to_context(story, target.max_context, n + drafter.block_size)
    assert dropped > 0 and len(ids) + n + drafter.block_size == target.max_context
    ref = ar(target, ids, n)
    got = generate(target, drafter, ids, DecodeSettings(method="dartree", max_new_tokens=n))
    assert got.token_ids == ref.token_ids


@pytest.mark.parametrize("prompt", ["Écris un haïku sur la mer 🌊", "用一句话介绍长城。",
                                    "Translate to English: «Привет, мир!» 👩‍👩‍👧 — مرحبا"])
def test_non_ascii_and_emoji_prompts(real_models, prompt):
    target = real_models.target
    ids = target.chat_ids(prompt)
    assert prompt in target.decode(ids)  # the byte-level tokenizer round-trips every character
    ref = ar(target, ids, SHORT)
    got = generate(target, real_models.drafter, ids, DecodeSettings(method="dartree", max_new_tokens=SHORT))
    assert got.token_ids == ref.token_ids
    assert isinstance(got.text, str) and got.text == target.decode(got.token_ids)


@pytest.fixture(scope="module")
def eos_first_prompt(real_models):
    """A finished assistant answer: the target's next token is <|im_end|> (found empirically, p ~ 0.77)."""
    target = real_models.target
    return target.chat_ids("What is the capital of France?") + target.tokenizer.encode(
        "The capital of France is Paris.", add_special_tokens=False)


@pytest.mark.parametrize("method", METHODS)
def test_prompt_whose_first_token_is_eos(real_models, eos_first_prompt, method):
    target = real_models.target
    dec = Decoder(target, real_models.drafter, eos_first_prompt, DecodeSettings(method=method, max_new_tokens=16))
    result = dec.run()
    assert result.finished == "eos" and result.new_tokens == 1
    assert result.token_ids[0] in target.eos_token_ids
    assert result.rounds == 0 and dec.next_stage == "done"
    with pytest.raises(UserError, match="has finished"):
        dec.step()


# ---------------------------------------------------------------------------------------------- settings
EXTREME_GREEDY = {
    "W1-B1": DecodeSettings(width=1, budget=1),
    "W64-B1024-supertree-smaller-than-B": DecodeSettings(width=MAX_WIDTH, budget=MAX_BUDGET),
    "W1-B1024": DecodeSettings(width=1, budget=MAX_BUDGET),
    "W64-B1": DecodeSettings(width=MAX_WIDTH, budget=1),
    "depth1": DecodeSettings(depth=1),
    "depth1-W64-B1024": DecodeSettings(depth=1, width=MAX_WIDTH, budget=MAX_BUDGET),
    "C1": DecodeSettings(candidates=1),
    "C512-W64-B64": DecodeSettings(candidates=MAX_CANDIDATES, width=MAX_WIDTH, budget=64),
    "T0-top_p0.1": DecodeSettings(top_p=0.1),
    "fixed-B1024": DecodeSettings(method="dartree-fixed", budget=MAX_BUDGET),
    "fixed-B1-depth1": DecodeSettings(method="dartree-fixed", budget=1, depth=1),
    "ddtree-B1024": DecodeSettings(method="ddtree", budget=MAX_BUDGET),
    "ddtree-B1": DecodeSettings(method="ddtree", budget=1),
    "chain-depth1": DecodeSettings(method="chain", depth=1),
}


HEAVY = {"fixed-B1024", "ddtree-B1024"}  # 1,024-node verify passes: about a minute each on a busy 2-core CPU


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in EXTREME_GREEDY])
def test_extreme_settings_equal_ar_at_temperature_0(real_models, prompt_ids, reference, name):
    settings = replace(EXTREME_GREEDY[name], max_new_tokens=SHORT)
    dec = Decoder(real_models.target, real_models.drafter, prompt_ids, settings)
    result = dec.run()
    assert result.token_ids == reference
    s = dec.settings
    # the cut keeps at most B, from a supertree of at most W per depth plus the retrieved chains
    supertree = s.width * s.depth + max_retrieved(s.retrieval, s.depth)
    bound = {"dartree": min(s.budget, supertree), "dartree-fixed": s.budget, "ddtree": s.budget,
             "chain": s.depth}[s.method]
    assert all(1 <= r.tree_nodes <= bound for r in result.round_records), [r.tree_nodes for r in result.round_records]


def in_nucleus(logits: torch.Tensor, token: int, temperature: float, top_p: float, tol: float = 1e-4) -> bool:
    """Whether `token` is inside the top-p set: the mass of strictly likelier tokens is below top_p."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return bool(probs[probs > probs[token]].sum() < top_p + tol)


@pytest.mark.parametrize("method", ["ar", "dartree"])
@pytest.mark.parametrize("temperature,top_p", [(1.5, 1.0), (1.5, 0.1), (MAX_TEMPERATURE, 0.9)])
def test_sampling_extremes_run_and_stay_in_the_nucleus(real_models, prompt_ids, method, temperature, top_p):
    target = real_models.target
    settings = DecodeSettings(method=method, temperature=temperature, top_p=top_p, seed=7, max_new_tokens=SHORT)
    first = generate(target, real_models.drafter, prompt_ids, settings)
    assert first.finished in ("eos", "length") and 1 <= first.new_tokens <= SHORT
    assert all(0 <= t < target.vocab_size for t in first.token_ids)
    again = generate(target, real_models.drafter, prompt_ids, settings)
    assert again.token_ids == first.token_ids  # a seed fixes the draws
    logits = teacher_forced_logits(target, prompt_ids + first.token_ids)[len(prompt_ids) - 1:-1]
    for row, tok in zip(logits, first.token_ids):
        assert in_nucleus(row, tok, temperature, top_p), tok


def test_tiny_top_p_is_greedy_at_any_temperature(real_models, prompt_ids, reference):
    """top_p below 1/V keeps only the top token (its prob is >= 1/V), so sampling must equal greedy decoding."""
    assert processed_probs(torch.tensor([[0.0, 0.0, 5.0]]), 1.5, 1e-6).tolist() == [[0.0, 0.0, 1.0]]
    for method in ("ar", "dartree"):
        settings = DecodeSettings(method=method, temperature=1.5, top_p=1e-6, seed=3, max_new_tokens=SHORT)
        assert generate(real_models.target, real_models.drafter, prompt_ids, settings).token_ids == reference


# ---------------------------------------------------------------------------------------------- long run
LONG_TOKENS = int(os.environ.get("DARTREE_LONG_TOKENS", "2000"))


def storage_rows(tensor: torch.Tensor) -> int:
    """Sequence rows the storage behind a [b, h, n, d] cache tensor holds (a view can hide a bigger one)."""
    b, h, _, d = tensor.shape
    return tensor.untyped_storage().nbytes() // (tensor.element_size() * b * h * d)


@pytest.mark.slow
def test_long_run_keeps_the_cache_bounded(real_models):
    """LONG_TOKENS (2,000) new tokens with dartree; after every verify the cache holds the prefix, the
    committed tokens and the current tree, nothing more, and after every commit only the committed rows."""
    target, drafter = real_models.target, real_models.drafter
    ids = target.chat_ids("Write a very long story, at least 5000 words, about a dragon who learns to cook. "
                          "Describe every dish in detail.")
    # a small tree (W=2, B=4) keeps 2,000 rounds of a random drafter within a few minutes on 2 cores
    dec = Decoder(target, drafter, ids, DecodeSettings(method="dartree", width=2, budget=4, candidates=8,
                                                       max_new_tokens=LONG_TOKENS))
    dec.prefill()
    assert dec.cache.get_seq_length() == len(ids)
    # the cache is preallocated once (dartree.cache.PrefixCache): its storage never grows or moves
    storages = [(layer.keys.untyped_storage().data_ptr(), storage_rows(layer.keys)) for layer in dec.cache.layers]
    capacity = len(ids) + LONG_TOKENS + dec.settings.budget + drafter.max_depth + 2
    assert all(rows <= capacity for _, rows in storages)
    while dec.next_stage != "done":
        rec = dec.step()
        if rec.stage == "verify":
            bound = len(ids) + len(dec.output) + dec.tree.num_nodes  # the anchor is the tree's root
            assert dec.cache.get_seq_length() == bound
            assert [(layer.keys.untyped_storage().data_ptr(), storage_rows(layer.keys))
                    for layer in dec.cache.layers] == storages
        elif rec.stage == "commit" and not rec.finished:
            assert dec.cache.get_seq_length() == dec.prefix_len == len(ids) + len(dec.output) - 1
            assert dec.context.length == dec.prefix_len  # the drafter's context grows by committed tokens only
            assert all(k.shape[2] == dec.prefix_len for k, _ in dec.context.kv)
    result = dec.result()
    assert result.finished == "eos" or result.new_tokens == LONG_TOKENS
    # Greedy check of all tokens at once: each is the argmax of a teacher-forced pass (1e-3 logit slack for
    # the rounding differences between one long pass and the incremental ones).
    logits = teacher_forced_logits(target, ids + result.token_ids)[len(ids) - 1:-1]
    chosen = logits.gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
    assert bool((chosen >= logits.max(dim=-1).values - 1e-3).all())
    per_round = result.decode_seconds / max(result.rounds, 1)
    print(f"{result.new_tokens} tokens ({result.finished}) in {result.rounds} rounds, {per_round:.3f} s/round")


# ---------------------------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def tiny():
    t = tiny_target()
    return t, tiny_drafter(t)


def test_missing_drafter_folder_is_an_error_not_random_weights(real_models):
    for name in ("/no/such/dir", "./no-such-drafter", "~/no-such-drafter"):
        with pytest.raises(UserError, match="does not exist"):
            load_drafter(name, real_models.target)
    with pytest.raises(UserError, match="does not exist"):
        load_models("smollm2-135m", drafter="/no/such/dir")


def test_default_drafter_for_another_target_is_an_error(tiny):
    with pytest.raises(UserError):  # no shipped drafter for it, or the shipped one does not fit it
        load_drafter("default", tiny[0])


def saved(tmp_path, tiny) -> Path:
    folder = tmp_path / "drafter"
    tiny[1].save_pretrained(folder)
    return folder


def test_good_checkpoint_round_trips(tmp_path, tiny):
    drafter, description = load_drafter(str(saved(tmp_path, tiny)), tiny[0])
    assert isinstance(drafter, DominoDrafter) and "no training record" in description


@pytest.mark.parametrize("damage,message", [
    ("truncate", "unreadable"), ("garbage", "unreadable"), ("empty", "unreadable"),
    ("no-weights", "has no safetensors"), ("no-config", "has no config.json"), ("bad-json", "not valid JSON"),
    ("missing-key", "do not match its config"),
])
def test_broken_drafter_checkpoint_is_a_user_error(tmp_path, tiny, damage, message):
    folder = saved(tmp_path, tiny)
    weights = folder / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(os.urandom(4096))
    elif damage == "empty":
        weights.write_bytes(b"")
    elif damage == "no-weights":
        weights.unlink()
    elif damage == "no-config":
        (folder / "config.json").unlink()
    elif damage == "bad-json":
        (folder / "config.json").write_text("{not json")
    elif damage == "missing-key":
        from safetensors.torch import load_file, save_file
        state = load_file(str(weights))
        state.pop(sorted(state)[0])
        save_file(state, str(weights))
    with pytest.raises(UserError, match=message):
        load_drafter(str(folder), tiny[0])


def test_drafter_for_another_target_is_refused(tmp_path, real_models, tiny):
    with pytest.raises(UserError, match="does not fit this target"):
        load_drafter(str(saved(tmp_path, tiny)), real_models.target)


@pytest.fixture(scope="module")
def real_cache(real_models):
    """The converted folder the session uses (the real_models fixture made sure it exists)."""
    folder = target_mod.converted_dir()
    assert target_mod.converted_is_valid(folder)
    return folder


def copy_small_files(src: Path, dest: Path) -> None:
    """A copy of the converted folder with the 540 MB weights replaced by a 1 kB stub (for marker checks),
    without the derived GGUF block panels (96 MB, rebuilt when missing)."""
    dest.mkdir(parents=True)
    for path in src.iterdir():
        if path.name == CACHE_FILE:
            continue
        if path.name == "model.safetensors":
            with path.open("rb") as f:
                (dest / path.name).write_bytes(f.read(1024))
        else:
            shutil.copy2(path, dest / path.name)


@pytest.fixture
def spy_convert(monkeypatch):
    """ensure_embedded_converted with the 40 s conversion replaced by a recorder that writes a valid marker."""
    calls = []

    def fake(dest=None, progress=True):
        dest = Path(dest)
        calls.append(dest)
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        (dest / "config.json").write_text("{}")
        (dest / target_mod.CONVERTED_MARKER).write_text(json.dumps({"files": ["config.json"], "sizes": {"config.json": 2}}))
        return dest

    monkeypatch.setattr(target_mod, "convert_embedded", fake)
    return calls


def test_empty_cache_is_converted(tmp_path, monkeypatch, spy_convert):
    monkeypatch.setenv("DARTREE_CACHE", str(tmp_path / "cache"))
    folder = target_mod.converted_dir()
    assert folder.is_relative_to(tmp_path) and not target_mod.converted_is_valid(folder)
    assert target_mod.ensure_embedded_converted(progress=False) == folder
    assert spy_convert == [folder] and target_mod.converted_is_valid(folder)
    target_mod.ensure_embedded_converted(progress=False)
    assert spy_convert == [folder]  # a finished conversion is reused


@pytest.mark.parametrize("damage", ["no-marker", "marker-not-json", "marker-lists-nothing", "listed-file-missing"])
def test_half_written_cache_is_rebuilt_not_used(tmp_path, monkeypatch, real_cache, spy_convert, damage):
    monkeypatch.setenv("DARTREE_CACHE", str(tmp_path / "cache"))
    folder = target_mod.converted_dir()
    copy_small_files(real_cache, folder)
    marker = folder / target_mod.CONVERTED_MARKER
    if damage == "no-marker":
        marker.unlink()
    elif damage == "marker-not-json":
        marker.write_text('{"files": [')
    elif damage == "marker-lists-nothing":
        marker.write_text(json.dumps({"files": []}))
    elif damage == "listed-file-missing":
        (folder / "model.safetensors").unlink()
    assert not target_mod.converted_is_valid(folder)
    target_mod.ensure_embedded_converted(progress=False)
    assert spy_convert == [folder]


def test_cache_with_marker_but_corrupt_weights_is_not_valid(tmp_path, monkeypatch, real_cache):
    """A marker does not prove the weights are whole (disk full, a killed copy, a later edit)."""
    monkeypatch.setenv("DARTREE_CACHE", str(tmp_path / "cache"))
    folder = target_mod.converted_dir()
    copy_small_files(real_cache, folder)  # marker intact, model.safetensors cut to 1 kB
    assert not target_mod.converted_is_valid(folder), "a truncated model.safetensors passes as a finished conversion"


def test_target_folder_with_corrupt_weights_is_a_user_error(tmp_path, real_cache):
    folder = tmp_path / "target"
    copy_small_files(real_cache, folder)
    with pytest.raises(UserError, match="could not load target"):
        target_mod.load_target(str(folder))


@pytest.mark.slow
def test_interrupted_conversion_is_redone_for_real(tmp_path, monkeypatch, real_models, real_cache):
    """A cache left without its marker (a killed conversion) is rebuilt from the GGUF and gives the same model."""
    monkeypatch.setenv("DARTREE_CACHE", str(tmp_path / "cache"))
    folder = target_mod.converted_dir()
    copy_small_files(real_cache, folder)
    (folder / target_mod.CONVERTED_MARKER).unlink()
    assert target_mod.ensure_embedded_converted(progress=False) == folder
    assert target_mod.converted_is_valid(folder)
    assert (folder / "model.safetensors").stat().st_size == (real_cache / "model.safetensors").stat().st_size
    rebuilt = target_mod.load_target(str(folder))
    if real_models.target.rows_kernel:  # the same linear path as the loaded target, so bits can be compared
        assert use_rows_kernel(rebuilt.model)
    ids = real_models.target.chat_ids("hi")
    assert torch.equal(teacher_forced_logits(rebuilt, ids), teacher_forced_logits(real_models.target, ids))
