"""Target-only decoding through the same cycle records (one token, nothing drafted)."""

from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

import mlx.core as mx

from dflash_tui.engine.sampling import KeyStream, SamplingConfig, greedy, sample
from dflash_tui.engine.speculative import Cycle
from dflash_tui.engine.state import DecodeState


def baseline_cycles(
    state: DecodeState,
    first_token: int,
    remaining: Callable[[], int],
    should_cancel: Callable[[], bool] = lambda: False,
    sampling: Optional[SamplingConfig] = None,
    keys: Optional[KeyStream] = None,
) -> Iterator[Cycle]:
    """One target step per cycle, pipelined: step n+1 is queued before n is read back.

    With a non-greedy `sampling` (and its `keys`) each token is drawn from the
    target's filtered distribution.
    """
    target = state.target
    if sampling is not None and sampling.is_greedy:
        sampling = None
    assert sampling is None or keys is not None, "sampling needs a key stream"

    def step(tok: mx.array) -> mx.array:
        logits, feats = target.forward(tok.reshape(1, 1), state.target_cache)
        if feats is not None and state.draft is not None:
            state.pending.append(feats)  # keeps the draft's context whole for later DFlash turns
        if sampling is None:
            return greedy(logits[0, -1])
        return sample(logits[0, -1], sampling, keys.next())  # the key is drawn lazily: pipelining holds

    state.tokens.append(first_token)
    nxt = step(mx.array(first_token))
    mx.async_eval(nxt)
    tic = time.perf_counter()
    while remaining() > 0 and not should_cancel():
        cur = nxt
        if remaining() > 1:
            # build and queue the next step on the device's copy of this token before reading it
            # (as mlx_lm.stream_generate does): the device never waits for Python between steps
            nxt = step(cur)
            mx.async_eval(nxt)
            token = cur.item()
            state.tokens.append(token)
        else:
            token = cur.item()
            nxt = None
        now = time.perf_counter()
        yield Cycle(drafted=[], accepted=0, emitted=[token], draft_ms=0.0, verify_ms=(now - tic) * 1e3, rollback_ms=0.0)
        tic = now
        if nxt is None:
            return
