"""One draft step: [token, MASK x (b-1)] in, the b-1 proposals' logits out (the decode
loop and the block sizer's cost probe run the same step)."""

from __future__ import annotations

from typing import Any, Optional

import mlx.core as mx

from dflash_tui.engine.draft import DFlashDraft
from dflash_tui.engine.target import Target


def _block(target: Target, draft: DFlashDraft, cache: list[Any], token: int, b: int,
           features: Optional[mx.array]) -> tuple[mx.array, mx.array, mx.array]:
    block = mx.array([[token] + [draft.config.mask_token_id] * (b - 1)])
    hidden = draft(target.embed(block), features, cache)
    for c in cache:
        c.trim(b)
    hidden = hidden[:, 1:]
    return block, hidden, draft.read_out(target.head(hidden))


def block_logits(target: Target, draft: DFlashDraft, cache: list[Any], token: int, b: int,
                 features: Optional[mx.array]) -> mx.array:
    """The draft's forward over the block (after pushing `features` into `cache`) and its
    read-out through the target's head -> [b-1, V], lazy. The block's own K/V is not kept."""
    return _block(target, draft, cache, token, b, features)[2][0]


def block_proposals(target: Target, draft: DFlashDraft, cache: list[Any], token: int, b: int,
                    features: Optional[mx.array]) -> mx.array:
    """The same forward -> what proposes: the logits [b-1, V] of a DFlash draft, or the ids
    [b-1] a DFlash2 draft's selector picks from them (greedy; lazy)."""
    block, hidden, logits = _block(target, draft, cache, token, b, features)
    ids = draft.select(hidden, logits, block[:, 0])
    return logits[0] if ids is None else ids[0]
