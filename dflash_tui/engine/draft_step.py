"""One draft step: [token, MASK x (b-1)] in, the b-1 proposals' logits out."""

from __future__ import annotations

from typing import Any, Optional

import mlx.core as mx
import numpy as np

from dflash_tui.engine import cpu_draft
from dflash_tui.engine.draft import DFlashDraft
from dflash_tui.engine.target import Target


def block_logits(target: Target, draft: DFlashDraft, cache: list[Any], token: int, b: int,
                 features: Optional[mx.array]) -> "mx.array | np.ndarray":
    """The draft's forward over the block (after pushing `features` into `cache`) and its
    read-out through the target's head -> [b-1, V]: lazy on MLX, or a host array where the
    whole step runs in numpy (then it never waits on MLX's stream). The block's own K/V is
    not kept."""
    host = cpu_draft.host_parts(target, draft, cache)
    if host is not None:
        return cpu_draft.block_logits(draft, host, token, b, features, cache)
    block = mx.array([[token] + [draft.config.mask_token_id] * (b - 1)])
    hidden = draft(target.embed(block), features, cache)
    for c in cache:
        c.trim(b)
    return target.head(hidden[:, 1:])[0]


def greedy_choice(logits: "mx.array | np.ndarray") -> mx.array:
    """The argmax of each row (computed where the logits are)."""
    if isinstance(logits, np.ndarray):
        return mx.array(logits.argmax(-1))
    return mx.argmax(logits, axis=-1)
