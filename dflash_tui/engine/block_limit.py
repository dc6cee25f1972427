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


def refusal(block: int, draft_block: int) -> Optional[str]:
    """The whole refusal of a fixed block size past the draft's own (the app's words); None when it fits."""
    why = past_training(block, draft_block)
    return f"block size {block} refused: {why} (2 to {draft_block}, 0 = {draft_block}, or auto)" if why else None
