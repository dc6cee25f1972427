"""The engine's greedy choice is mlx-lm's: argmax of `logits - logsumexp(logits)` in the logits'
dtype, which in bf16 can tie two close logits and take the lower id (seen on a Gemma 4 replica,
whose soft-capped logits sit close together)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler

from dflash_tui.engine.sampling import greedy

# a Gemma 4 replica's bf16 logits where the two choices part: 185 is the larger logit, but both
# round to the same log-probability and mlx-lm takes 138
TOP = {185: 1.296875, 138: 1.2890625, 311: 1.0546875, 253: 1.046875}


def bf16_logits() -> mx.array:
    """Two rows of those top logits over flat backgrounds that put logsumexp near the real 6.09."""
    base = mx.array([[0.1] * 392, [-2.5] * 392])
    for i, v in TOP.items():
        base[:, i] = v
    return base.astype(mx.bfloat16)


def mlx_lm_greedy(logits: mx.array) -> list[int]:
    """What mlx_lm.generate_step does with one row of logits at temperature 0."""
    sampler = make_sampler(0.0)
    return [sampler(row - mx.logsumexp(row, keepdims=True)).item() for row in logits]


def test_greedy_is_mlx_lm_on_a_bf16_near_tie():
    logits = bf16_logits()
    assert mx.argmax(logits, axis=-1).tolist() == [185, 185]  # the plain argmax would part from mlx-lm
    assert greedy(logits).tolist() == mlx_lm_greedy(logits) == [138, 138]


def test_greedy_is_mlx_lm_on_random_rows():
    for dtype in (mx.float32, mx.bfloat16):
        logits = (4 * mx.random.normal((64, 392), key=mx.random.key(1))).astype(dtype)
        assert greedy(logits).tolist() == mlx_lm_greedy(logits)
