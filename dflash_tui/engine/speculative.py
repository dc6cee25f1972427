"""The DFlash decode loop: one draft forward and one target verify per cycle."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import mlx.core as mx

from dflash_tui.engine.sampling import (
    KeyStream,
    SamplingConfig,
    accept_greedy,
    greedy,
    probabilities,
    sample,
    sample_proposals,
    speculative_accept,
)
from dflash_tui.engine.block_sizer import BlockSizer
from dflash_tui.engine.draft_step import SelectorStep, block_proposals, greedy_ids
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


def draft_logits(state: DecodeState, token: int, b: int) -> "mx.array | SelectorStep":
    """One draft forward over [token, MASK x (b-1)] -> the draft's logits for the b-1 proposals
    ([b-1, V], lazy); for a DFlash2 draft, the step its selector picks them from."""
    return block_proposals(state.target, state.draft, state.draft_cache, token, b, state.take_pending())


def draft_proposals(state: DecodeState, token: int, b: int) -> mx.array:
    """One draft forward -> b-1 greedy proposals (lazy)."""
    return greedy_ids(draft_logits(state, token, b))


# A proposer returns [b-1] token ids (a deterministic draft: under sampling its
# q is one-hot, which keeps the output exact), [b-1, V] logits, from which the
# loop takes the argmax or, when sampling, draws from q, or a DFlash2 selector
# step, which picks greedily or draws its path and gives its q.
Proposer = Callable[[DecodeState, int, int], "mx.array | SelectorStep"]


def _choose_proposals(
    proposed: "mx.array | SelectorStep", sampling: Optional[SamplingConfig], keys: Optional[KeyStream]
) -> tuple[mx.array, Optional[mx.array]]:
    """(proposal ids [b-1], their q [b-1, V] or None for one-hot)."""
    if not isinstance(proposed, SelectorStep) and proposed.ndim == 1:
        return proposed, None  # ids already: a one-hot q
    if sampling is None:
        return greedy_ids(proposed), None
    if isinstance(proposed, SelectorStep):
        return proposed.sample(sampling.temperature, keys.next())
    return sample_proposals(proposed, sampling, keys.next())


def lazy_draft_wanted() -> bool:
    """Hand the draft's proposals to the verify on the device, unread: on a GPU, where the
    device runs apart from Python (on a CPU the wait costs nothing the verify would not)."""
    return mx.default_device() == mx.gpu


def dflash_cycles(
    state: DecodeState,
    first_token: int,
    block_size: "int | BlockSizer",
    remaining: Callable[[], int],
    should_cancel: Callable[[], bool] = lambda: False,
    propose: Proposer = draft_logits,
    sampling: Optional[SamplingConfig] = None,
    keys: Optional[KeyStream] = None,
) -> Iterator[Cycle]:
    """Yield cycles until the caller stops iterating, `remaining()` hits 0, or a cancel.

    `first_token` is committed but not yet in the target cache. After each
    yielded cycle the state is consistent: its last emitted token is the next
    cycle's first, not yet in the cache. With a non-greedy `sampling` (and its
    `keys`), verification is speculative rejection sampling.
    """
    target = state.target
    assert state.draft is not None
    if sampling is not None and sampling.is_greedy:
        sampling = None  # temperature 0 is the exact greedy path
    assert sampling is None or keys is not None, "sampling needs a key stream"
    sizer = block_size if isinstance(block_size, BlockSizer) else None
    # pipelined: the draft is not waited for, so draft_ms is the time to set it off and
    # verify_ms runs until both are done (the two still add up to the cycle)
    pipelined = lazy_draft_wanted()
    token = first_token
    while not should_cancel():
        left = remaining()
        if left <= 0:
            return
        b = block_size.choose(left) if sizer else max(1, min(block_size, left))
        tic = time.perf_counter()
        drafted_arr = q = None
        if b > 1:
            drafted_arr, q = _choose_proposals(propose(state, token, b), sampling, keys)
            if pipelined:  # the verify below reads the proposals on the device: no wait for them here
                mx.async_eval(drafted_arr, *([] if q is None else [q]))
            else:
                mx.eval(drafted_arr, q)
        t_draft = time.perf_counter()

        first = mx.array([token])
        verify_in = mx.concatenate([first, drafted_arr.astype(first.dtype)]) if drafted_arr is not None else first
        target.begin_verify(state.target_cache)
        logits, feats = target.forward(verify_in[None], state.target_cache)
        if sampling is None:
            posterior_arr = greedy(logits[0]).astype(mx.int32)
            readback = posterior_arr if drafted_arr is None else mx.concatenate([drafted_arr.astype(mx.int32), posterior_arr])
            mx.eval(readback, feats)
            t_verify = time.perf_counter()
            values = readback.tolist()  # one host read: proposals then the target's tokens
            drafted, posterior = values[: b - 1] if drafted_arr is not None else [], values[-b:]
            accepted = accept_greedy(drafted, posterior)
            next_token = posterior[accepted]
        else:
            if drafted_arr is None:
                result = mx.stack([mx.array(0, mx.int32), sample(logits[0, 0], sampling, keys.next())])
                readback = result
            else:
                result = speculative_accept(drafted_arr, q, probabilities(logits[0], sampling), keys.next())
                readback = mx.concatenate([drafted_arr.astype(mx.int32), result])
            mx.eval(readback, feats)
            t_verify = time.perf_counter()
            values = readback.tolist()  # the cycle's one host read: proposals, accepted, next token
            drafted, (accepted, next_token) = values[:-2], values[-2:]
        if sizer is not None and b > 1:
            sizer.observe(b, accepted)
        keep = accepted + 1
        target.rollback(state.target_cache, keep, b)
        state.tokens.append(token)
        state.tokens.extend(drafted[:accepted])
        if feats is not None:
            state.pending.append(feats[:, :keep] if keep < b else feats)
        t_roll = time.perf_counter()

        token = next_token
        yield Cycle(
            drafted=drafted,
            accepted=accepted,
            emitted=drafted[:accepted] + [token],
            draft_ms=(t_draft - tic) * 1e3,
            verify_ms=(t_verify - t_draft) * 1e3,
            rollback_ms=(t_roll - t_verify) * 1e3,
        )
