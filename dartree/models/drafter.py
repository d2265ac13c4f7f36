"""The Domino-format drafter: a block-parallel (DFlash-style) backbone plus a GRU correction head.

Checkpoint layout (the public one, so `Huang2020/Qwen3-4B-Domino-b16` loads through this same code):
``config.json`` is a Qwen3-style config with ``block_size``, ``num_target_layers`` and a ``dflash_config``
(``target_layer_ids``, ``mask_token_id``, ``projector_type: "domino"``, ``emb_dim``, ``gru_hidden_dim``,
``pure_draft_prefix_len``, ``shift_label``; see dartree.models.drafter_config); weights are safetensors named
``layers.*``, ``fc``, ``hidden_norm``, ``norm``, ``prefix_gru`` (one layer, no bias) and ``embed_proj.0`` /
``embed_proj.2``.

Backbone: the target's hidden states at ``target_layer_ids`` are concatenated, projected by ``fc`` and
normalised by ``hidden_norm``; every drafter layer turns them into context keys and values. The block
[anchor, MASK, ..., MASK] attends to [context ; block], bidirectionally inside the block, so one pass
gives K hidden rows. Which row drafts which depth is ``dflash_config.shift_label``: absent or false (the
DFlash convention, and the shipped SmolLM2 drafter), row d drafts depth d, so rows 1..K-1 give K-1 depths;
true (the public Domino checkpoints: SpecForge's Domino recipe trains only that), row d-1 drafts depth d,
so the anchor's own row predicts depth 1 and one block drafts K depths. `DrafterConfig.first_draft_row`
is the one place that says it. The drafter has no embedding or LM head of its own: it uses the target's.

Draft vocabulary (optional, ``dflash_config.draft_vocab_size`` plus a ``draft_vocab`` id tensor): the drafter
proposes tokens from a fixed subset of the target's vocabulary only (EAGLE-3's "draft vocab"). Its base
logits are the target's LM head restricted to those rows, and ``embed_proj.2`` has one row per draft token.
A small model's responses use few distinct tokens (SmolLM2: the 16,384 most frequent cover 99.7% of the
training responses), so drafting and training skip most of a 49k-wide head. It stays lossless: the
target verifies every token. Checkpoints without it (the public Domino ones) draft over the full vocabulary.

Correction head: a GRU runs over the target embeddings of the tokens chosen along a path (the anchor
first). The logits at block position i are ``base_i + embed_proj.2(SiLU(embed_proj.0([z_i ; s_i])))``
where z_i is depth i's block row and s_i the GRU state after the anchor and the path's tokens at depths
1..i-1. Depths ``i <= pure_draft_prefix_len`` use the base logits only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
# the config lives in its own file; these names stay importable from here, where callers have always found them
from .drafter_config import DrafterConfig, build_target_layer_ids, make_config  # noqa: F401

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some exporters save; recomputed here


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalise in fp32, round to the input dtype, then scale.

    Not `torch.nn.RMSNorm`: on the shipped drafter's block pass that one is bitwise equal in fp32 but not in
    bf16 (block hidden states differ by up to 0.09), because it scales before rounding. The public
    checkpoints were trained with this order (transformers' Qwen3RMSNorm), so the GPU's bf16 path keeps it.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables [..., n, head_dim] for integer positions (Llama/Qwen 'default' RoPE)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, n, d]; cos/sin [b, n, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DrafterAttention(nn.Module):
    """Queries from the block; keys/values from [context ; block]; no causal mask inside the block."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated keys and values [b, kv_heads, n, d] of rows x [b, n, h]."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, -1, self.cfg.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, -1, self.cfg.head_dim).transpose(1, 2)
        return apply_rotary(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, attn_mask):
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, -1, self.cfg.head_dim)).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k_blk, v_blk = self.keys_values(x, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=2)
        v = torch.cat([ctx_v, v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DrafterMLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = DrafterAttention(cfg)
        self.mlp = DrafterMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, attn_mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DominoDrafter(nn.Module):
    """Block-parallel drafter with an optional Domino GRU correction head (see the module docstring)."""

    def __init__(self, config: dict | DrafterConfig):
        super().__init__()
        cfg = config if isinstance(config, DrafterConfig) else DrafterConfig.from_dict(config)
        self.cfg = cfg
        h = cfg.hidden_size
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        if cfg.has_correction:
            self.prefix_gru = nn.GRU(input_size=h, hidden_size=cfg.gru_hidden_dim, num_layers=1,
                                     batch_first=True, bias=False)
            self.embed_proj = nn.Sequential(
                nn.Linear(h + cfg.gru_hidden_dim, cfg.emb_dim, bias=False),
                nn.SiLU(),
                nn.Linear(cfg.emb_dim, cfg.output_size, bias=False),
            )
        if cfg.draft_vocab_size:
            if not 0 < cfg.draft_vocab_size <= cfg.vocab_size:
                raise UserError(f"drafter draft_vocab_size {cfg.draft_vocab_size} must be in 1..{cfg.vocab_size}")
            # Token ids of the draft vocabulary, ascending; set from data by the trainer, saved with the weights.
            self.register_buffer("draft_vocab", torch.arange(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab = None
        self._head_cache = None  # (key, nn.Linear): the target's LM-head rows of the draft vocabulary
        self.reset_parameters()

    # ---------------------------------------------------------------- construction and checkpoints
    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) linears and unit norms, like a fresh HF model; reproducible under a seed."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, nn.GRU):
                for p in module.parameters():
                    nn.init.uniform_(p, -1 / math.sqrt(module.hidden_size), 1 / math.sqrt(module.hidden_size))

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def max_depth(self) -> int:
        """Number of depths one block drafts (`DrafterConfig.max_depth`)."""
        return self.cfg.max_depth

    def draft_rows(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        """The block rows [..., depth, h] that draft depths 1..depth, of block hidden states [..., K, h]."""
        first = self.cfg.first_draft_row
        return hidden[..., first:first + depth, :]

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype = torch.bfloat16, extra_config: dict | None = None):
        """Write config.json and model.safetensors in the public layout (16-bit by default)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        raw = dict(self.cfg.raw)
        raw["torch_dtype"] = str(dtype).replace("torch.", "")
        if extra_config:
            raw.update(extra_config)
        state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        (folder / CONFIG_NAME).write_text(json.dumps(raw, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> "DominoDrafter":
        """Load a checkpoint folder (or a hub id, where a hub is reachable). Never falls back to random weights."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(name_or_path).expanduser()
        if not folder.exists():
            text = str(name_or_path)
            if text.count("/") != 1 or text.startswith(("/", ".", "~")):
                raise UserError(f"drafter checkpoint {name_or_path} does not exist")
            try:
                from huggingface_hub import snapshot_download
                folder = Path(snapshot_download(str(name_or_path), allow_patterns=["*.json", "*.safetensors"]))
            except Exception as exc:  # hub unreachable, unknown repo, ...
                raise UserError(f"could not fetch drafter {name_or_path!r}: {exc}") from exc
        config_path = folder / CONFIG_NAME
        if not config_path.is_file():
            raise UserError(f"drafter folder {folder} has no {CONFIG_NAME}")
        try:
            raw = json.loads(config_path.read_text())
        except ValueError as exc:
            raise UserError(f"drafter {config_path} is not valid JSON: {exc}") from exc
        model = cls(raw)
        shards = sorted(folder.glob("*.safetensors"))
        if not shards:
            raise UserError(f"drafter folder {folder} has no safetensors weights")
        # Shards are merged and exporters' recomputable buffers dropped first, so safetensors' own
        # `load_model(strict=True)` (one file, every key) does not fit; torch's strict load_state_dict then
        # checks missing, unexpected and mis-shaped keys at once and copies the 16-bit weights into fp32.
        state = {}
        try:
            for shard in shards:
                state.update({k: v for k, v in load_file(str(shard)).items() if not k.endswith(IGNORED_SUFFIXES)})
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise UserError(f"drafter weights in {folder} are unreadable (corrupt file?): {exc}") from exc
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            problems = "; ".join(line.strip() for line in str(exc).splitlines()[1:] if line.strip())
            raise UserError(f"drafter weights in {folder} do not match its config: {problems[:400]}") from None
        model.check_draft_vocab()
        return model.to(device=device, dtype=dtype).keep_gru_fp32().eval()

    def check_matches(self, target) -> None:
        """Refuse a drafter built for another target: wrong sizes would silently give garbage drafts."""
        cfg = self.cfg
        problems = []
        if cfg.hidden_size != target.hidden_size:
            problems.append(f"hidden size {cfg.hidden_size} vs target {target.hidden_size}")
        if cfg.vocab_size != target.vocab_size:
            problems.append(f"vocabulary {cfg.vocab_size} vs target {target.vocab_size}")
        if max(cfg.target_layer_ids) >= target.num_layers:
            problems.append(f"layer ids {list(cfg.target_layer_ids)} vs {target.num_layers} target layers")
        if not 0 <= cfg.mask_token_id < target.vocab_size:
            problems.append(f"mask token id {cfg.mask_token_id} outside the vocabulary")
        if problems:
            raise UserError("the drafter does not fit this target: " + "; ".join(problems))

    # ---------------------------------------------------------------- draft vocabulary
    def set_draft_vocab(self, token_ids) -> None:
        """Fill the draft vocabulary (distinct token ids; stored ascending)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()  # sorted
        if self.draft_vocab is None or ids.numel() != self.draft_vocab.numel():
            raise ValueError(f"need exactly {self.cfg.draft_vocab_size} distinct token ids, got {ids.numel()}")
        self.draft_vocab.copy_(ids.to(self.draft_vocab.device))
        self.check_draft_vocab()
        self._head_cache = None

    @torch.no_grad()
    def remap_draft_vocab(self, token_ids) -> int:
        """Switch a trained drafter to another draft vocabulary of the same size, keeping what it learnt.

        Only ``embed_proj.2`` has a row per draft token (the base logits are the target's head rows, looked
        up by id): a token in both vocabularies keeps its row, a new token gets a zero row (no correction: its
        logit is the target head's). Returns how many tokens are new.
        """
        old = self.draft_vocab.clone()
        self.set_draft_vocab(token_ids)
        out = self.embed_proj[2].weight  # (draft vocab, emb_dim)
        cols = torch.searchsorted(old, self.draft_vocab).clamp(max=old.numel() - 1)
        kept = old[cols] == self.draft_vocab
        out.copy_(torch.where(kept[:, None], out[cols], torch.zeros_like(out)))
        return int((~kept).sum())

    def check_draft_vocab(self) -> None:
        if self.draft_vocab is None:
            return
        v = self.draft_vocab
        if v.numel() and (int(v.min()) < 0 or int(v.max()) >= self.cfg.vocab_size or bool((v[1:] <= v[:-1]).any())):
            raise UserError("the drafter's draft_vocab must be ascending distinct token ids inside the vocabulary")

    def to_draft_columns(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Column of each token id in the drafter's logits; -1 where the draft vocabulary lacks it."""
        if self.draft_vocab is None:
            return token_ids
        pos = torch.searchsorted(self.draft_vocab, token_ids.clamp(min=0))
        pos = pos.clamp(max=self.draft_vocab.numel() - 1)
        return torch.where(self.draft_vocab[pos] == token_ids, pos, torch.full_like(pos, -1))

    def column_tokens(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of logit columns (the inverse of `to_draft_columns`)."""
        return columns if self.draft_vocab is None else self.draft_vocab[columns]

    def base_logits(self, z: torch.Tensor, target) -> torch.Tensor:
        """Base logits over the drafter's columns: the target's frozen LM head, restricted to the draft
        vocabulary when there is one (a row slice copied once per target, so the CPU kernel or MKL packing
        applies). In training (autocast) the result keeps autocast's dtype; callers cast to fp32 for losses."""
        if self.draft_vocab is None:
            return target.lm_head(z)
        head = self._draft_head(target)
        if torch.is_autocast_enabled(z.device.type):
            return head(z)
        return head(z.to(head.weight.dtype)).float()

    def _draft_head(self, target) -> nn.Linear:
        full = target.model.get_output_embeddings().weight
        key = (full.data_ptr(), full._version, full.dtype, full.device, self.draft_vocab.data_ptr(),
               self.draft_vocab._version)
        if self._head_cache is None or self._head_cache[0] != key:
            # Built outside inference mode even when first needed inside it (decoding runs under
            # torch.inference_mode): an inference tensor has no version counter for the pack cache's key.
            with torch.inference_mode(False), torch.no_grad():
                head = nn.Linear(full.shape[1], self.draft_vocab.numel(), bias=False, device=full.device,
                                 dtype=full.dtype)
                head.weight.copy_(full.detach()[self.draft_vocab.to(full.device)])
            head.weight.requires_grad_(False)
            from .rows_kernel import route_like_target
            route_like_target(head, target, head_rows=self.draft_vocab)  # the head's own blocks, if any
            # a plain attribute, not a submodule: it is derived from the target, never saved or trained
            object.__setattr__(self, "_head_cache", (key, head))
        return self._head_cache[1]

    # ---------------------------------------------------------------- backbone
    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target hidden states [..., L*h] -> the drafter's context rows [..., h]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor):
        """Per-layer context keys/values [b, kv_heads, n, d] for target features [b, n, L*h] at positions [b, n].

        They depend only on the committed context, so the decoder computes them once per committed
        token and keeps them, instead of re-projecting the whole prefix every round.
        """
        ctx = self.project_features(features)
        cos, sin = rotary(positions, self.cfg.head_dim, self.cfg.rope_theta, ctx.dtype)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def block_hidden(self, block_embeds: torch.Tensor, block_positions: torch.Tensor, ctx_kv, attn_mask=None):
        """Final-normed hidden states [b, K, h] of a block whose rows attend to their context and each other.

        `attn_mask` (bool or additive, [b, 1, K, n_ctx + K]) is needed only in training, where many
        blocks of one sequence share a context; at inference every block row sees everything.
        """
        cos, sin = rotary(block_positions, self.cfg.head_dim, self.cfg.rope_theta, block_embeds.dtype)
        x = block_embeds
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ck, cv, attn_mask)
        return self.norm(x)

    # ---------------------------------------------------------------- correction head
    @property
    def gru_dtype(self) -> torch.dtype:
        """The GRU runs in fp32 even in a bf16 model: it is tiny, and half-precision RNN kernels vary by device."""
        return self.prefix_gru.weight_hh_l0.dtype if self.cfg.has_correction else torch.float32

    def keep_gru_fp32(self) -> "DominoDrafter":
        if self.cfg.has_correction:
            self.prefix_gru.float()
        return self

    def initial_state(self, n: int, device) -> torch.Tensor:
        return torch.zeros(n, max(self.cfg.gru_hidden_dim, 1), device=device, dtype=self.gru_dtype)

    def gru_step(self, token_embeds: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Advance the path states [n, g] by one chosen token each (embeds [n, h]); identity without a head."""
        if not self.cfg.has_correction:
            return state
        x = token_embeds.to(self.gru_dtype)[:, None, :]
        _, h = self.prefix_gru(x, state.to(self.gru_dtype)[None].contiguous())
        return h[0]

    def gru_scan(self, token_embeds: torch.Tensor) -> torch.Tensor:
        """States after each prefix of a whole path at once (training): embeds [b, n, h] -> [b, n, g]."""
        out, _ = self.prefix_gru(token_embeds.to(self.gru_dtype))
        return out

    def correction(self, z: torch.Tensor, state: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Logit residual embed_proj(SiLU-MLP([z ; s])); only the `columns` (candidate columns) when given.

        Columns index the drafter's logits: token ids, or draft-vocabulary positions when it has one.

        z and state broadcast against each other on leading dims. Restricting to the top-C candidate
        columns turns a [n, emb] x [emb, vocab] product into [n, emb] x [emb, C].
        """
        lead = torch.broadcast_shapes(z.shape[:-1], state.shape[:-1])
        dtype = self.embed_proj[0].weight.dtype
        joined = torch.cat([z.to(dtype).expand(*lead, z.shape[-1]), state.to(dtype).expand(*lead, state.shape[-1])], dim=-1)
        hidden = F.silu(self.embed_proj[0](joined))
        weight = self.embed_proj[2].weight
        if columns is None:
            return hidden @ weight.T
        return hidden @ weight[columns].T
