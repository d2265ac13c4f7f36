"""Train the Domino drafter on saved target features (the target stays frozen).

One training example is a *block* (:mod:`.batch`): an anchor position p inside a response, the target's
features of positions < p as context, and the K-1 tokens after p as labels. That is exactly the situation
at decode time, where the anchor is the last token the target committed and only the tokens before it
have features.

Loss (per block position k = 1..K-1, weight w_k = exp(-(k-1)/gamma) because early positions decide how
much of a draft is accepted):
- base logits ``lm_head(z_k)`` (the target's frozen head);
- corrected logits ``base + correction(z_k, s_k)`` with s_k the GRU state teacher-forced on the true
  path (after x_p..x_{p+k-1}), as the decoder computes it along an accepted path.
``loss = w_base(t) * CE(base) + CE(corrected)``: w_base decays 1 -> 0, so the backbone first learns to
draft on its own (the tree's candidates come from the base logits) and the head then takes over.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..models.drafter import DominoDrafter, make_config
from ..models.target import Target
from ..shards import list_shards, read_tokens, tokens_path
from .batch import autocast, build_batch, position_weights, to_draft_labels, weighted_ce
from .datagen import feature_offsets, features_path
from .distributed import DistContext, DrafterLoss
from .evaluate import evaluate_chain, format_eval


# ---------------------------------------------------------------------------------------------- data
class SeqStore:
    """Sequences (token ids, prompt length, fp16 features of all tokens but the last).

    Built from datagen shards (features memory-mapped, so 10+ GB of features cost no RAM) or from
    in-memory lists (tests).
    """

    def __init__(self):
        self._ids: list[np.ndarray] = []
        self._prompt_len: list[int] = []
        self._prompt_index: list[int] = []
        self._feats: list = []  # (array, start, stop) or an array
        self.shards: list[int] = []  # data-stage shards loaded (from_shards), for the run's record

    def add(self, ids, prompt_len: int, features, prompt_index: int = -1) -> None:
        self._ids.append(np.asarray(ids, dtype=np.int64))
        self._prompt_len.append(int(prompt_len))
        self._prompt_index.append(int(prompt_index))
        self._feats.append(features)

    @classmethod
    def from_shards(cls, tok_dir: Path, feat_dir: Path, max_shards: int | None = None) -> "SeqStore":
        """Shards 0, 1, ... of the data stage (the first `max_shards` of them when given: data keeps
        growing across sessions, and a recorded run must still see exactly the data it trained on)."""
        store = cls()
        store.add_shards(tok_dir, feat_dir, max_shards)
        return store

    def add_shards(self, tok_dir: Path, feat_dir: Path, max_shards: int | None = None, first_shard: int = 0) -> range:
        """Appends the sequences of a data stage's shards first_shard, ..., max_shards - 1 (`shards.list_shards`;
        all of them when neither is given); returns their indices."""
        first = len(self)
        for k in list_shards(tok_dir, first_shard, max_shards):
            fpath = features_path(feat_dir, k)
            if not fpath.is_file():
                print(f"[train] shard {k:05d} of {tok_dir.name} has no features (run the data stage with "
                      f"--features-only); skipped")
                continue
            t = read_tokens(tokens_path(tok_dir, k))
            feats = np.load(fpath, mmap_mode="r")
            fo = feature_offsets(t["offsets"])
            if feats.shape[0] != fo[-1]:
                print(f"[train] shard {k:05d} of {tok_dir.name}: features do not match its tokens; skipped")
                continue
            for i in range(len(t["prompt_len"])):
                a, b = t["offsets"][i], t["offsets"][i + 1]
                self.add(t["ids"][a:b], t["prompt_len"][i], (feats, fo[i], fo[i + 1]), t["prompt_index"][i])
            self.shards.append(k)
        return range(first, len(self))

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self, i: int) -> np.ndarray:
        return self._ids[i]

    def prompt_len(self, i: int) -> int:
        return self._prompt_len[i]

    def prompt_index(self, i: int) -> int:
        return self._prompt_index[i]

    def features(self, i: int) -> torch.Tensor:
        f = self._feats[i]
        if isinstance(f, tuple):
            arr, a, b = f
            f = arr[a:b]
        return torch.from_numpy(np.asarray(f, dtype=np.float32))

    def anchors(self, i: int) -> np.ndarray:
        """Valid anchor positions: inside the response (p >= prompt_len) with at least one label."""
        return np.arange(self._prompt_len[i], len(self._ids[i]) - 1)

    def num_tokens(self) -> int:
        return int(sum(len(x) for x in self._ids))

    def num_response_tokens(self) -> int:
        return int(sum(len(x) - p for x, p in zip(self._ids, self._prompt_len)))


def split_heldout(store: SeqStore, n_heldout: int, among: range | None = None) -> tuple[list[int], list[int]]:
    """Held-out = the n sequences of the lowest prompt indices (shard 0): stable while data grows.
    `among`: split only these sequences (the rest of the store is someone else's)."""
    usable = [i for i in (among if among is not None else range(len(store))) if len(store.anchors(i)) > 0]
    usable.sort(key=lambda i: (store.prompt_index(i), i))
    return usable[n_heldout:], usable[:n_heldout]


def load_window(tok_dir: Path, feat_dir: Path, n_heldout: int, max_shards: int | None = None,
                first_shard: int = 0) -> tuple[SeqStore, list[int], list[int]]:
    """The sequences of shards [first_shard, max_shards) and their split into training and held-out.
    The held-out slice is shard 0's whatever the window, so that held-out τ stays comparable between legs that
    walk over later shards; shard 0's other sequences are trained on only when the window starts at 0."""
    store = SeqStore()
    window = store.add_shards(tok_dir, feat_dir, max_shards, first_shard)
    if len(window) == 0:
        raise UserError("no training data with features: run --stage data first (or --features-only)")
    among = window if first_shard == 0 else store.add_shards(tok_dir, feat_dir, 1)
    train_ids, heldout_ids = split_heldout(store, n_heldout, among=among)
    if first_shard > 0:
        train_ids = list(window)
    if n_heldout and not heldout_ids:
        raise UserError(f"no held-out sequences: shard 0 of {Path(tok_dir).name} has no features "
                        "(run the data stage with --features-only --max-prompts 1)")
    return store, train_ids, heldout_ids


def draft_vocab_from_data(store: "SeqStore", seq_ids: list[int], size: int, always=()) -> np.ndarray:
    """The `size` most frequent response tokens of the training sequences (ties: lower id), plus `always`
    (end-of-turn tokens), as ascending ids. Held-out sequences are not counted."""
    counts = np.zeros(int(max(int(store.ids(i).max()) for i in seq_ids)) + 1, dtype=np.int64)
    for i in seq_ids:
        np.add.at(counts, store.ids(i)[store.prompt_len(i):], 1)
    forced = sorted({int(t) for t in always})
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count desc, then id asc
    skip = set(forced)
    picked = [t for t in order.tolist() if t not in skip][: max(0, size - len(forced))]
    return np.array(sorted(set(picked) | set(forced)), dtype=np.int64)


# ---------------------------------------------------------------------------------------------- init
def drafter_from_preset(target: Target, preset_drafter: dict, init: str = "target", seed: int = 0) -> DominoDrafter:
    torch.manual_seed(seed)
    drafter = DominoDrafter(make_config(**preset_drafter))
    if init == "target":
        init_from_target(drafter, target)
    elif init != "random":
        raise ValueError(f"unknown init {init!r}: target or random")
    return drafter


@torch.no_grad()
def init_from_target(drafter: DominoDrafter, target: Target) -> None:
    """Copy the target's last decoder layers (attention, MLP, norms) and final norm into the drafter.

    A warm start that already maps hidden states to next-token space; q_norm/k_norm (absent in Llama)
    stay ones, and fc, hidden_norm and the GRU head start fresh.
    """
    t_layers = target.model.model.layers
    n = len(drafter.layers)
    for d_layer, t_layer in zip(drafter.layers, t_layers[len(t_layers) - n:]):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(d_layer.self_attn, name).weight.copy_(getattr(t_layer.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(d_layer.mlp, name).weight.copy_(getattr(t_layer.mlp, name).weight)
        d_layer.input_layernorm.weight.copy_(t_layer.input_layernorm.weight)
        d_layer.post_attention_layernorm.weight.copy_(t_layer.post_attention_layernorm.weight)
        d_layer.self_attn.q_norm.weight.fill_(1.0)
        d_layer.self_attn.k_norm.weight.fill_(1.0)
    drafter.norm.weight.copy_(target.model.model.norm.weight)


# ---------------------------------------------------------------------------------------------- loop
@dataclass
class TrainConfig:
    steps: int = 3000
    lr: float = 6e-4
    weight_decay: float = 0.01
    warmup_steps: int = 100
    min_lr_frac: float = 0.1
    seqs_per_step: int = 4
    anchors_per_seq: int = 16
    anchor_balance: float = 0.0  # 0: anchors uniform over the data; > 0: long positions drawn more (AnchorSampler)
    gamma: float = 4.0
    base_weight_steps_frac: float = 1.0  # w_base goes 1 -> 0 linearly over this share of the steps
    grad_clip: float = 1.0
    eval_every: int = 250
    ckpt_every: int = 250
    log_every: int = 10
    heldout_seqs: int = 64
    eval_anchors_per_seq: int = 8
    seed: int = 0
    init: str = "target"
    autocast: str = "bf16"  # "bf16": matmuls in bf16 (AMX, ~4x faster here), fp32 weights/optimizer/loss; "off"
    stop_at: int | None = None  # end the run at this step of the `steps`-long schedule (a session's time budget)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / max(1, cfg.warmup_steps)
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return f


def base_weight(cfg: TrainConfig, step: int) -> float:
    span = max(1, int(cfg.base_weight_steps_frac * cfg.steps))
    return max(0.0, 1.0 - step / span)


def make_optimizer(drafter: DominoDrafter, cfg: TrainConfig):
    decay = [p for n, p in drafter.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in drafter.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    return opt, sched


def save_checkpoint(path: Path, drafter, opt, sched, step: int, history: dict, rng: np.random.Generator,
                    cfg: TrainConfig) -> None:
    """Everything needed to continue bit-for-bit: weights, optimizer, schedule, both RNGs, logs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"drafter": drafter.state_dict(), "drafter_config": drafter.cfg.raw, "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "step": step, "history": history,
             "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "config": asdict(cfg)}
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, drafter, opt=None, sched=None, rng: np.random.Generator | None = None) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    drafter.load_state_dict(state["drafter"])
    if opt is not None:
        opt.load_state_dict(state["optimizer"])
    if sched is not None:
        sched.load_state_dict(state["scheduler"])
    if rng is not None:
        rng.bit_generator.state = state["numpy_rng"]
    torch.set_rng_state(state["torch_rng"])
    return state


def position_bucket(positions: np.ndarray) -> np.ndarray:
    """0 for positions below 256, then one bucket per doubling: 256-511 -> 1, 512-1023 -> 2, ..."""
    return np.floor(np.log2(np.maximum(positions, 128) / 128)).astype(np.int64)


class AnchorSampler:
    """Picks a step's sequences and their block anchors (response positions, where the drafter drafts).

    `balance` 0: every anchor of the training set is equally likely (a sequence in proportion to its
    anchors; the first preset's sampler). `balance` b > 0: an anchor in position bucket j weighs
    count_j ** -b, so the rare long positions of long-context data are drawn more often; b = 1 gives every
    bucket the same share. Either way every response position of the data can be drawn, so training
    covers the positions inference drafts at, up to the longest prompt plus its response.
    """

    def __init__(self, store: SeqStore, train_ids: list[int], balance: float = 0.0):
        self.store, self.ids = store, list(train_ids)
        anchors = [store.anchors(i) for i in self.ids]
        if balance:
            buckets = [position_bucket(a) for a in anchors]
            counts = np.bincount(np.concatenate(buckets)).astype(np.float64)
            weight = np.where(counts > 0, np.maximum(counts, 1) ** -balance, 0.0)
            self.anchor_w: list[np.ndarray] | None = [weight[b] for b in buckets]
            seq_w = np.array([w.sum() for w in self.anchor_w])
        else:
            self.anchor_w = None
            seq_w = np.array([len(a) for a in anchors], dtype=np.float64)
        self.seq_p = seq_w / seq_w.sum()

    def sample(self, rng: np.random.Generator, n_seqs: int, n_anchors: int) -> tuple[list[int], list[np.ndarray]]:
        pick = rng.choice(len(self.ids), size=n_seqs, replace=len(self.ids) < n_seqs, p=self.seq_p)
        anchors = []
        for j in pick:
            a = self.store.anchors(self.ids[j])
            p = None if self.anchor_w is None else self.anchor_w[j] / self.anchor_w[j].sum()
            anchors.append(np.sort(rng.choice(a, size=min(n_anchors, len(a)), replace=False, p=p)))
        return [self.ids[j] for j in pick], anchors


def train(target: Target, drafter: DominoDrafter, store: SeqStore, train_ids: list[int], heldout_ids: list[int],
          cfg: TrainConfig, ckpt_path: Path | None = None, log=print, progress: bool = False, dist=None,
          phase: dict | None = None, draft_vocab: str = "data") -> dict:
    """The training loop; resumes from `ckpt_path` when it exists. Returns the history of losses/evals.

    `phase` (the command, schedule and data of this invocation) is appended to history["phases"] with
    the steps it ran: a run resumed across sessions, on growing data, keeps the record of every leg,
    so that its card can say exactly how to reproduce it. `draft_vocab` says where a fresh run's draft
    vocabulary comes from: "data" (its training data's most frequent response tokens), "keep" (a drafter
    fine-tuned from a shipped one keeps its columns) or "remap" (a fine-tuned drafter moves to its new
    data's vocabulary, keeping the learnt rows of the tokens both share; `DominoDrafter.remap_draft_vocab`).

    `dist` (a DistContext) runs it data-parallel: rank r samples with seed + r, DDP averages the
    gradients, and only rank 0 logs, evaluates and checkpoints.
    """
    dist = dist or DistContext()
    for p in target.model.parameters():
        p.requires_grad_(False)
    drafter.train()
    model = dist.wrap(DrafterLoss(drafter, target))
    device = next(drafter.parameters()).device
    opt, sched = make_optimizer(drafter, cfg)
    rng = np.random.default_rng(cfg.seed + dist.rank)
    if not dist.is_main:
        log = lambda *a, **k: None  # noqa: E731
    torch.manual_seed(cfg.seed)
    history: dict = {"loss": [], "loss_base": [], "loss_corr": [], "eval": [], "seconds": 0.0}
    step = 0
    if ckpt_path is not None and Path(ckpt_path).is_file():
        state = load_checkpoint(ckpt_path, drafter, opt, sched, rng)
        step, history = state["step"], state["history"]
        if dist.distributed:  # the checkpoint holds rank 0's sampler; the others continue their own stream
            rng = np.random.default_rng([cfg.seed + dist.rank, step])
        log(f"[train] resumed from {ckpt_path} at step {step}")
    elif drafter.draft_vocab is not None:  # a fresh run: its draft vocabulary comes from its training data
        if draft_vocab not in ("data", "keep", "remap"):
            raise ValueError(f"draft_vocab must be data, keep or remap, not {draft_vocab!r}")
        if draft_vocab != "keep":
            ids = draft_vocab_from_data(store, train_ids, drafter.cfg.draft_vocab_size, always=target.eos_token_ids)
            if draft_vocab == "remap":
                log(f"[train] draft vocabulary remapped: {drafter.remap_draft_vocab(ids)} new tokens")
            else:
                drafter.set_draft_vocab(ids)
        covered = np.isin(np.concatenate([store.ids(i)[store.prompt_len(i):] for i in heldout_ids]),
                          drafter.draft_vocab.cpu().numpy()).mean() if heldout_ids else float("nan")
        log(f"[train] draft vocabulary: {drafter.cfg.draft_vocab_size} tokens, "
            f"covering {covered:.2%} of held-out response tokens")
    if phase is not None and step < min(cfg.steps, cfg.stop_at or cfg.steps):
        history.setdefault("phases", []).append({**phase, "from_step": step, "to_step": step})
    K = drafter.block_size
    weights = position_weights(K, cfg.gamma).to(device)
    sampler = AnchorSampler(store, train_ids, cfg.anchor_balance)
    t0 = time.time() - history["seconds"]
    window: list[tuple[float, float, float]] = []
    end = min(cfg.steps, cfg.stop_at or cfg.steps)
    while step < end:
        seqs, anchors = sampler.sample(rng, cfg.seqs_per_step, cfg.anchors_per_seq)
        batch = to_draft_labels(drafter, build_batch(store, seqs, anchors, K, drafter.cfg.mask_token_id).to(device))
        with autocast(cfg.autocast, device.type):
            base, corrected = model(batch)
        base = base.float()
        corrected = corrected.float() if corrected is not None else None
        ce_base = weighted_ce(base, batch, weights)
        wb = base_weight(cfg, step)
        if corrected is not None:
            ce_corr = weighted_ce(corrected, batch, weights)
            loss = wb * ce_base + ce_corr
        else:
            ce_corr = ce_base
            loss = ce_base
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        step += 1
        history["loss"].append(float(loss.detach()))
        history["loss_base"].append(float(ce_base.detach()))
        history["loss_corr"].append(float(ce_corr.detach()))
        window.append(tuple(history[k][-1] for k in ("loss", "loss_base", "loss_corr")))
        if cfg.log_every and step % cfg.log_every == 0:
            m = np.mean(window, axis=0)
            window = []
            el = time.time() - t0
            log(f"[train] step {step}/{cfg.steps} loss {m[0]:.3f} ce_base {m[1]:.3f} ce_corr {m[2]:.3f} "
                f"w_base {wb:.2f} lr {sched.get_last_lr()[0]:.2e} {el / step:.2f}s/step")
        last = step == end
        if dist.is_main and heldout_ids and cfg.eval_every and (step % cfg.eval_every == 0 or last):
            ev = evaluate_chain(target, drafter, store, heldout_ids, anchors_per_seq=cfg.eval_anchors_per_seq,
                                autocast_mode=cfg.autocast)
            ev["step"] = step
            history["eval"].append(ev)
            log(f"[eval] step {step}: " + format_eval(ev))
            drafter.train()
        history["seconds"] = time.time() - t0
        if phase is not None:
            history["phases"][-1]["to_step"] = step
        if dist.is_main and ckpt_path is not None and cfg.ckpt_every and (step % cfg.ckpt_every == 0 or last):
            save_checkpoint(ckpt_path, drafter, opt, sched, step, history, rng, cfg)
    drafter.eval()
    return history


def summarize(history: dict, last: int = 50) -> dict:
    out = {}
    for key in ("loss", "loss_base", "loss_corr"):
        vals = history.get(key) or []
        if vals:
            out[f"first_{key}"] = float(np.mean(vals[:last]))
            out[f"final_{key}"] = float(np.mean(vals[-last:]))
    return out


def export(drafter: DominoDrafter, folder: Path, dtype=torch.bfloat16, record: dict | None = None) -> int:
    """The shipped checkpoint (public Domino layout, 16-bit); returns its size in bytes.

    `record` lands in config.json as ``dartree_training`` (preset, steps, tokens, command), which is
    what the app and the CLI show next to every number measured with this drafter.
    """
    drafter.save_pretrained(folder, dtype=dtype, extra_config={"dartree_training": record} if record else None)
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def write_json(path: Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
