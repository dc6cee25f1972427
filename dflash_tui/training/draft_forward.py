"""The draft's training forward: many blocks per sequence in one pass, with an explicit mask.

Uses the very modules of `DFlashDraft` (its projections, norms, RoPE, input
scale and logit read-out), so what trains is what runs. Block j sits at
positions anchor_j .. anchor_j + B - 1 and sees the injected context of the
tokens before anchor_j, plus itself, each layer's causality and window applied
on absolute positions, and nothing of the other blocks: exactly what one
inference cycle at that anchor sees.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.engine.draft import DFlashDraft, DraftAttention, DraftLayer, visible_keys
from dflash_tui.errors import UserError


def block_tokens(tokens: mx.array, anchors: mx.array, block_size: int, mask_token_id: int) -> mx.array:
    """[B, K*bs] block inputs: each block is [token at its anchor, MASK x (bs-1)]."""
    B, K = anchors.shape
    first = mx.take_along_axis(tokens, anchors, axis=1)[..., None]
    masks = mx.full((B, K, block_size - 1), mask_token_id, dtype=tokens.dtype)
    return mx.concatenate([first, masks], axis=-1).reshape(B, K * block_size)


def block_mask(anchors: mx.array, context_len: int, block_size: int, window: Optional[int] = None,
               causal: bool = False) -> mx.array:
    """[B, 1, K*bs, L + K*bs] bool: each block sees the context before its anchor and itself,
    each query within that as the layer decides (`visible_keys`: causal, window)."""
    B, K = anchors.shape
    n = K * block_size
    owner = mx.arange(n) // block_size  # which block each query/key slot belongs to
    q_anchor = mx.repeat(anchors, block_size, axis=1)  # [B, n]
    q_pos = q_anchor + mx.arange(n)[None] % block_size  # each slot's absolute position
    pos = mx.arange(context_len)
    ctx = pos[None, None, :] < q_anchor[:, :, None]
    own = mx.broadcast_to((owner[:, None] == owner[None, :])[None], (B, n, n))
    rule_ctx = visible_keys(q_pos, mx.broadcast_to(pos[None], (B, context_len)), causal, window)
    rule_own = visible_keys(q_pos, q_pos, causal, window)
    if rule_ctx is not None:
        ctx, own = ctx & rule_ctx, own & rule_own
    return mx.concatenate([ctx, own], axis=-1)[:, None]


def _per_block(x: mx.array, K: int, bs: int) -> mx.array:
    """[B, H, K*bs, D] -> [B*K, H, bs, D], so RoPE can take one offset per block."""
    B, H, _, D = x.shape
    return x.reshape(B, H, K, bs, D).transpose(0, 2, 1, 3, 4).reshape(B * K, H, bs, D)


def _joined(x: mx.array, B: int, K: int) -> mx.array:
    """Inverse of `_per_block`."""
    _, H, bs, D = x.shape
    return x.reshape(B, K, H, bs, D).transpose(0, 2, 1, 3, 4).reshape(B, H, K * bs, D)


def _attention(attn: DraftAttention, x: mx.array, ctx: mx.array, anchors: mx.array, mask: mx.array, bs: int) -> mx.array:
    B, n, _ = x.shape
    K = n // bs
    offsets = anchors.reshape(-1)
    q = attn.q_norm(attn.q_proj(x).reshape(B, n, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    q = _joined(attn.rope(_per_block(q, K, bs), offset=offsets), B, K)
    kb = attn.k_norm(attn.k_proj(x).reshape(B, n, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    kb = _joined(attn.rope(_per_block(kb, K, bs), offset=offsets), B, K)
    vb = attn.v_proj(x).reshape(B, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    kc, vc = attn._kv(ctx, 0)  # the context at its absolute positions 0..L-1
    keys = mx.concatenate([kc, kb.astype(kc.dtype)], axis=2)
    values = mx.concatenate([vc, vb.astype(vc.dtype)], axis=2)
    out = _masked_attention(q, keys, values, attn.scale, mask)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, n, -1))


def _masked_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    """Plain softmax attention with a boolean mask and GQA, spelled out: its gradient needs no fused kernel."""
    B, Hq, n, D = q.shape
    Hk = k.shape[1]
    q = q.reshape(B, Hk, Hq // Hk, n, D)
    scores = (q * scale) @ k[:, :, None].swapaxes(-1, -2)  # [B, Hk, g, n, S]
    scores = mx.where(mask[:, :, None], scores.astype(mx.float32), -mx.inf)
    weights = mx.softmax(scores, axis=-1).astype(v.dtype)
    return (weights @ v[:, :, None]).reshape(B, Hq, n, D)


def _layer(layer: DraftLayer, x: mx.array, ctx: mx.array, anchors: mx.array, mask: mx.array, bs: int) -> mx.array:
    h = x + _attention(layer.self_attn, layer.input_layernorm(x), ctx, anchors, mask, bs)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def train_hidden(draft: DFlashDraft, block_embeds: mx.array, features: mx.array, anchors: mx.array) -> mx.array:
    """Draft hidden states [B, K*bs, H] for K blocks per sequence (before the target's head).

    block_embeds: [B, K*bs, H] embedded `block_tokens`; features: [B, L, k*H]
    target features of the whole sequence; anchors: [B, K] block start positions.
    """
    if draft.config.is_dflash2:  # its convolutions run along each block: this forward would mix blocks
        raise UserError("training a DFlash2 draft is not supported (DFlash drafts only)")
    bs = block_embeds.shape[1] // anchors.shape[1]
    ctx = draft.fuse(features)
    h = draft.block_input(block_embeds)
    masks: dict[tuple[Optional[int], bool], mx.array] = {}
    for layer in draft.layers:
        rule = (layer.self_attn.window, layer.self_attn.causal)
        if rule not in masks:
            masks[rule] = block_mask(anchors, features.shape[1], bs, *rule)
        h = _layer(layer, h, ctx, anchors, masks[rule], bs)
    return draft.norm(h)


def block_loss(draft: DFlashDraft, head, embed, tokens: mx.array, features: mx.array, anchors: mx.array,
               lengths: mx.array, block_size: int, gamma: float) -> tuple[mx.array, mx.array]:
    """Decay-weighted cross-entropy on block positions 1..bs-1, and the per-position hit rate [bs-1].

    Labels are the true tokens after each anchor; positions past a sequence's
    `lengths` carry no weight. Position k weighs exp(-(k-1)/gamma): early
    positions decide how much of a block is accepted.
    """
    B, K = anchors.shape
    bs = block_size
    blocks = block_tokens(tokens, anchors, bs, draft.config.mask_token_id)
    hidden = train_hidden(draft, embed(blocks), features, anchors)
    hidden = hidden.reshape(B, K, bs, -1)[:, :, 1:]
    logits = draft.read_out(head(hidden)).astype(mx.float32)  # [B, K, bs-1, V]
    k = mx.arange(1, bs)
    where = anchors[..., None] + k  # [B, K, bs-1]
    valid = where < lengths[:, None, None]
    labels = mx.take_along_axis(tokens, mx.minimum(where, tokens.shape[1] - 1).reshape(B, -1), axis=1).reshape(where.shape)
    weight = mx.exp(-(k - 1).astype(mx.float32) / gamma) * valid
    ce = nn.losses.cross_entropy(logits, labels, reduction="none")
    loss = (ce * weight).sum() / mx.maximum(weight.sum(), 1.0)
    hits = (mx.argmax(logits, axis=-1) == labels) & valid
    # expected accepted length of a block: the run of hits from position 1
    run = mx.cumprod(hits.astype(mx.float32), axis=-1)
    n_valid = mx.maximum(valid.astype(mx.float32).sum(axis=(0, 1)), 1.0)
    stats = mx.concatenate([(hits.sum(axis=(0, 1)) / n_valid), run.sum(axis=-1).mean()[None]])
    return loss, mx.stop_gradient(stats)
