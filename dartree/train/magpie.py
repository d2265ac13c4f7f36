"""Magpie prompts: the target writes its own user turns, so prompts never run out and need no download.

Give an instruction-tuned model its chat template up to the start of a user turn and it writes a plausible
user request (Magpie, Xu et al. 2024). Sampled at T = 1 with top-p 0.95, these requests follow the
target's own idea of what users ask; the greedy answers to them are then ordinary on-policy data.

A 135M model writes many unusable turns (empty, cut off, looping, or a copy of an earlier one), so every
sampled turn goes through :func:`verdict` and the counts of each rejection reason are kept with the data.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..models.target import Target
from .stream import generate_stream, sampler

_SENTINEL = "\u2063MAGPIE\u2063"  # an invisible separator: cannot occur in a template


def _template_parts(target: Target) -> tuple[str, str]:
    """The chat template's text before and after the user's content (system turn included)."""
    text = target.tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                                add_generation_prompt=True, enable_thinking=False)
    before, after = text.split(_SENTINEL)
    return before, after


def user_turn_prefix(target: Target) -> list[int]:
    """Token ids of the template up to the start of a user turn's content."""
    return list(target.tokenizer(_template_parts(target)[0], add_special_tokens=False)["input_ids"])


def user_text(target: Target, prompt_ids) -> str:
    """The user's content inside the chat-template ids of a single-turn prompt (e.g. from a token shard)."""
    before, after = _template_parts(target)
    text = target.tokenizer.decode([int(t) for t in prompt_ids], skip_special_tokens=False)
    return text[len(before):len(text) - len(after)] if text.startswith(before) and text.endswith(after) else text


def normalize(text: str) -> str:
    """The key two prompts share when they are the same request (case, spacing, end punctuation aside)."""
    return re.sub(r"\s+", " ", text).strip().lower().rstrip(".!?")


def verdict(text: str, terminated: bool, seen: set[str], forbidden: frozenset[str] = frozenset()) -> str | None:
    """None if the sampled user turn is kept (its key is then added to `seen`), else why it is rejected.

    - unterminated: no end-of-turn within the length cap (a loop, or a document that never ends);
    - empty / short: nothing, or fewer than 3 words;
    - template: the turn contains chat-template markup;
    - degenerate: a character run of 8+, under half letters, under half distinct word trigrams, or one word
      as 30 % of a 10+ word turn;
    - reserved: the same as a measurement prompt (dev files, reserved rows);
    - duplicate: the same as a prompt already kept.
    """
    t = text.strip()
    if not terminated:
        return "unterminated"
    if not t:
        return "empty"
    if "<|" in t or "|>" in t:
        return "template"
    words = t.split()
    if len(words) < 3:
        return "short"
    if _degenerate(t, words):
        return "degenerate"
    key = normalize(t)
    if key in forbidden:
        return "reserved"
    if key in seen:
        return "duplicate"
    seen.add(key)
    return None


def _degenerate(text: str, words: list[str]) -> bool:
    if re.search(r"(.)\1{7,}", text):
        return True
    if sum(c.isalpha() for c in text) < 0.5 * len(text.replace(" ", "")):
        return True
    lower = [w.lower() for w in words]
    trigrams = list(zip(lower, lower[1:], lower[2:]))
    if len(trigrams) >= 6 and len(set(trigrams)) < 0.5 * len(trigrams):
        return True
    return len(lower) >= 10 and Counter(lower).most_common(1)[0][1] > 0.3 * len(lower)


@dataclass
class MagpieStats:
    sampled: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"sampled": self.sampled, "accepted": self.accepted, "rejected": dict(sorted(self.rejected.items())),
                "rejection_rate": round(1 - self.accepted / self.sampled, 4) if self.sampled else 0.0}


def sample_user_turns(target: Target, n: int, seed: int, seen: set[str], forbidden: frozenset[str] = frozenset(),
                      *, temperature: float = 1.0, top_p: float = 0.95, max_tokens: int = 256,
                      round_size: int = 128, max_rounds: int = 20, **stream_kw) -> tuple[list[str], MagpieStats]:
    """`n` kept user turns (fewer if `max_rounds` rounds of `round_size` samples do not yield them)."""
    prefix = user_turn_prefix(target)
    eos = set(int(e) for e in target.eos_token_ids)
    gen = torch.Generator(device=target.device).manual_seed(seed)
    kept: list[str] = []
    stats = MagpieStats()
    for _ in range(max_rounds):
        if len(kept) >= n:
            break
        turns: dict[int, list[int]] = {}
        generate_stream(target, [(i, prefix) for i in range(round_size)], max_tokens, batch_size=round_size,
                        choose=sampler(temperature, top_p, gen),
                        on_done=lambda i, g: turns.__setitem__(i, g.ids[g.prompt_len:]), **stream_kw)
        for i in range(round_size):
            ids = turns[i]
            terminated = bool(ids) and ids[-1] in eos
            text = target.tokenizer.decode(ids[:-1] if terminated else ids, skip_special_tokens=False)
            stats.sampled += 1
            reason = verdict(text, terminated, seen, forbidden) if len(kept) < n else "surplus"
            if reason is None:
                kept.append(text.strip())
                stats.accepted += 1
            elif reason != "surplus":
                stats.rejected[reason] += 1
            else:
                stats.sampled -= 1  # a round's leftovers beyond `n` were never looked at
    return kept, stats
