"""Long contexts built from data we already have: earlier responses concatenated as a document, then a request.

Users paste a document and ask for a summary or an answer; the real training prompts hold only about a
thousand such rows, all under 1,400 tokens. Committed responses of the target are plentiful, so several of
them, joined as the sections of one document and followed by a summary or question request, make a
long-context prompt at any length we choose. The answer is then the target's greedy response, as always.
"""

from __future__ import annotations

import numpy as np

REQUESTS = (
    "Summarize the text above in a few sentences.",
    "Write a short summary of the document above.",
    "What are the main points of the text above? Answer with a short list.",
    "Give the document above a title, and explain your choice in one sentence.",
    "What is the first section of the text above about? Answer briefly.",
    "Explain the last part of the text above in simple words.",
    "List three questions that the text above answers.",
    "Which of the sections above is the most useful, and why?",
    "Rewrite the key facts of the text above as bullet points.",
    "TL;DR of the text above:",
)
HEADERS = ("", "Document:\n\n", "Read the following text.\n\n", "Here are some notes I collected.\n\n")


def build_long_prompt(sections: list[str], request: str, header: str = "") -> str:
    """`header`, the sections separated by blank lines, then the request on its own paragraph."""
    return header + "\n\n".join(s.strip() for s in sections) + "\n\n" + request


def pick_sections(lengths: np.ndarray, target_tokens: int, rng: np.random.Generator, min_sections: int = 2) -> list[int]:
    """Indices of distinct sources (token lengths `lengths`) drawn at random until about `target_tokens`
    (at least `min_sections` of them; none that would overshoot by more than its own length)."""
    order = rng.permutation(len(lengths))
    picked, total = [], 0
    for i in order.tolist():
        if total >= target_tokens and len(picked) >= min_sections:
            break
        if total + lengths[i] > 1.25 * target_tokens and len(picked) >= min_sections:
            continue
        picked.append(i)
        total += int(lengths[i])
    return picked


def long_prompts(sources: list[str], lengths: np.ndarray, n: int, rng: np.random.Generator,
                 min_tokens: int = 400, max_tokens: int = 1800) -> list[str]:
    """`n` documents-with-a-request of a log-uniform token length in [min_tokens, max_tokens]."""
    out = []
    for _ in range(n):
        target = int(np.exp(rng.uniform(np.log(min_tokens), np.log(max_tokens))))
        sections = [sources[i] for i in pick_sections(lengths, target, rng)]
        out.append(build_long_prompt(sections, REQUESTS[rng.integers(len(REQUESTS))],
                                     HEADERS[rng.integers(len(HEADERS))]))
    return out
