"""The parts a DFlash2 draft adds (`DFlash2DraftModel`): grouped dynamic causal convolutions
around each layer's attention and MLP, and a candidate selector that picks the block's
proposals as a path through the top candidates of the draft's logits.

Read in z-lab's torch reference (github.com/z-lab/dflash@07ebd93, dflash/model.py:
`GroupedDynamicCausalConv`, `CandidateSelector`, `Qwen3DFlashDecoderLayer`) and its MLX
one (dflash 0.1.0, dflash/model_mlx.py); written here from that description.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn


class GroupedDynamicConv(nn.Module):
    """Causal convolution over the block's positions, per channel: a fixed kernel plus one
    predicted from the input at each position, shared by the channels of a group.

    `kernels(x)` predicts two kernels from x: the first shapes the sublayer's input, the
    second its output (`mix`)."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden // group_size
        self.base_kernel = mx.zeros((2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * self.groups, bias=False)

    def kernels(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """x [B, L, H] -> the input and output kernels, each [B, L, kernel_size, groups]."""
        k = self.kernel_projection(x).reshape(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return k[..., 0, :, :], k[..., 1, :, :]

    def mix(self, x: mx.array, dynamic: mx.array, which: int) -> mx.array:
        """y[t] = sum over lags o of (base[which][o] + dynamic[t][o], per group) * x[t - o]."""
        B, L, H = x.shape
        xs = x.reshape(B, L, self.groups, self.group_size)
        out = mx.zeros_like(xs)
        for lag in range(self.kernel_size):
            past = xs if lag == 0 else mx.concatenate([mx.zeros_like(xs[:, :lag]), xs[:, : L - lag]], axis=1)
            weight = self.base_kernel[which, lag].reshape(1, 1, self.groups, self.group_size).astype(x.dtype)
            out = out + (weight + dynamic[:, :, lag, :, None]) * past
        return out.reshape(B, L, H)


class CandidateSelector(nn.Module):
    """Greedy path through the top-k candidates of each position: a candidate scores its logit
    plus a low-rank affinity between the previous choice (the block's first token to start)
    and itself, modulated by the position's hidden state."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def path(self, hidden: mx.array, logits: mx.array, first: mx.array, temperature: float = 0.0,
             key: Optional[mx.array] = None) -> tuple[mx.array, Optional[mx.array]]:
        """hidden [B, L, H], logits [B, L, V] of the proposal positions, first [B] -> ids [B, L], and
        with a temperature > 0 (and a key) the ids drawn from softmax(score / T) over each position's
        candidates, with those distributions as q [B, L, V] (the reference samples with the plain
        temperature; speculative acceptance is exact for any q it is given)."""
        candidates = mx.argpartition(logits, -self.top_k, axis=-1)[..., -self.top_k :]  # [B, L, k]
        unary = mx.take_along_axis(logits, candidates, axis=-1)
        h = self.hidden_projection(hidden)  # [B, L, r]
        keys = mx.random.split(key, hidden.shape[1]) if temperature > 0 else None
        prev, path, qs = first, [], []
        for i in range(hidden.shape[1]):
            query = self.predecessor_codebook(prev) * h[:, i]  # [B, r]
            scores = unary[:, i] + (self.successor_codebook(candidates[:, i]) * query[:, None]).sum(-1)  # [B, k]
            if keys is None:
                pick = mx.argmax(scores, axis=-1)
            else:
                scaled = scores.astype(mx.float32) / temperature
                pick = mx.random.categorical(scaled, key=keys[i])
                q = mx.zeros((logits.shape[0], logits.shape[-1]), dtype=mx.float32)
                qs.append(mx.put_along_axis(q, candidates[:, i], mx.softmax(scaled, axis=-1), axis=-1))
            prev = mx.take_along_axis(candidates[:, i], pick[:, None], axis=-1)[:, 0]
            path.append(prev)
        return mx.stack(path, axis=1), (mx.stack(qs, axis=1) if qs else None)
