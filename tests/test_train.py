"""Training recipe tests on tiny random models (seconds, no real target)."""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest
import torch

from dartree.errors import UserError
from dartree.models.drafter import DominoDrafter, make_config
from dartree.models.target import Target
from dartree.shards import read_tokens
from dartree.train import datagen, stream
from dartree.train.batch import build_batch, drafter_logits
from dartree.train.card import (KEPT_CARD_SECTIONS, git_commit, history_section, read_card_sections,
                                 replace_card_section, write_card)
from dartree.train.cli import _also_data, _drafter_spec, _train_config, add_train_arguments, main as train_main
from dartree.train.evaluate import evaluate_chain
from dartree.train.presets import get_preset
from dartree.train.trainer import (AnchorSampler, SeqStore, TrainConfig, draft_vocab_from_data, init_from_target, load_checkpoint,
                                   load_window, save_checkpoint, split_heldout, train)

VOCAB = 64
EOS = (5, 17, 40)  # several stop ids, so rows finish at different steps and the batch gets compacted
LAYERS = (0, 1)


def tiny_target(seed: int = 0, std: float = 0.2) -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                         initializer_range=std, tie_word_embeddings=True, eos_token_id=EOS[0], bos_token_id=0,
                         pad_token_id=0, rope_theta=10000.0)
    model = LlamaForCausalLM(config).eval()
    return Target(model=model, tokenizer=None, name="tiny", device=torch.device("cpu"), dtype=torch.float32,
                  eos_token_ids=EOS)


def tiny_drafter(seed: int = 1, block_size: int = 4, draft_vocab_size: int = 0) -> DominoDrafter:
    torch.manual_seed(seed)
    cfg = make_config(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                      vocab_size=VOCAB, num_target_layers=2, target_layer_ids=list(LAYERS), mask_token_id=1,
                      num_layers=2, block_size=block_size, emb_dim=16, gru_hidden_dim=24, rope_theta=10000.0,
                      draft_vocab_size=draft_vocab_size)
    return DominoDrafter(cfg)


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, VOCAB, size=int(rng.integers(3, 14))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def generated(target):
    return stream.generate_batch(target, random_prompts(24), 24, LAYERS)


def store_of(gen) -> SeqStore:
    store = SeqStore()
    for i, g in enumerate(gen):
        store.add(g.ids, g.prompt_len, g.features, prompt_index=i)
    return store


# ---------------------------------------------------------------------------------------------- data
def test_batched_generation_equals_unbatched_and_is_deterministic(target, generated):
    prompts = random_prompts(24)
    again = stream.generate_batch(target, prompts, 24, LAYERS)
    assert [g.ids for g in again] == [g.ids for g in generated]
    # continuous batching: 5 slots refilled as rows finish
    streamed = stream.generate_batch(target, prompts, 24, LAYERS, batch_size=5)
    assert [g.ids for g in streamed] == [g.ids for g in generated]
    for g, s in zip(generated, streamed):
        np.testing.assert_allclose(s.features.astype(np.float32), g.features.astype(np.float32), rtol=1e-2, atol=1e-2)
    lengths = {len(g.ids) - g.prompt_len for g in generated}
    assert len(lengths) > 2, "rows should finish at different steps (exercises batch compaction)"
    for p, g in zip(prompts, generated):
        single = stream.generate_batch(target, [p], 24, LAYERS)[0]
        assert single.ids == g.ids
        assert g.ids[:len(p)] == p and g.prompt_len == len(p)
        assert g.features.shape == (len(g.ids) - 1, 2 * 32)
        np.testing.assert_allclose(single.features.astype(np.float32), g.features.astype(np.float32),
                                   rtol=1e-2, atol=1e-2)
        resp = g.ids[len(p):]
        assert all(t not in EOS for t in resp[:-1])
        assert resp[-1] in EOS or len(resp) == 24


