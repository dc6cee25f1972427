"""Hybrid targets (Qwen3.5/3.6: Gated DeltaNet + full attention): exact rollback.

Attention layers roll back by trimming their KV cache. Linear-attention layers
carry a recurrent state and a conv state that cannot be trimmed: before each
verify forward their caches are armed, the forward records what it computes
(gdn_tape), and the rollback rebuilds both states after `keep` tokens from that
record, never re-running the target.

Multi-turn reuse needs truncation to an earlier point, which a recurrent state
cannot do either: the target cache keeps snapshots of the linear-layer states
at the start of each prefill piece (the prompt's last token is one, so a turn's
prompt end minus one, the point a regenerate or a re-rendered next turn
truncates to, is kept), and a
truncation lands on the latest snapshot at or before the requested point; the
caller then prefills the rest. A snapshot holds references to arrays the
cache already computed (about 50 MB for a Qwen3.5-4B shape); `max_snapshots`
bounds them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.engine import gdn_tape
from dflash_tui.engine.target import Target


class Snapshot(NamedTuple):
    length: int  # tokens in the cache when it was taken
    states: list[tuple[Optional[mx.array], Optional[mx.array]]]  # (conv, recurrent) per linear layer


class HybridCache(list):
    """A hybrid target's per-layer caches plus the bookkeeping truncation needs."""

    def __init__(self, caches: list[Any]):
        super().__init__(caches)
        self.length = 0  # tokens the caches hold
        self.snapshots: list[Snapshot] = []  # increasing lengths, all on this cache's current history


class HybridTarget(Target):
    """A Target whose Gated DeltaNet layers roll back exactly after a partial accept.

    `rollback_mode`: "auto" (per-step states on mlx-lm's per-step path, replay
    where mlx-lm runs a Metal kernel) or "replay" (always replay).
    `max_snapshots`: linear-layer state snapshots kept per cache for truncation.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, name: str = "target", rollback_mode: str = "auto",
                 max_snapshots: int = 4):
        super().__init__(model, tokenizer, name=name)
        if rollback_mode not in gdn_tape.MODES:
            raise ValueError(f"unknown rollback mode {rollback_mode!r}")
        self.rollback_mode = rollback_mode
        self.max_snapshots = max_snapshots
        self.linear_ids = [i for i, layer in enumerate(self.layers) if getattr(layer, "is_linear", False)]
        self.attention_ids = [i for i, layer in enumerate(self.layers) if not getattr(layer, "is_linear", False)]
        mixers = [getattr(self.layers[i], "linear_attn", None) for i in self.linear_ids]
        unsupported = [i for i, m in zip(self.linear_ids, mixers) if m is None or not gdn_tape.supports(m)]
        # a linear layer we cannot record would make a partial accept unrecoverable: say so at rollback
        self.unsupported = unsupported
        if not unsupported:
            for m in mixers:
                gdn_tape.attach(m)
        self.recorded = [] if unsupported else mixers

    def use_step_rows(self, on: bool) -> bool:
        # the step-rows classes go under the recording ones: a recording conv must see the whole
        # input (its rollback rebuilds the conv state from it) before the windows are cut
        for m in self.recorded:
            gdn_tape.detach(m)
        try:
            return super().use_step_rows(on)
        finally:
            for m in self.recorded:
                gdn_tape.attach(m)

    # -- caches --------------------------------------------------------------
    def make_cache(self) -> HybridCache:
        return HybridCache(super().make_cache())

    def forward(self, tokens: mx.array, cache: list[Any], last_only: bool = False) -> tuple[mx.array, Optional[mx.array]]:
        if not isinstance(cache, HybridCache):
            return super().forward(tokens, cache, last_only=last_only)
        if last_only and self.max_snapshots > 0:
            # a prefill piece: snapshot where it starts. The prompt's last token is a piece of its own
            # (DecodeState.prefill, as mlx-lm's prefill runs it), so the point a regenerate or a
            # re-rendered turn truncates to, its prompt end minus one, has a snapshot. The piece runs
            # whole: on a GPU a row may round with its forward's row count, and mlx-lm's prefill
            # runs the same pieces
            self._snapshot(cache)
        out = super().forward(tokens, cache, last_only=last_only)
        cache.length += tokens.shape[1]
        return out

    def _snapshot(self, cache: HybridCache) -> None:
        if cache.length == 0:
            return  # an empty cache is what a reset gives anyway
        states = [(cache[i][0], cache[i][1]) for i in self.linear_ids]
        if cache.snapshots and cache.snapshots[-1].length == cache.length:
            cache.snapshots.pop()
        cache.snapshots.append(Snapshot(cache.length, states))
        del cache.snapshots[: -self.max_snapshots]

    # -- rollback ------------------------------------------------------------
    def begin_verify(self, cache: list[Any]) -> None:
        super().begin_verify(cache)
        if self.unsupported:
            return  # rollback will refuse a partial accept
        for i in self.linear_ids:
            gdn_tape.arm(cache[i], self.rollback_mode)

    def rollback(self, cache: list[Any], keep: int, block_len: int) -> None:
        drop = block_len - keep
        if drop > 0 and self.unsupported:
            raise NotImplementedError(f"cannot roll back the linear-attention layers {self.unsupported} of this model")
        for i in self.attention_ids:
            if drop > 0:
                cache[i].trim(drop)
        for i in self.linear_ids:
            c = cache[i]
            if gdn_tape.is_armed(c):
                gdn_tape.restore(c, keep)
            elif drop > 0:
                raise RuntimeError("rollback of a partial accept without begin_verify before the verify forward")
        if isinstance(cache, HybridCache):
            cache.length -= drop
            cache.snapshots = [s for s in cache.snapshots if s.length <= cache.length]

    def truncate(self, cache: list[Any], length: int, keep: int) -> int:
        """Roll back to the latest snapshot at or before `keep`; -1 if there is none."""
        if keep >= length:
            return length
        if not isinstance(cache, HybridCache) or cache.length != length:
            return -1  # unknown history: the caller starts from an empty cache
        usable = [s for s in cache.snapshots if s.length <= keep]
        if not usable or usable[-1].length == 0:
            return -1
        snap = usable[-1]
        for i in self.attention_ids:
            cache[i].trim(length - snap.length)
        for i, (conv, state) in zip(self.linear_ids, snap.states):
            gdn_tape.disarm(cache[i])
            cache[i][0] = conv
            cache[i][1] = state
        cache.length = snap.length
        cache.snapshots = usable
        return snap.length
