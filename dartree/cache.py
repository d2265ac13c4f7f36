"""The target's KV cache: preallocated per layer, the tree written in place, the accepted path moved down.

Shapes: every layer holds keys and values in buffers [1, kv_heads, capacity, head_dim]; `layer.keys` and
`layer.values` are views of their first `length` rows, which is what attention reads. A round:

    prefix rows [0, P)                  committed tokens, never copied again
    verify      rows [P, P + N)         the tree's N nodes, written in place by the forward
    compact     rows [P, P + a + 1)     the accepted path (root first) gathered and moved down

so a round costs O(tree) in cache traffic, not O(context).

Why not transformers' DynamicCache: it `torch.cat`s the whole cache onto each forward's new rows (on
SmolLM2 at 2,048 tokens of context that copy was a fifth of a plain decoding step; docs/speed.md,
"Costs that grow with the context"). Why not transformers' StaticCache (gpt-fast's design): it hands
attention the whole buffer and masks the unused rows, so every forward attends over `capacity` keys
however short the context, and it indexes writes by `cache_position`, which a tree (N nodes at
positions P + depth) does not have. A layer here is transformers' DynamicLayer with one difference,
the in-place write, so everything else of the Cache API (mask sizes, `get_seq_length`) is unchanged.
`DynamicCache` still works with `compact_cache` and `truncate_cache` (tests and scripts use both).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class PrefixLayer(DynamicLayer):
    """One layer's keys and values in preallocated buffers; `keys`/`values` view the rows in use.

    A write past the capacity grows the buffers geometrically (one copy, amortised O(1) a row), so a
    caller that under-sizes the cache loses speed, never correctness. The Decoder sizes it for the whole
    generation, so decoding never grows it.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self.key_buffer = self.value_buffer = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.key_buffer = key_states.new_empty(b, h, self.capacity, d)  # [1, kv_heads, capacity, d]
        self.value_buffer = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.keys, self.values = self.key_buffer[:, :, :0], self.value_buffer[:, :, :0]
        self.is_initialized = True

    @property
    def length(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new rows [1, kv_heads, n, d] after the rows in use; return views of all of them."""
        start = self.length
        end = start + key_states.shape[-2]
        self.reserve(end, key_states, value_states)
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.keep(end)
        return self.keys, self.values

    def reserve(self, rows: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Buffers shaped like the given rows [1, kv_heads, *, d] (made at the first call), room for `rows` rows."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if rows > self.key_buffer.shape[2]:
            self._grow(rows)

    def keep(self, length: int) -> None:
        """Use the first `length` rows (a view: nothing is copied)."""
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.key_buffer.shape[2])
        length = self.length
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], capacity, old.shape[3])
            new[:, :, :length] = old[:, :, :length]
            setattr(self, name, new)
        self.capacity = capacity
        self.keep(length)

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        super().reset()


class PrefixCache(Cache):
    """A transformers Cache of `PrefixLayer`s: pass it as `past_key_values` like a DynamicCache."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[PrefixLayer(capacity) for _ in range(num_layers)])

    @property
    def capacity(self) -> int:
        return min(layer.capacity for layer in self.layers)


def new_cache(target, capacity: int) -> PrefixCache:
    """The cache of one generation on `target`, room for `capacity` rows (prompt + output + one tree)."""
    return PrefixCache(target.num_layers, capacity)


def cache_layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError("expected a transformers Cache with .layers (transformers >= 4.56)")
    return layers


def _set_length(layer, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
    if isinstance(layer, PrefixLayer):
        layer.keep(length)  # the rows were written through the views, into the buffers
    else:
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]


@torch.inference_mode()
def compact_cache(cache, prefix_len: int, path: torch.Tensor) -> int:
    """Keep rows [0, prefix_len) and prefix_len + path (in order); returns the new length.

    Only the accepted path's rows are gathered (index_select copies them first, so moving them down over
    their own old places is safe); the prefix is never copied. `DynamicCache.crop` cannot do this: it
    only removes a suffix.
    """
    rows = path + prefix_len
    new_len = prefix_len + int(path.shape[0])
    for layer in cache_layers(cache):
        keys, values = layer.keys, layer.values  # [1, kv_heads, prefix_len + N, d]
        keys[:, :, prefix_len:new_len] = keys.index_select(2, rows)
        values[:, :, prefix_len:new_len] = values.index_select(2, rows)
        _set_length(layer, keys, values, new_len)
    return new_len


def cache_length(cache) -> int:
    return cache.get_seq_length()


@torch.inference_mode()
def truncate_cache(cache, length: int) -> None:
    """Keep the first `length` rows of every layer (undo a verify pass that was only being timed).

    transformers' `DynamicCache.crop` takes the number of tokens to *remove* in recent versions and the
    length to keep in older ones; setting the length directly means the same thing in both.
    """
    for layer in cache_layers(cache):
        _set_length(layer, layer.keys, layer.values, length)
