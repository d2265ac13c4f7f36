"""Where converted models, kernels and derived data live: `$DARTREE_CACHE`, default ~/.cache/dartree."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where converted models and derived data live; `$DARTREE_CACHE` overrides the default."""
    return Path(os.environ.get("DARTREE_CACHE", Path.home() / ".cache" / "dartree")).expanduser()
