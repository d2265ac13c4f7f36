"""How a round's cost grows with the context: `python -m dartree bench --context-curve`.

For each context length L (128, 512, 1,024 and 2,048 tokens of a long document by default) it measures,
on the same prefilled context:
- t_AR and t_round: the median seconds of a real plain-decoding step and of a real round of the default
  tree shape (dartree at the device's W and B), each decoded by the Decoder from that context, with the
  round's per-stage split; their ratio is what the speedup divides τ by;
- t_verify(N) for a few tree sizes N (bench.verify_seconds: one target forward over N nodes);
- t_draft: one drafter pass (draft_block at the default C);
- the prefill of each (target alone for plain decoding; target + the drafter's context for the tree),
  so the prefill's overhead can be read per length.
A context cost that does not grow keeps t_round / t_AR flat from 128 to 2,048 tokens.
"""

from __future__ import annotations

import datetime
import statistics

import torch

from .bench import machine_info, median_seconds, verify_seconds
from .cache import new_cache
from .defaults import default_shape
from .draft import DrafterContext, draft_block
from .engine import DecodeSettings, Decoder
from .errors import UserError
from .trace import STAGE_KEYS

CONTEXTS = (128, 512, 1024, 2048)
VERIFY_SIZES = (1, 5, 9, 17, 33)


def context_ids(target, documents: list[str], length: int) -> list[int]:
    """A chat prompt of `length` tokens: the documents' text, cut so that the templated prompt fits exactly."""
    overhead = len(target.chat_ids("x")) - len(target.tokenizer("x")["input_ids"])
    body = target.tokenizer("\n\n".join(documents))["input_ids"]
    if len(body) < length:
        raise UserError(f"the prompt file holds {len(body)} tokens of text; a context of {length} needs more")
    cut = max(length - overhead, 1)
    ids = target.chat_ids(target.tokenizer.decode(body[:cut]))
    while len(ids) > length and cut > 1:  # re-tokenising may merge or split a few tokens at the cut
        cut -= 1
        ids = target.chat_ids(target.tokenizer.decode(body[:cut]))
    return ids


def _round_costs(target, drafter, ids: list[int], settings: DecodeSettings, rounds: int) -> dict:
    """Median seconds of a round (all stages) over `rounds` rounds decoded from `ids` (the first is a warm-up),
    its per-stage medians, the prefill's seconds and τ."""
    dec = Decoder(target, drafter, ids, settings)
    dec.prefill()
    while dec.next_stage != "done" and len(dec.rounds) < rounds + 1:
        dec.step()
    measured = dec.rounds[1:] or dec.rounds
    return {"round_seconds": statistics.median(sum(r.seconds.values()) for r in measured),
            "stage_seconds": {k: statistics.median(r.seconds[k] for r in measured) for k in STAGE_KEYS},
            "prefill_seconds": dec.prefill_seconds, "rounds": len(measured),
            "tau": sum(r.committed for r in measured) / len(measured)}


@torch.inference_mode()
def context_curve(models, documents: list[str], contexts=CONTEXTS, sizes=VERIFY_SIZES, repeats: int = 7,
                  rounds: int = 30) -> dict:
    """The per-context cost table (see the module docstring); returns the dict written as JSON."""
    target, drafter = models.target, models.drafter
    if drafter is None:
        raise UserError("the context curve needs a drafter (it times the default tree round)")
    shape = default_shape(target.device.type)
    tree_settings = DecodeSettings(method="dartree", max_new_tokens=8 * (rounds + 1))
    ar_settings = DecodeSettings(method="ar", max_new_tokens=rounds + 2)
    layers = tuple(drafter.cfg.target_layer_ids)
    rows = []
    for length in contexts:
        ids = context_ids(target, documents, length)
        _round_costs(target, drafter, ids, ar_settings, 1)  # warm-up: first calls at a new length allocate
        ar = _round_costs(target, drafter, ids, ar_settings, rounds)
        tree = _round_costs(target, drafter, ids, tree_settings, rounds)
        cache = new_cache(target, len(ids) + max(sizes) + 1)
        out = target.prefill(ids, cache, layers)
        verify = verify_seconds(target, cache, len(ids), sizes, drafter.max_depth, repeats, layers)
        context = DrafterContext.from_prefill(drafter, out.features)
        anchor = out.logits[0].argmax()
        draft = median_seconds(lambda: draft_block(drafter, target, context, anchor, len(ids), drafter.max_depth,
                                                   shape["candidates"]), target.device, repeats)
        t_ar = ar["round_seconds"]
        rows.append({
            "context_tokens": len(ids), "t_ar": t_ar, "t_round": tree["round_seconds"],
            "round_over_ar": tree["round_seconds"] / t_ar, "round_stage_seconds": tree["stage_seconds"],
            "tau": tree["tau"], "verify_seconds": verify,
            "verify_over_ar": {n: v / t_ar for n, v in verify.items()}, "draft_seconds": draft,
            "prefill_seconds_ar": ar["prefill_seconds"], "prefill_seconds_tree": tree["prefill_seconds"],
            "prefill_tree_over_ar": tree["prefill_seconds"] / ar["prefill_seconds"],
        })
    first, last = rows[0], rows[-1]
    return {"rows": rows, "shape": {"method": "dartree", "width": shape["width"], "budget": shape["budget"],
                                    "candidates": shape["candidates"], "depth": drafter.max_depth},
            "round_growth": last["round_over_ar"] / first["round_over_ar"],
            "date": datetime.date.today().isoformat(), "machine": machine_info(target), "drafter": models.drafter_description}


def format_context_curve(results: dict) -> str:
    sizes = list(results["rows"][0]["verify_seconds"])
    s = results["shape"]
    head = (f"{'context':>8}{'t_AR ms':>9}{'t_round ms':>11}{'round/AR':>9}{'tau':>6}"
            + "".join(f"{f'v({n})/AR':>10}" for n in sizes) + f"{'draft ms':>9}{'prefill x':>10}"
            + "  round draft/tree/verify/commit ms")
    lines = [f"dartree W={s['width']} B={s['budget']} C={s['candidates']} D={s['depth']}; medians of single calls",
             head, "-" * len(head)]
    for r in results["rows"]:
        split = "/".join(f"{1000 * r['round_stage_seconds'][k]:.1f}" for k in STAGE_KEYS)
        lines.append(f"{r['context_tokens']:>8}{1000 * r['t_ar']:>9.1f}{1000 * r['t_round']:>11.1f}"
                     f"{r['round_over_ar']:>9.2f}{r['tau']:>6.2f}"
                     + "".join(f"{r['verify_over_ar'][n]:>10.2f}" for n in sizes)
                     + f"{1000 * r['draft_seconds']:>9.1f}{r['prefill_tree_over_ar']:>10.2f}  {split}")
    lines.append(f"t_round/t_AR at {results['rows'][-1]['context_tokens']} tokens over its value at "
                 f"{results['rows'][0]['context_tokens']}: {results['round_growth']:.2f}x")
    return "\n".join(lines)
