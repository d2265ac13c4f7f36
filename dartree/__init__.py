"""DARTree: tree speculative decoding with a block-parallel drafter and a causal correction head.

The package is layered so that each step of the algorithm lives in one place:
models (target, drafter) -> tree (builders) -> attention / verify -> cache, orchestrated by
engine and observed through trace records. Nothing below `ui` knows about Gradio.
"""

METHODS = ("ar", "chain", "ddtree", "dartree-fixed", "dartree")
TREE_METHODS = ("chain", "ddtree", "dartree-fixed", "dartree")
DEFAULT_TARGET = "smollm2-135m"

__all__ = ["METHODS", "TREE_METHODS", "DEFAULT_TARGET"]
