"""Tokens per cycle of a target/draft pair on held-out prompts, through the real engine."""

from __future__ import annotations

from typing import Sequence

from dflash_tui.engine.draft import DFlashDraft
from dflash_tui.engine.target import Target


def tokens_per_cycle(target: Target, draft: DFlashDraft, prompts: Sequence[list[int]], max_tokens: int = 256,
                     block_size: int = 16) -> list[dict]:
    """Greedy DFlash on each prompt (token ids, chat template applied): one stats row per prompt."""
    from dflash_tui.engine.conversation import Conversation, GenerationSettings
    from dflash_tui.engine.events import Done, Error
    from dflash_tui.engine.loading import Pair

    target.set_capture(draft.config.target_layer_ids)
    conv = Conversation(Pair(target=target, draft=draft, target_name=target.name, draft_name="trained"))
    settings = GenerationSettings(max_tokens=max_tokens, block_size=block_size)
    rows = []
    for prompt in prompts:
        done = None
        for event in conv.generate_tokens(prompt, settings):
            if isinstance(event, Error):
                raise RuntimeError(event.message)
            if isinstance(event, Done):
                done = event
        s = done.stats
        rows.append({"tokens": s["generated_tokens"], "cycles": s["cycles"], "tokens_per_cycle": s["tokens_per_cycle"],
                     "acceptance": s["acceptance"], "text": done.text})
    return rows


def summary(rows: Sequence[dict]) -> dict[str, float]:
    """Mean tokens per cycle over prompts, and over all cycles pooled."""
    if not rows:
        return {"mean_tokens_per_cycle": 0.0, "pooled_tokens_per_cycle": 0.0}
    cycles = sum(r["cycles"] for r in rows)
    pooled = sum(r["tokens_per_cycle"] * r["cycles"] for r in rows) / cycles if cycles else 0.0
    return {"mean_tokens_per_cycle": sum(r["tokens_per_cycle"] for r in rows) / len(rows), "pooled_tokens_per_cycle": pooled}
