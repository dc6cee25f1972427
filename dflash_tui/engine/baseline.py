"""Target-only decoding through the same cycle records (one token, nothing drafted)."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import mlx.core as mx

from dflash_tui.engine.sampling import greedy
from dflash_tui.engine.speculative import Cycle
from dflash_tui.engine.state import DecodeState


def baseline_cycles(
    state: DecodeState,
    first_token: int,
    remaining: Callable[[], int],
    should_cancel: Callable[[], bool] = lambda: False,
) -> Iterator[Cycle]:
    """One target step per cycle, pipelined: step n+1 is queued before n is read back."""
    target = state.target

    def step(tok: mx.array) -> mx.array:
        logits, feats = target.forward(tok.reshape(1, 1), state.target_cache)
        if feats is not None and state.draft is not None:
            state.pending.append(feats)  # keeps the draft's context whole for later DFlash turns
        return greedy(logits[0, -1])

    state.tokens.append(first_token)
    nxt = step(mx.array(first_token))
    mx.async_eval(nxt)
    tic = time.perf_counter()
    while remaining() > 0 and not should_cancel():
        cur = nxt
        token = cur.item()
        if remaining() > 1:
            # queue the next step before handing this token out
            state.tokens.append(token)
            nxt = step(cur)
            mx.async_eval(nxt)
        else:
            nxt = None
        now = time.perf_counter()
        yield Cycle(drafted=[], accepted=0, emitted=[token], draft_ms=0.0, verify_ms=(now - tic) * 1e3, rollback_ms=0.0)
        tic = now
        if nxt is None:
            return
