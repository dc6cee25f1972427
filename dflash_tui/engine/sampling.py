"""Token choice and block acceptance: greedy here; sampling builds on the same calls."""

from __future__ import annotations

import mlx.core as mx


def greedy(logits: mx.array) -> mx.array:
    """argmax over the last axis."""
    return mx.argmax(logits, axis=-1)


def accept_greedy(drafted: list[int], posterior: list[int]) -> int:
    """Length of the longest prefix of `drafted` that the target's argmax agrees with.

    `posterior[i]` is the target's choice after block position i, so proposal i
    (block position i+1) is accepted iff it equals `posterior[i]`.
    """
    n = 0
    for d, p in zip(drafted, posterior):
        if d != p:
            break
        n += 1
    return n
