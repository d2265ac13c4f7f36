"""Prompt input for the CLI and the benchmark: one prompt, or a JSONL file with a `prompt` field."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
DEV_PROMPTS = SHARED_DATA / "dev_prompts.jsonl"
TRAIN_PROMPTS = SHARED_DATA / "train_prompts.jsonl"
DEV_LONG_PROMPTS = SHARED_DATA / "dev_long_prompts.jsonl"  # documents + a question (shared/data/README.md)


def read_prompt_file(path: str | Path, limit: int | None = None, spread: bool = False) -> list[str]:
    """Prompts of a JSONL file, in file order; `limit` keeps the first N, or with `spread` N prompts
    evenly spaced over the whole file (a fair sample of a file grouped by source)."""
    return [prompt for prompt, _ in read_prompt_rows(path, limit, spread)]


def read_prompt_rows(path: str | Path, limit: int | None = None, spread: bool = False) -> list[tuple[str, str]]:
    """(prompt, source) pairs, chosen as `read_prompt_file` chooses prompts; the source is the row's
    optional `source` field ("" when absent), so that results can be broken down by domain."""
    if spread and limit is not None:
        rows = read_prompt_rows(path)
        if limit >= len(rows):
            return rows
        return [rows[round(i * (len(rows) - 1) / max(limit - 1, 1))] for i in range(limit)]
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist")
    rows = []
    with path.open() as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path}:{line_no} is not valid JSON: {exc}") from exc
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise UserError(f"{path}:{line_no} has no string field 'prompt'")
            rows.append((row["prompt"], str(row.get("source", ""))))
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise UserError(f"prompt file {path} holds no prompts")
    return rows


def fit_to_context(ids: list[int], max_context: int, reserve: int) -> tuple[list[int], int]:
    """Drop the oldest tokens so prompt + `reserve` fits the context; returns (ids, tokens dropped)."""
    room = max_context - reserve
    if room < 1:
        raise UserError(f"the context of {max_context} tokens cannot hold {reserve} new tokens")
    if len(ids) <= room:
        return ids, 0
    return ids[-room:], len(ids) - room
