"""Sliding-window attention caches that roll back exactly (gpt-oss, Gemma 4).

mlx-lm keeps a sliding-window layer's keys in a `RotatingKVCache`: a ring of
`max_size` slots written in place one token at a time, or, for a multi-token
forward, the last `max_size - 1` tokens in time order plus the new ones. Its
`trim` only moves the write position back: after a block verify is cut short,
the next one-token step writes into the ring at that position and attends to
the rejected tokens' keys still lying in the slots after it (the adaptive block
size's target-alone steps hit exactly this). Its `is_trimmable` is False once
the window is full, so a later turn could not reuse the cache either.

`WindowKVCache` stores the keys in time order with `history` more tokens behind
the window, so `trim` is exact for anything a verify appended and for up to
`history` tokens further back. Each forward gets the keys mlx-lm would give it,
in mlx-lm's order (the order of a sum decides its rounding):

- a multi-token prefill: the last `min(window - 1, offset)` cached tokens in
  time order, then the new ones, with mlx-lm's own masks (its concatenating path);
- a one-token step: the window as mlx-lm's ring holds it. `stream_generate`
  prefills all of a prompt but its last token, then steps; from the first step
  the ring's slot of position q is (q - base) mod window, base being that first
  step's position (0 while the prompt was shorter than the window);
- a verify (`rows_as_steps`, set by the target before it): every row attends as
  the one-token step at its position would, through `step_rows_attention`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

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
        self.ring_base = 0  # position of this generation's first one-token step (see start_generation)
        self.rows_as_steps = False  # the next multi-token forward is a verify (Target.begin_verify)
        self.step_rows: Optional[int] = None  # that forward's first position, for step_rows_attention

    def start_generation(self, prompt_len: int) -> None:
        """mlx-lm's ring for a generation from a `prompt_len`-token prompt: its first one-token step
        is the prompt's last token."""
        first_step = prompt_len - 1
        self.ring_base = first_step if first_step >= self.max_size else 0
        self.rows_as_steps, self.step_rows = False, None  # a verify's flag never reaches a prefill

    def _ring_order(self, t: int) -> Optional[mx.array]:
        """Indices, into the time-ordered window of W keys ending at position t, in the order of
        mlx-lm's ring slots; None where that is time order (the ring not yet full, or unrotated)."""
        W = self.max_size
        if t < W - 1:
            return None
        r = (self.ring_base - (t - W + 1)) % W  # where slot 0's position sits in time order
        return None if r == 0 else (mx.arange(W) + r) % W

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
        first = self.offset
        self._n += S
        self.offset += S
        k, v = self.keys[..., self._n - visible : self._n, :], self.values[..., self._n - visible : self._n, :]
        as_steps, self.rows_as_steps = self.rows_as_steps, False  # the flag holds for one forward only
        if S == 1:
            order = self._ring_order(first)
            if order is not None:
                return mx.take(k, order, axis=2), mx.take(v, order, axis=2)
        elif as_steps:
            self.step_rows = first
        return k, v

    def step_rows_attention(self, sdpa: Callable[..., mx.array], queries: mx.array, scale: float,
                            sinks: Optional[mx.array]) -> mx.array:
        """The verify's attention, row by row as one-token steps compute it: each query over its own
        window in ring order (`sdpa`: mlx-lm's attention call). Rows with full windows go in one
        call with the rows as its batch. queries: [1, H, L, D] -> [1, H, L, D]."""
        first, self.step_rows = self.step_rows, None
        L, W = queries.shape[2], self.max_size
        start = self.offset - self._n  # position of storage index 0
        out: list[Optional[mx.array]] = [None] * L
        full = [i for i in range(L) if first + i >= W - 1]
        for i in range(L):
            if first + i < W - 1:  # the ring not yet full: the keys so far, in time order
                end = first + i + 1 - start
                out[i] = sdpa(queries[:, :, i : i + 1], self.keys[..., :end, :], self.values[..., :end, :],
                              scale=scale, mask=None, sinks=sinks)
        if full:
            rows = []
            for i in full:
                t = first + i
                window = mx.arange(t - W + 1, t + 1) - start
                order = self._ring_order(t)
                rows.append(window if order is None else window[order])
            idx = mx.stack(rows)  # [R, W] storage indices
            k = mx.take(self.keys[0], idx, axis=1).transpose(1, 0, 2, 3)  # [R, Hkv, W, D]
            v = mx.take(self.values[0], idx, axis=1).transpose(1, 0, 2, 3)
            q = queries[0, :, full[0] : full[-1] + 1][:, :, None].transpose(1, 0, 2, 3)  # [R, H, 1, D]
            o = sdpa(q, k, v, scale=scale, mask=None, sinks=sinks)  # [R, H, 1, D]
            for j, i in enumerate(full):
                out[i] = o[j : j + 1]
        return mx.concatenate(out, axis=2)

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
