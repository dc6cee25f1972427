"""Adaptive block size: pick the block that maximises expected tokens per second.

A cycle's cost grows with the block size differently on every device (a
16-token verify costs 4-5 single-token steps on a laptop CPU, ~1.5 on an H200,
close to 1 on Apple Silicon), and what a bigger block buys depends on how deep
the draft is accepted. So: measure the cost curve once, track per-position
acceptance while running, and each cycle choose
argmax_b  E[tokens | b] / cost(b).  b = 1 is the target stepping alone (no
draft), for stretches where drafting does not pay; every EXPLORE such steps
in a row, one drafted block checks whether it pays again. The block size
never changes the output.
"""

from __future__ import annotations

import time

import mlx.core as mx

from dflash_tui.engine.draft import DFlashDraft
from dflash_tui.engine.draft_step import block_proposals, greedy_ids
from dflash_tui.engine.target import Target


def measure_costs(target: Target, draft: DFlashDraft, sizes: tuple[int, ...], context: int = 64, reps: int = 5) -> dict[int, float]:
    """Seconds for one draft forward + one verify forward of each block size (1: a target step
    alone), on scratch caches."""
    cache, dcache = target.make_cache(), draft.make_cache()
    ctx = mx.arange(context)[None] % max(2, target.vocab_size - 1)
    _, feats = target.forward(ctx, cache)
    draft.append_context(feats, dcache)
    mx.eval([c.state for c in cache], draft.cache_arrays(dcache))
    costs: dict[int, float] = {}

    def once(b: int) -> float:
        block = mx.array([[1] * b])
        tic = time.perf_counter()
        if b > 1:
            mx.eval(greedy_ids(block_proposals(target, draft, dcache, 1, b, None)))  # the loop's own draft step
        target.begin_verify(cache)
        logits, f = target.forward(block, cache)
        mx.eval(logits.argmax(-1), f)
        target.rollback(cache, 0, b)
        return time.perf_counter() - tic

    for b in sizes:
        once(b)  # warm-up: first sight of a shape compiles on some backends
    samples: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(reps):
        for b in sizes:  # round-robin, so a burst of outside load lands on every size alike
            samples[b].append(once(b))
    for b in sizes:
        costs[b] = min(samples[b])  # outside load only ever adds time
    return costs
