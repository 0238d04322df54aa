"""The target's caches, made rollback-safe.

mlx-lm gives sliding-window layers a RotatingKVCache, which overwrites the oldest keys in place once the
window is full and then refuses to trim (is_trimmable turns false): a rejected draft could not be
forgotten. WindowKVCache replaces it: it grows like mlx-lm's KVCache, trims exactly, builds the
window's mask itself, and forgets positions that no later query can see only when the engine says the
verify is settled (forget_old, after commit), never during a forward. Full-attention layers keep
mlx-lm's KVCache (trim is exact there); Gated DeltaNet layers keep ArraysCache, rolled back by hybrid.py.
"""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from ...errors import CheckpointError


class WindowKVCache:
    """Keys and values of one sliding-window layer for positions start..offset-1 (absolute positions)."""
    step = 256

    def __init__(self, window: int):
        self.window = window
        self.keys = self.values = None
        self.offset = 0          # positions seen (the next token's position)
        self.start = 0           # the oldest position still held

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        held, n = self.offset - self.start, keys.shape[2]
        if self.keys is None or held + n > self.keys.shape[2]:
            grow = (n + self.step - 1) // self.step * self.step
            self.keys = _grown(self.keys, held, keys, grow)
            self.values = _grown(self.values, held, values, grow)
        self.keys[..., held:held + n, :] = keys
        self.values[..., held:held + n, :] = values
        self.offset += n
        return self.keys[..., :held + n, :], self.values[..., :held + n, :]

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False):
        """Queries at offset..offset+n-1 against the held keys start..offset+n-1: causal, inside the window."""
        window = window_size or self.window
        if n == 1 and self.offset + 1 - self.start <= window:
            return None
        query = mx.arange(self.offset, self.offset + n)[:, None]
        key = mx.arange(self.start, self.offset + n)[None]
        return (key <= query) & (key > query - window)

    def trim(self, n: int) -> int:
        n = min(n, self.offset - self.start)
        self.offset -= n
        return n

    def forget_old(self) -> None:
        """Drop positions no later query can see (older than the window before the next position), in
        batches of one window so that the copy is rare."""
        drop = self.offset - (self.window - 1) - self.start
        if drop >= self.window and self.keys is not None:
            held = self.offset - self.start
            self.keys = mx.contiguous(self.keys[..., drop:held, :])
            self.values = mx.contiguous(self.values[..., drop:held, :])
            self.start += drop

    def is_trimmable(self) -> bool:
        return True

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self):
        held = self.offset - self.start
        return self.keys[..., :held, :], self.values[..., :held, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def _grown(buffer: mx.array | None, held: int, like: mx.array, grow: int) -> mx.array:
    b, heads, _, dim = like.shape
    extra = mx.zeros((b, heads, grow, dim), like.dtype)
    return extra if buffer is None else mx.concatenate([buffer[..., :held, :], extra], axis=2)


def make_caches(model, deltanet_layers: set[int]) -> list:
    """The model's own cache list, with every sliding window made trimmable; any cache kind whose exact
    rollback this engine cannot do is refused before a token runs."""
    made = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in model.layers]
    caches = []
    for i, cache in enumerate(made):
        if isinstance(cache, RotatingKVCache):
            if cache.keep:
                raise CheckpointError(f"Layer {i}'s cache keeps {cache.keep} attention-sink tokens, which this "
                                      "engine cannot roll back. Pick a pair of a supported architecture.",
                                      code="unsupported_architecture")
            cache = WindowKVCache(cache.max_size)
        elif isinstance(cache, ArraysCache) and i not in deltanet_layers:
            raise CheckpointError(f"Layer {i} keeps a recurrent state of a kind this engine cannot roll back. "
                                  "Pick a pair of a supported architecture.", code="unsupported_architecture")
        elif type(cache) not in (KVCache, ArraysCache):
            raise CheckpointError(f"Layer {i} uses mlx-lm's {type(cache).__name__}, which this engine cannot "
                                  "roll back. Pick a pair of a supported architecture.",
                                  code="unsupported_architecture")
        caches.append(cache)
    return caches


def cached_tensors(caches: list) -> dict:
    """Every array the caches hold for the positions kept, by layer and kind (for the rollback tests)."""
    out = {}
    for i, cache in enumerate(caches):
        if isinstance(cache, ArraysCache):
            out.update({(i, "conv" if j == 0 else "recurrent"): a for j, a in enumerate(cache.cache) if a is not None})
        elif isinstance(cache, WindowKVCache):
            keys, values = cache.state
            out[(i, "keys")], out[(i, "values")] = keys[..., -(cache.window - 1):, :], values[..., -(cache.window - 1):, :]
        elif cache.keys is not None:
            out[(i, "keys")], out[(i, "values")] = cache.keys[..., :cache.offset, :], cache.values[..., :cache.offset, :]
    return out


def commit_caches(caches: list, length: int) -> None:
    """Keep positions < length in every attention cache; windows then forget what no query will see."""
    for cache in caches:
        if isinstance(cache, (KVCache, WindowKVCache)):
            cache.trim(cache.offset - length)
            if isinstance(cache, WindowKVCache):
                cache.forget_old()


def cached_length(caches: list) -> int:
    return next((c.offset for c in caches if isinstance(c, (KVCache, WindowKVCache))), 0)
