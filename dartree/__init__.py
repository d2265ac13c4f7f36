"""DARTree: tree speculative decoding with a block-parallel drafter and a causal correction head.

The package is layered so that each step of the algorithm lives in one place:
models (target, drafter) -> tree (builders) -> attention / verify -> cache, orchestrated by
engine and observed through trace records. Nothing below `ui` knows about Gradio.
The methods themselves are listed once, in dartree.methods; these tuples are their names.
"""

from .methods import METHODS as _REGISTRY

METHODS = tuple(_REGISTRY)
TREE_METHODS = tuple(name for name, m in _REGISTRY.items() if m.builder is not None)
DEFAULT_TARGET = "smollm2-135m"

__all__ = ["METHODS", "TREE_METHODS", "DEFAULT_TARGET"]
