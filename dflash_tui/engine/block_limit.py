"""The largest block a draft may be asked for: the block size it was trained on. Past it the draft
proposes positions it never learned (lossless still, but a guess), so every entry point refuses it
with the same reason. No MLX here: the app and the server read it too."""

from __future__ import annotations

from typing import Optional


def past_training(block: int, draft_block: int) -> Optional[str]:
    """Why `block` is refused for a draft trained on blocks of `draft_block`; None when it fits."""
    if draft_block and block > draft_block:
        return (f"the draft was trained to draft blocks of {draft_block} tokens, and past that it guesses "
                "positions it never learned")
    return None
