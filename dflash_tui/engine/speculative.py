"""The DFlash decode loop: one draft forward and one target verify per cycle."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import mlx.core as mx

from dflash_tui.engine.sampling import accept_greedy, greedy
from dflash_tui.engine.state import DecodeState


@dataclass
class Cycle:
    """What one cycle produced, before EOS / max-token cuts."""

    drafted: list[int]
    accepted: int
    emitted: list[int]
    draft_ms: float
    verify_ms: float
    rollback_ms: float


def draft_proposals(state: DecodeState, token: int, b: int) -> mx.array:
    """One draft forward over [token, MASK x (b-1)] -> b-1 greedy proposals (lazy)."""
    target, draft = state.target, state.draft
    block = mx.array([[token] + [draft.config.mask_token_id] * (b - 1)])
    hidden = draft(target.embed(block), state.take_pending(), state.draft_cache)
    for c in state.draft_cache:
        c.trim(b)  # the block's own K/V is never kept
    return greedy(target.head(hidden[:, 1:]))[0]


Proposer = Callable[[DecodeState, int, int], mx.array]


def dflash_cycles(
    state: DecodeState,
    first_token: int,
    block_size: int,
    remaining: Callable[[], int],
    should_cancel: Callable[[], bool] = lambda: False,
    propose: Proposer = draft_proposals,
) -> Iterator[Cycle]:
    """Yield cycles until the caller stops iterating, `remaining()` hits 0, or a cancel.

    `first_token` is committed but not yet in the target cache. After each
    yielded cycle the state is consistent: its last emitted token is the next
    cycle's first, not yet in the cache.
    """
    target = state.target
    assert state.draft is not None
    token = first_token
    while not should_cancel():
        left = remaining()
        if left <= 0:
            return
        b = max(1, min(block_size, left))
        tic = time.perf_counter()
        drafted_arr = None
        if b > 1:
            drafted_arr = propose(state, token, b)
            mx.eval(drafted_arr)
        t_draft = time.perf_counter()

        first = mx.array([token])
        verify_in = mx.concatenate([first, drafted_arr.astype(first.dtype)]) if drafted_arr is not None else first
        target.begin_verify(state.target_cache)
        logits, feats = target.forward(verify_in[None], state.target_cache)
        posterior_arr = greedy(logits[0])
        mx.eval(posterior_arr, feats)
        t_verify = time.perf_counter()

        drafted = drafted_arr.tolist() if drafted_arr is not None else []
        posterior = posterior_arr.tolist()
        accepted = accept_greedy(drafted, posterior)
        keep = accepted + 1
        target.rollback(state.target_cache, keep, b)
        state.tokens.append(token)
        state.tokens.extend(drafted[:accepted])
        if feats is not None:
            state.pending.append(feats[:, :keep] if keep < b else feats)
        t_roll = time.perf_counter()

        token = posterior[accepted]
        yield Cycle(
            drafted=drafted,
            accepted=accepted,
            emitted=drafted[:accepted] + [token],
            draft_ms=(t_draft - tic) * 1e3,
            verify_ms=(t_verify - t_draft) * 1e3,
            rollback_ms=(t_roll - t_verify) * 1e3,
        )
