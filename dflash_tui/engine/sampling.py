"""Token choice and block acceptance: greedy, filtered sampling, speculative rejection sampling.

Filters follow mlx-lm's sampler, so a setting means the same thing here as in
`mlx_lm.sample_utils.make_sampler`: top-p, then min-p, then top-k on the
temperature-1 log-probs, then the temperature on what survives. The draft's
and the target's logits go through the same filters; rejection sampling on
those filtered distributions makes the output follow the target's filtered
distribution exactly.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

_NEG_INF = float("-inf")
# a drawn seed's bits. The seed is recorded (a session, `generate --json`, a reply's stats) so that the reply
# can be redone: 31 bits fit every place it can be given back (config.toml's seed, `--seed`, whose range is
# 0 to 2^31 - 1) and every JSON reader (a double holds integers exactly up to 2^53). A seed given through the
# API may be any int: it is taken modulo 2^64, what mx.random.key takes.
SEED_BITS = 31


def greedy(logits: mx.array) -> mx.array:
    """mlx-lm's greedy choice: argmax of the log-probabilities, in the logits' dtype. In bf16,
    `logits - logsumexp` can round two close logits to one value, and mlx-lm then takes the
    lower id where argmax of the logits would take the higher."""
    return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)


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


# -- settings ----------------------------------------------------------------
@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from logits; temperature 0 means greedy (the filters are then moot)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, not {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, not {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], not {self.min_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


class KeyStream:
    """An explicit PRNG key, split once per draw.

    A seed fixes every draw of a turn, and no other code in the process can
    shift the sequence (mlx's global `mx.random` state is never touched).
    """

    def __init__(self, seed: Optional[int] = None):
        if seed is None:
            seed = secrets.randbits(SEED_BITS)
        self.seed = int(seed) % (1 << 64)  # mx.random.key takes an unsigned 64-bit seed
        self._key = mx.random.key(self.seed)

    def next(self) -> mx.array:
        """A fresh key (lazy: drawing one costs no host sync)."""
        self._key, sub = mx.random.split(self._key)
        return sub


# -- filtered distributions --------------------------------------------------
def filter_logits(logits: mx.array, config: SamplingConfig) -> mx.array:
    """[..., V] logits -> float32 logits/temperature with filtered-out tokens at -inf.

    The most likely token always survives, so no row is ever empty.
    """
    assert not config.is_greedy, "greedy decoding does not filter"
    x = logits.astype(mx.float32)
    x = x - mx.logsumexp(x, axis=-1, keepdims=True)  # the filters are defined on temperature-1 log-probs
    vocab = x.shape[-1]
    if config.top_p < 1.0:
        x = _top_p(x, config.top_p)
    if config.min_p > 0.0:
        floor = mx.max(x, axis=-1, keepdims=True) + math.log(config.min_p)
        x = mx.where(x < floor, _NEG_INF, x)
    if 0 < config.top_k < vocab:
        drop = mx.argpartition(-x, kth=config.top_k - 1, axis=-1)[..., config.top_k :]
        x = mx.put_along_axis(x, drop, mx.array(_NEG_INF, x.dtype), axis=-1)
    return x / config.temperature


def _top_p(logprobs: mx.array, top_p: float) -> mx.array:
    """Keep the most likely tokens until their mass reaches top_p (the token crossing it stays)."""
    desc = -mx.sort(-logprobs, axis=-1)
    probs = mx.exp(desc)
    mass_before = mx.cumsum(probs, axis=-1) - probs  # mass of the strictly more likely tokens
    n_keep = mx.sum(mass_before < top_p, axis=-1, keepdims=True)  # >= 1: the first has mass_before 0
    smallest_kept = mx.take_along_axis(desc, n_keep - 1, axis=-1)
    return mx.where(logprobs < smallest_kept, _NEG_INF, logprobs)


def probabilities(logits: mx.array, config: SamplingConfig) -> mx.array:
    """The filtered distribution over the last axis, float32."""
    return mx.softmax(filter_logits(logits, config), axis=-1)


def sample(logits: mx.array, config: SamplingConfig, key: Optional[mx.array]) -> mx.array:
    """One token per row of `logits`: argmax when greedy, else a draw from the filtered distribution."""
    if config.is_greedy:
        return greedy(logits)
    assert key is not None, "sampling needs a key"
    return mx.random.categorical(filter_logits(logits, config), key=key).astype(mx.int32)


def sample_proposals(draft_logits: mx.array, config: SamplingConfig, key: mx.array) -> tuple[mx.array, mx.array]:
    """[n, V] draft logits -> (n proposals drawn independently from q, q itself [n, V])."""
    filtered = filter_logits(draft_logits, config)
    proposals = mx.random.categorical(filtered, key=key).astype(mx.int32)
    return proposals, mx.softmax(filtered, axis=-1)


# -- speculative rejection sampling -------------------------------------------
def speculative_accept(
    drafted: mx.array,
    draft_probs: Optional[mx.array],
    target_probs: mx.array,
    key: mx.array,
) -> mx.array:
    """Rejection sampling over one block, on device; any leading batch axes are kept.

    drafted [..., n] proposals, draft_probs q [..., n, V] they were drawn from
    (None: the proposer is deterministic, q is one-hot on each proposal),
    target_probs p [..., n+1, V] (row i: the target after block position i).
    Proposal i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
    first rejection the next token is drawn from norm(max(p_i - q_i, 0)); after
    a full accept it is drawn from p_n. Returns [..., 2] int32: (accepted, next token).
    """
    n = drafted.shape[-1]
    vocab = target_probs.shape[-1]
    k_accept, k_token = mx.random.split(key)
    x = drafted.astype(mx.int32)
    p_x = mx.take_along_axis(target_probs[..., :n, :], x[..., None], axis=-1)[..., 0]
    q_x = 1.0 if draft_probs is None else mx.take_along_axis(draft_probs, x[..., None], axis=-1)[..., 0]
    u = mx.random.uniform(shape=x.shape, key=k_accept)
    ok = (u * q_x < p_x).astype(mx.int32)  # u in [0, 1): never accepts a token the target rules out
    accepted = mx.sum(mx.cumprod(ok, axis=-1), axis=-1)

    at = accepted[..., None, None]
    p_row = mx.take_along_axis(target_probs, at, axis=-2)[..., 0, :]
    if draft_probs is None:
        # one-hot q: the residual is p without the rejected proposal; -1 marks "full accept, nothing to remove"
        padded = mx.concatenate([x, mx.full((*x.shape[:-1], 1), -1, mx.int32)], axis=-1)
        removed = mx.take_along_axis(padded, accepted[..., None], axis=-1)
        residual = mx.where(mx.arange(vocab) == removed, 0.0, p_row)
    else:
        # q padded with a zero row, so a full accept draws from p_n through the same formula
        q_padded = mx.concatenate([draft_probs, mx.zeros_like(draft_probs[..., :1, :])], axis=-2)
        residual = mx.maximum(p_row - mx.take_along_axis(q_padded, at, axis=-2)[..., 0, :], 0.0)
    # p == q up to rounding leaves nothing to correct: fall back to p itself
    residual = mx.where(mx.sum(residual, axis=-1, keepdims=True) > 0, residual, p_row)
    token = mx.random.categorical(mx.log(residual), key=k_token).astype(mx.int32)
    return mx.stack([accepted.astype(mx.int32), token], axis=-1)