def test_saved_features_equal_teacher_forced_recompute(target, generated):
    recomputed = stream.recompute_features(target, [g.ids for g in generated], LAYERS, batch_size=5)
    for g, r in zip(generated, recomputed):
        assert r.shape == g.features.shape
        np.testing.assert_allclose(r.astype(np.float32), g.features.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_shards_are_resumable_and_deterministic(target, tmp_path):
    prompts = random_prompts(10, seed=3)
    prompts[4] = None  # a skipped (empty) prompt
    kw = dict(batch_size=3, max_new_tokens=12, feature_layers=LAYERS, progress=False, log=lambda *a: None)
    tok, feat = tmp_path / "tok", tmp_path / "feat"
    stats = datagen.generate_shards(target, datagen.PromptList(prompts, 4), tok_dir=tok, feat_dir=feat, **kw)
    assert stats["shards"] == 3 and stats["sequences"] == 9
    first = {k: read_tokens(datagen.tokens_path(tok, k)) for k in range(3)}
    assert first[1]["prompt_index"].tolist() == [5, 6, 7]
    datagen.tokens_path(tok, 1).unlink()
    stats = datagen.generate_shards(target, datagen.PromptList(prompts, 4), tok_dir=tok, feat_dir=feat, **kw)
    assert stats["shards"] == 1  # the others were skipped
    again = read_tokens(datagen.tokens_path(tok, 1))
    for key in first[1]:
        assert np.array_equal(first[1][key], again[key])
    # features-only pass fills a deleted features shard with the same values
    saved = np.load(datagen.features_path(feat, 2))
    datagen.features_path(feat, 2).unlink()
    assert datagen.fill_missing_features(target, tok, feat, LAYERS, progress=False, max_shards=2) == 0  # 0-1 only
    assert datagen.fill_missing_features(target, tok, feat, LAYERS, progress=False, first_shard=3) == 0  # none past 2
    assert datagen.fill_missing_features(target, tok, feat, LAYERS, progress=False, log=lambda *a: None) == 1
    np.testing.assert_allclose(np.load(datagen.features_path(feat, 2)).astype(np.float32), saved.astype(np.float32),
                               rtol=1e-2, atol=1e-2)
    store = SeqStore.from_shards(tok, feat)
    assert len(store) == 9 and store.ids(0).tolist() == first[0]["ids"][:first[0]["offsets"][1]].tolist()
    assert len(SeqStore.from_shards(tok, feat, max_shards=2)) == 7  # shards 0 and 1: a recorded run's data only
    assert datagen.list_shards(tok, 1) == [1, 2] and datagen.list_shards(tok, 1, 2) == [1]
    # a training window of later shards (--first-shard) still holds out shard 0's first sequences, and only those
    n0 = len(SeqStore.from_shards(tok, feat, max_shards=1))
    whole, train_all, held_all = load_window(tok, feat, 2)
    later, train_later, held_later = load_window(tok, feat, 2, first_shard=1)
    assert len(train_all) + len(held_all) == 9 and len(held_later) == 2 and len(train_later) == 9 - n0
    assert [later.ids(i).tolist() for i in held_later] == [whole.ids(i).tolist() for i in held_all]
    assert sorted(train_later) == list(range(9 - n0))  # the window's own; shard 0 is appended after it
    with pytest.raises(UserError, match="no training data"):
        load_window(tok, feat, 2, first_shard=3)
    # another data stage's shards append after the store's own (--also-data): indices, ids and features
    added = store.add_shards(tok, feat, max_shards=1)
    assert added == range(9, 13) and store.ids(9).tolist() == store.ids(0).tolist()
    assert torch.equal(store.features(12), store.features(3))
    assert not list(tok.glob("*.tmp*")) and not list(feat.glob("*.tmp*"))


def test_truncate_prompt_keeps_both_ends():
    ids = list(range(20))
    assert datagen.truncate_prompt(ids, 8) == [0, 1, 2, 3, 16, 17, 18, 19]
    assert datagen.truncate_prompt(ids, 30) == ids


# ---------------------------------------------------------------------------------------------- training
def test_batched_blocks_match_one_block_at_a_time(target, generated):
    """Stacked blocks + mask give the same logits as each block alone with only its own context."""
    store = store_of(generated)
    drafter = tiny_drafter().eval()
    seqs = [i for i in range(len(store)) if len(store.anchors(i)) >= 3][:2]
    anchors = [store.anchors(i)[[0, 1, len(store.anchors(i)) - 1]] for i in seqs]
    batch = build_batch(store, seqs, anchors, drafter.block_size, drafter.cfg.mask_token_id)
    with torch.no_grad():
        base, corr = drafter_logits(target, drafter, batch)
        for r, (i, anc) in enumerate(zip(seqs, anchors)):
            x = torch.from_numpy(store.ids(i))
            feats = store.features(i)
            for j, p in enumerate(anc.tolist()):
                K = drafter.block_size
                ctx = drafter.context_kv(feats[None, :p], torch.arange(p)[None])
                blk = torch.full((1, K), drafter.cfg.mask_token_id)
                blk[0, 0] = x[p]
                z = drafter.block_hidden(target.embed(blk), torch.arange(p, p + K)[None], ctx)[:, 1:]
                b1 = target.lm_head(z)
                m = int(batch.valid[r, j].sum())
                path = x[p:p + K - 1].clone()
                if len(path) < K - 1:
                    path = torch.cat([path, torch.zeros(K - 1 - len(path), dtype=path.dtype)])
                s = drafter.gru_scan(target.embed(path[None]))
                c1 = b1 + drafter.correction(z, s)
                torch.testing.assert_close(base[r, j, :m], b1[0, :m], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(corr[r, j, :m], c1[0, :m], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("draft_vocab_size", [0, 40])
def test_fifty_steps_lower_the_loss(target, generated, draft_vocab_size):
    store = store_of(generated)
    train_ids, held = split_heldout(store, 4)
    drafter = tiny_drafter(draft_vocab_size=draft_vocab_size)
    cfg = TrainConfig(steps=50, lr=3e-3, warmup_steps=5, seqs_per_step=4, anchors_per_seq=8, eval_every=50,
                      ckpt_every=0, log_every=0, heldout_seqs=4, autocast="off")
    hist = train(target, drafter, store, train_ids, held, cfg, log=lambda *a: None)
    first, last = np.mean(hist["loss"][:10]), np.mean(hist["loss"][-10:])
    assert last < 0.8 * first, (first, last)
    assert np.mean(hist["loss_corr"][-10:]) < np.mean(hist["loss_corr"][:10])
    ev = hist["eval"][-1]
    assert len(ev["acc_base"]) == drafter.block_size - 1 and 1.0 <= ev["tau_corr"] <= drafter.block_size
    if draft_vocab_size:  # the run chose its vocabulary from its own training responses, end-of-turn included
        vocab = set(drafter.draft_vocab.tolist())
        assert len(vocab) == draft_vocab_size and set(EOS) <= vocab


def test_draft_vocab_from_data_takes_the_most_frequent_training_tokens():
    store = SeqStore()
    store.add([9, 9, 3, 3, 3, 7, 7, 2], 2, np.zeros((7, 4), np.float16))  # prompt [9, 9] is not counted
    store.add([1, 2, 3, 4], 1, np.zeros((3, 4), np.float16))
    store.add([8, 8, 8, 8, 8], 1, np.zeros((4, 4), np.float16))  # held out: not counted
    # responses of 0 and 1: 3 x4, 7 x2, 2 x2, 4 x1 -> top 3 = {3, 2, 7} (2 before 7 on the tie), + forced 5
    assert draft_vocab_from_data(store, [0, 1], 4, always=[5]).tolist() == [2, 3, 5, 7]
    assert draft_vocab_from_data(store, [0, 1], 2).tolist() == [2, 3]

def test_anchor_sampler_covers_long_positions_and_balances_them():
    store = SeqStore()
    for i in range(40):  # short: prompt 20 tokens, response up to position 199
        store.add(np.zeros(200, np.int64), 20, np.zeros((199, 2), np.float16), i)
    for i in range(10):  # long context: prompt 1500 tokens, response up to position 1699
        store.add(np.zeros(1700, np.int64), 1500, np.zeros((1699, 2), np.float16), 40 + i)
    ids = list(range(50))

    def positions(sampler, steps=400):
        rng = np.random.default_rng(0)
        return np.concatenate([np.concatenate(sampler.sample(rng, 4, 8)[1]) for _ in range(steps)])

    natural, balanced = positions(AnchorSampler(store, ids, 0.0)), positions(AnchorSampler(store, ids, 1.0))
    long_share = 10 * 199 / (10 * 199 + 40 * 179)  # anchors: response positions with a label after them
    assert abs((natural >= 1500).mean() - long_share) < 0.02
    assert abs((balanced >= 1500).mean() - 0.5) < 0.04  # two buckets (<256, 1024-2047), equal shares
    for pos in (natural, balanced):
        assert pos.min() >= 20 and pos.max() <= 1698 and not ((pos >= 199) & (pos < 1500)).any()
    assert balanced.max() >= 1690 and balanced[balanced < 1500].min() <= 22  # both ends of the range are drawn

    # balance 0 is the first preset's sampler, draw for draw (its runs stay reproducible)
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    weights = np.array([len(store.anchors(i)) for i in ids], dtype=np.float64)
    for _ in range(5):
        seqs, anchors = AnchorSampler(store, ids).sample(rng_a, 4, 8)
        pick = rng_b.choice(len(ids), size=4, replace=False, p=weights / weights.sum())
        assert seqs == [ids[j] for j in pick]
        for i, a in zip(seqs, anchors):
            assert np.array_equal(a, np.sort(rng_b.choice(store.anchors(i), size=8, replace=False)))


@pytest.mark.parametrize("draft_vocab_size", [0, 40])
def test_checkpoint_round_trip_is_exact(target, generated, tmp_path, draft_vocab_size):
    store = store_of(generated)
    train_ids, held = split_heldout(store, 0)
    tiny_drafter = functools.partial(globals()["tiny_drafter"], draft_vocab_size=draft_vocab_size)
    cfg = TrainConfig(steps=6, lr=3e-3, warmup_steps=2, seqs_per_step=2, anchors_per_seq=4, eval_every=0,
                      ckpt_every=3, log_every=0)
    quiet = dict(log=lambda *a: None)
    full = train(target, tiny_drafter(), store, train_ids, held, cfg, **quiet)
    ckpt = tmp_path / "run.pt"
    d1 = tiny_drafter()
    # interrupt a run right after its first checkpoint (step 3), then resume it in a fresh drafter
    import dartree.train.trainer as tr

    class Stop(Exception):
        pass

    orig = tr.save_checkpoint

    def save_then_stop(*a, **k):
        orig(*a, **k)
        raise Stop

    tr.save_checkpoint = save_then_stop
    try:
        with pytest.raises(Stop):
            train(target, d1, store, train_ids, held, cfg, ckpt_path=ckpt, **quiet)
    finally:
        tr.save_checkpoint = orig
    d2 = tiny_drafter(seed=99)  # different init: everything must come from the checkpoint
    resumed = train(target, d2, store, train_ids, held, cfg, ckpt_path=ckpt, **quiet)
    assert resumed["loss"] == full["loss"]
    # weights: trainer checkpoint and the public fp32 export are both exact
    d3 = tiny_drafter(seed=5)
    load_checkpoint(ckpt, d3)
    for (k, a), (_, b) in zip(d2.state_dict().items(), d3.state_dict().items()):
        assert torch.equal(a, b), k
    d2.save_pretrained(tmp_path / "export", dtype=torch.float32)
    d4 = DominoDrafter.from_pretrained(tmp_path / "export")
    for (k, a), (_, b) in zip(d2.state_dict().items(), d4.state_dict().items()):
        assert torch.equal(a, b), k
    save_checkpoint(tmp_path / "again.pt", d4, *tr.make_optimizer(d4, cfg), 0, {}, np.random.default_rng(0), cfg)
    assert (tmp_path / "again.pt").is_file()


def test_init_from_target_copies_last_layers(target):
    d = tiny_drafter()
    init_from_target(d, target)
    t_last = target.model.model.layers[-1]
    assert torch.equal(d.layers[-1].self_attn.q_proj.weight, t_last.self_attn.q_proj.weight)
    assert torch.equal(d.layers[-1].mlp.down_proj.weight, t_last.mlp.down_proj.weight)
    assert torch.equal(d.layers[0].self_attn.k_proj.weight, target.model.model.layers[0].self_attn.k_proj.weight)
    assert torch.equal(d.norm.weight, target.model.model.norm.weight)


def test_card_is_written(target, generated, tmp_path):
    store = store_of(generated)
    ev = evaluate_chain(target, tiny_drafter(), store, list(range(4)), anchors_per_seq=4)
    path = write_card(tmp_path, command="python -m dartree train --preset tiny", repo=tmp_path, preset="tiny",
                      preset_config={"a": 1}, data={"sequences": 4}, train_summary={"final_loss": 1.0},
                      eval_results={"chain": ev, "tree_tau": {"tau": 2.5}}, steps=1, wall_seconds=6.0)
    text = path.read_text()
    assert "python -m dartree train --preset tiny" in text and "top-1 corrected" in text and "tree_tau" in text


def test_cli_arguments_reach_the_configs():
    import argparse

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    args = p.parse_args(["--preset", "smollm2-cpu", "--stage", "train", "--steps", "7", "--init", "random",
                         "--autocast", "off", "--drafter-layers", "3", "--gru-hidden", "512", "--anchor-balance", "0.5"])
    preset = get_preset(args.preset)
    cfg = _train_config(preset, args)
    assert (cfg.steps, cfg.init, cfg.autocast, cfg.anchor_balance) == (7, "random", "off", 0.5)
    assert (_drafter_spec(preset, args)["num_layers"], _drafter_spec(preset, args)["gru_hidden_dim"]) == (3, 512)
    assert preset["drafter"]["target_layer_ids"] == [1, 8, 14, 20, 27]
    assert preset["drafter"]["mask_token_id"] == 16 and preset["drafter"]["block_size"] == 8
    assert [_also_data(x) for x in ("smollm2-cpu", "smollm2-cpu:60")] == [("smollm2-cpu", None), ("smollm2-cpu", 60)]
    with pytest.raises(UserError, match="whole number"):
        _also_data("smollm2-cpu:many")


def test_stop_at_ends_early_on_the_full_schedule(target, generated):
    store = store_of(generated)
    train_ids, held = split_heldout(store, 0)
    quiet = dict(log=lambda *a: None)
    cfg = TrainConfig(steps=8, lr=3e-3, warmup_steps=2, seqs_per_step=2, anchors_per_seq=4, eval_every=0,
                      ckpt_every=0, log_every=0)
    full = train(target, tiny_drafter(), store, train_ids, held, cfg, **quiet)
    early = train(target, tiny_drafter(), store, train_ids, held, TrainConfig(**{**cfg.__dict__, "stop_at": 5}), **quiet)
    assert len(early["loss"]) == 5 and early["loss"] == full["loss"][:5]  # same schedule, cut short


def test_resumed_legs_are_recorded_and_rendered_in_the_card(target, generated, tmp_path):
    store = store_of(generated)
    train_ids, held = split_heldout(store, 0)
    quiet = dict(log=lambda *a: None)
    ckpt = tmp_path / "legs.pt"
    cfg = TrainConfig(steps=6, lr=3e-3, warmup_steps=2, seqs_per_step=2, anchors_per_seq=4, eval_every=0,
                      ckpt_every=1, log_every=0, stop_at=2)
    train(target, tiny_drafter(), store, train_ids, held, cfg, ckpt_path=ckpt, phase={"command": "leg one"}, **quiet)
    longer = TrainConfig(**{**cfg.__dict__, "steps": 9, "stop_at": 5})
    history = train(target, tiny_drafter(), store, train_ids, held, longer, ckpt_path=ckpt,
                    phase={"command": "leg two", "schedule_steps": 9, "response_tokens": 1234}, **quiet)
    # a call that runs no step (already at its stop) adds no leg
    history = train(target, tiny_drafter(), store, train_ids, held, longer, ckpt_path=ckpt,
                    phase={"command": "leg three"}, **quiet)
    legs = [(p["command"], p["from_step"], p["to_step"]) for p in history["phases"]]
    assert legs == [("leg one", 0, 2), ("leg two", 2, 5)]
    body = history_section(history)
    assert any("| 0-2 |" in row and "`leg one`" in row for row in body)
    assert any("| 2-5 | 9 |" in row and "1,234" in row for row in body)
    # a leg's commit: a hash cut to 10 characters, git_commit's reason for having none kept whole
    history["phases"][0]["commit"], history["phases"][1]["commit"] = "0123456789abcdef" * 2 + "01234567", \
        git_commit(tmp_path)
    rows = history_section(history)
    assert any("`0123456789`" in row for row in rows)
    assert any("`unknown (not a git checkout, or no commit yet)`" in row for row in rows)
    # a retrain keeps the card's recipe measurements but rewrites the rest
    card = tmp_path / "TRAINING.md"
    card.write_text("# card\n\n## Measured choices\n\n| init | τ |\n\n## Compute budget\n\n| stage | min |\n\n"
                    "## Configuration\n\n{}\n")
    kept = read_card_sections(card, KEPT_CARD_SECTIONS + ("Absent",))
    assert kept == {"Measured choices": ["| init | τ |"], "Compute budget": ["| stage | min |"]}
    card.write_text("# new card\n\n## Configuration\n\n{}\n")
    replace_card_section(card, "Measured choices", kept["Measured choices"])
    assert card.read_text().index("## Measured choices") < card.read_text().index("## Configuration")


def test_the_train_command_exits_0_when_its_stage_succeeds(monkeypatch):
    """`python -m dartree train` returns 0, not the stage's result dict (sys.exit of a dict is exit 1: the
    data-stage loop in scripts/datagen_stages.sh read every finished stage as a failure)."""
    import dartree.train.cli as train_cli
    from dartree.cli import main

    monkeypatch.setattr(train_cli, "run_train", lambda args: {"data": {"shards": 1}})
    assert main(["train", "--preset", "smollm2-cpu-v2", "--stage", "data"]) == 0


def test_a_fine_tuning_leg_keeps_the_drafters_draft_vocabulary(target, generated):
    store = store_of(generated)
    train_ids, held = split_heldout(store, 0)
    cfg = TrainConfig(steps=2, lr=3e-3, warmup_steps=1, seqs_per_step=2, anchors_per_seq=4, eval_every=0,
                      ckpt_every=0, log_every=0)
    shipped = torch.tensor(sorted(set(EOS) | set(range(VOCAB - 14, VOCAB))))  # not what the data would choose
    fresh, tuned = tiny_drafter(draft_vocab_size=len(shipped)), tiny_drafter(draft_vocab_size=len(shipped))
    for d in (fresh, tuned):
        d.set_draft_vocab(shipped)
    train(target, fresh, store, train_ids, held, cfg, log=lambda *a: None)
    train(target, tuned, store, train_ids, held, cfg, log=lambda *a: None, draft_vocab="keep")
    assert not torch.equal(fresh.draft_vocab, shipped)  # a fresh run re-derives it from its data
    assert torch.equal(tuned.draft_vocab, shipped)


def test_a_remapped_draft_vocabulary_keeps_the_rows_of_shared_tokens(target, generated):
    drafter = tiny_drafter(draft_vocab_size=16)
    drafter.set_draft_vocab(list(range(VOCAB - 16, VOCAB)))
    before = {int(t): drafter.embed_proj[2].weight[c].clone() for c, t in enumerate(drafter.draft_vocab)}
    new = sorted(set(range(VOCAB - 8, VOCAB)) | set(range(8)))  # keeps the top 8 ids, adds 8 others
    assert drafter.remap_draft_vocab(new) == 8
    assert drafter.draft_vocab.tolist() == new
    for c, t in enumerate(new):  # brute force, token by token
        want = before[t] if t in before else torch.zeros_like(before[VOCAB - 1])
        assert torch.equal(drafter.embed_proj[2].weight[c], want), t
    # a fine-tuning leg with draft_vocab="remap" ends on its data's vocabulary
    store = store_of(generated)
    train_ids, held = split_heldout(store, 0)
    cfg = TrainConfig(steps=1, lr=3e-3, warmup_steps=1, seqs_per_step=2, anchors_per_seq=4, eval_every=0,
                      ckpt_every=0, log_every=0)
    fresh = tiny_drafter(draft_vocab_size=16)
    train(target, fresh, store, train_ids, held, cfg, log=lambda *a: None)
    train(target, drafter, store, train_ids, held, cfg, log=lambda *a: None, draft_vocab="remap")
    assert torch.equal(drafter.draft_vocab, fresh.draft_vocab)


def test_train_entry_point_reports_user_errors_in_one_line(capsys):
    # `python -m dartree.train` fails like `python -m dartree`: "error: ..." on stderr, exit status 2, no traceback
    assert train_main(["--preset", "no-such-preset", "--stage", "eval"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown preset 'no-such-preset'")
    out = subprocess.run([sys.executable, "-m", "dartree.train", "--preset", "no-such-preset", "--stage", "eval"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "error: unknown preset" in out.stderr and "Traceback" not in out.stderr
