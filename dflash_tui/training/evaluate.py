"""Tokens per cycle of a target/draft pair on held-out prompts, through the real engine."""

from __future__ import annotations

from typing import Optional, Sequence

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


def main(argv: Optional[list[str]] = None) -> int:
    """python -m dflash_tui.training.evaluate --target T --draft D --prompts heldout.jsonl [-n 8]"""
    import argparse
    import json

    from dflash_tui.engine.loading import load_pair
    from dflash_tui.training.prompts import prompt_ids, read_prompts

    p = argparse.ArgumentParser(description="Greedy tokens per cycle of a target/draft pair on held-out prompts.")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True, help="JSONL with a \"prompt\" (or \"messages\") per line")
    p.add_argument("-n", type=int, default=8, help="how many prompts, from the top of the file")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    args = p.parse_args(argv)
    pair = load_pair(args.target, args.draft)
    convs = read_prompts(args.prompts)[: args.n]
    rows = tokens_per_cycle(pair.target, pair.draft, [prompt_ids(pair.target.tokenizer, m) for m in convs],
                            max_tokens=args.max_tokens, block_size=args.block_size)
    for m, r in zip(convs, rows):
        print(f"{r['tokens_per_cycle']:5.2f} tokens/cycle  {r['tokens']:4d} tokens  {m[-1]['content'][:70]}")
    print(json.dumps(summary(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
