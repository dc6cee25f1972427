"""Sliding-window attention caches that roll back exactly (gpt-oss, Gemma 4).

mlx-lm keeps a sliding-window layer's keys in a `RotatingKVCache`: a ring of
`max_size` slots written in place one token at a time, or, for a multi-token
forward, the last `max_size - 1` tokens in time order plus the new ones. Its
`trim` only moves the write position back: after a block verify is cut short,
the next one-token step writes into the ring at that position and attends to
the rejected tokens' keys still lying in the slots after it (the adaptive block
size's target-alone steps hit exactly this). Its `is_trimmable` is False once
the window is full, so a later turn could not reuse the cache either.

`WindowKVCache` gives every forward the keys mlx-lm's concatenating path gives
it: the last `min(window - 1, offset)` cached tokens in time order, then the
new ones, with mlx-lm's own masks (inherited). It stores them in time order
with `history` more tokens behind the window, so `trim` is exact for anything
a verify appended and for up to `history` tokens further back.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

HISTORY = 256  # tokens kept behind the window, for rolling back a turn's end
_STEP = 64  # growth step of the buffer (amortises the compaction copy)


class WindowKVCache(RotatingKVCache):
    """A sliding-window KV cache in time order that can roll back; masks are mlx-lm's."""

    def __init__(self, max_size: int, history: int = HISTORY):
        super().__init__(max_size, keep=0)
        self.history = history
        self._n = 0  # valid entries: the keys of positions offset - _n .. offset - 1

    @classmethod
    def replaces(cls, cache: Any) -> bool:
        """True for the mlx-lm caches this one stands in for (a plain ring, no kept prefix)."""
        return type(cache) is RotatingKVCache and cache.keep == 0 and cache.offset == 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        S = keys.shape[2]
        if self.keys is None or self._n + S > self.keys.shape[2]:
            self._compact(keys, values, S)
        self.keys[..., self._n : self._n + S, :] = keys
        self.values[..., self._n : self._n + S, :] = values
        # what mlx-lm's concatenating path attends over: the window behind the new tokens, then them
        visible = min(self.max_size - 1, self.offset) + S
        self._n += S
        self.offset += S
        return self.keys[..., self._n - visible : self._n, :], self.values[..., self._n - visible : self._n, :]

    def _compact(self, keys: mx.array, values: mx.array, incoming: int) -> None:
        """Drop what lies beyond window + history and make room for `incoming` more tokens."""
        kept = min(self._n, self.max_size - 1 + self.history)
        size = kept + incoming + _STEP
        B, H, _, Dk = keys.shape
        new_k = mx.zeros((B, H, size, Dk), keys.dtype)
        new_v = mx.zeros((B, H, size, values.shape[3]), values.dtype)
        if kept:
            new_k[..., :kept, :] = self.keys[..., self._n - kept : self._n, :]
            new_v[..., :kept, :] = self.values[..., self._n - kept : self._n, :]
        self.keys, self.values, self._n = new_k, new_v, kept

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """The window: the last `max_size` tokens (fewer at the start)."""
        n = min(self._n, self.max_size)
        return self.keys[..., self._n - n : self._n, :], self.values[..., self._n - n : self._n, :]

    # -- rollback --------------------------------------------------------------
    def can_trim(self, n: int) -> bool:
        """Whether dropping the last `n` tokens leaves the window the next forward needs."""
        return 0 <= n <= self.offset and self._n - n >= min(self.max_size - 1, self.offset - n)

    def is_trimmable(self) -> bool:
        return True  # within `can_trim`: see Target.truncate

    def trim(self, n: int) -> int:
        if not self.can_trim(n):
            raise ValueError(f"cannot drop {n} tokens: {self._n} kept for a window of {self.max_size}")
        self.offset -= n
        self._n -= n
        return n

    @property
    def state(self) -> tuple[Any, ...]:
        """What it holds, complete enough for `from_state` (so it round-trips through mlx-lm's
        prompt-cache files): the kept keys and values, then offset, window and history."""
        return self.keys[..., : self._n, :], self.values[..., : self._n, :], self.offset, self.max_size, self.history

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.max_size, self.history = v
        self._n = 0 if self.keys is None else self.keys.shape[2]
        self.keep, self._idx = 0, 0

    def size(self) -> int:
        return min(self.offset, self.max_size)

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
