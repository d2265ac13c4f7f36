"""KV-cache compaction: after verification keep the prefix and the accepted path, drop the rest.

The verify pass appended one row per tree node after the prefix. Only the rows of the accepted path
(root first) are gathered with index_select and moved right behind the prefix; the prefix itself is
never copied, so a round's compaction costs O(path), not O(context).
`DynamicCache.crop` cannot do this: it only removes a suffix.
"""

from __future__ import annotations

import torch


def cache_layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError("expected a transformers DynamicCache with .layers (transformers >= 4.56)")
    return layers


@torch.inference_mode()
def compact_cache(cache, prefix_len: int, path: torch.Tensor) -> int:
    """Keep rows [0, prefix_len) and prefix_len + path (in order); returns the new length."""
    rows = path + prefix_len
    new_len = prefix_len + int(path.shape[0])
    for layer in cache_layers(cache):
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            kept = tensor.index_select(2, rows)
            tensor[:, :, prefix_len:new_len] = kept
            setattr(layer, name, tensor[:, :, :new_len])
    return new_len


def cache_length(cache) -> int:
    return cache.get_seq_length()


@torch.inference_mode()
def truncate_cache(cache, length: int) -> None:
    """Keep the first `length` rows of every layer (undo a verify pass that was only being timed).

    transformers' `DynamicCache.crop` takes the number of tokens to *remove* in recent versions and the
    length to keep in older ones; slicing the layers directly means the same thing in both.
    """
    for layer in cache_layers(cache):
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]
