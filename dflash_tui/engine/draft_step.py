"""One draft step: [token, MASK x (b-1)] in, the b-1 proposals' logits out (the decode
loop and the block sizer's cost probe run the same step)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class SelectorStep:
    """A DFlash2 draft step, its proposals not yet picked: its selector walks the top candidates
    of `logits`, greedily or by sampling (lazy either way)."""

    draft: DFlashDraft
    hidden: mx.array
    logits: mx.array
    first: mx.array

    def greedy(self) -> mx.array:
        """The b-1 proposal ids."""
        return self.draft.select(self.hidden, self.logits, self.first)[0][0]

    def sample(self, temperature: float, key: mx.array) -> tuple[mx.array, mx.array]:
        """The b-1 ids drawn along the path, and the q [b-1, V] each was drawn from."""
        ids, q = self.draft.select(self.hidden, self.logits, self.first, temperature, key)
        return ids[0], q[0]


def block_proposals(target: Target, draft: DFlashDraft, cache: list[Any], token: int, b: int,
                    features: Optional[mx.array]) -> "mx.array | SelectorStep":
    """The same forward -> what proposes: the logits [b-1, V] of a DFlash draft, or for a DFlash2
    draft the step its selector picks from."""
    block, hidden, logits = _block(target, draft, cache, token, b, features)
    return SelectorStep(draft, hidden, logits, block[:, 0]) if draft.selects else logits[0]


def greedy_ids(proposed: "mx.array | SelectorStep") -> mx.array:
    """The b-1 greedy proposals of a step: the logits' argmax, or the selector's greedy path. The
    draft's argmax needs no log-probabilities: only the target's choice must match mlx-lm's."""
    return proposed.greedy() if isinstance(proposed, SelectorStep) else mx.argmax(proposed, axis=-1)
