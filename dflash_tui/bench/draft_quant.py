"""Benchmark (not a test): what quantizing the draft (`--draft-quant`) does to acceptance.

One process, one target; the draft is loaded as shipped, then in 8 and in 4 bits
(its own linear layers, engine/draft_quant.py). Each prompt is answered greedily
at one block size by each; the report gives, pooled over the prompts, the tokens
per cycle (tau: the tokens a cycle adds to the reply), the acceptance (accepted /
drafted), the draft's milliseconds per cycle, and whether every reply equals the
unquantized draft's (it must: the target verifies).

    python -m dflash_tui.bench.draft_quant --demo --prompts dflash_tui/demo/heldout_prompts.jsonl \\
        --max-tokens 128 --json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.compare import fresh_turn
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.draft import load_draft
from dflash_tui.engine.draft_quant import quantize_draft
from dflash_tui.engine.loading import Pair, load_pair

WIDTHS = (0, 8, 4)  # 0: as shipped


def measure(pair: Pair, prompts: list[list[int]], max_tokens: int, block_size: int) -> dict[str, Any]:
    """Pooled acceptance figures of one pair over the prompts (counted from its blocks), and its replies."""
    conv = Conversation(pair)
    cycles = cycle_tokens = drafted = accepted = 0
    draft_ms = 0.0
    replies = []
    for prompt in prompts:
        events = fresh_turn(conv, prompt, GenerationSettings(max_tokens=max_tokens, block_size=block_size))
        done = events[-1]
        for b in events:
            if b.type == "block" and b.drafted:
                cycles += 1
                cycle_tokens += len(b.emitted)
                drafted += len(b.drafted)
                accepted += b.accepted
                draft_ms += b.draft_ms
        replies.append(done.tokens)
    return {
        "cycles": cycles,
        "tokens_per_cycle": cycle_tokens / cycles if cycles else 0.0,
        "acceptance": accepted / drafted if drafted else 0.0,
        "draft_ms_per_cycle": draft_ms / cycles if cycles else 0.0,
        "replies": replies,
    }


def run(base: Pair, draft: str, prompts: list[list[int]], max_tokens: int, block_size: int,
        widths: tuple[int, ...] = WIDTHS) -> dict[str, Any]:
    """`base`: the pair with its draft as shipped; `draft`: where that draft loads from again."""
    rows: dict[str, Any] = {}
    reference: Optional[list[list[int]]] = None
    for bits in widths:
        d = base.draft if bits == 0 else load_draft(draft)
        if bits:
            quantize_draft(d, bits)
        pair = Pair(target=base.target, draft=d, target_name=base.target_name, draft_name=base.draft_name, draft_quant=bits)
        res = measure(pair, prompts, max_tokens, block_size)
        replies = res.pop("replies")
        reference = replies if reference is None else reference
        res["identical_replies"] = sum(a == b for a, b in zip(replies, reference))
        res["draft_weight_bytes"] = sum(v.nbytes for _, v in tree_flatten(d.parameters()))
        rows["none" if bits == 0 else f"{bits}-bit"] = res
    return {"device": str(mx.default_device()), "prompts": len(prompts), "max_tokens": max_tokens,
            "block_size": block_size, "drafts": rows}


def main(argv: Optional[list[str]] = None) -> int:
    from dflash_tui.commands.bench import read_prompts
    from dflash_tui.commands.common import add_model_arguments, resolve_pair

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--prompts", type=Path, default=None, metavar="FILE", help="one request per line, or JSONL")
    p.add_argument("--prompt", default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    require_at_least(p, args, {"max_tokens": 1, "block_size": 2})
    texts = read_prompts(args)
    model, draft = resolve_pair(args)
    if draft is None:
        raise SystemExit("a draft is needed (--draft, or --demo)")
    base = load_pair(model, draft, trust_remote_code=args.trust_remote_code)
    tok = base.target.tokenizer
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                            enable_thinking=False)) for t in texts]
    report = run(base, draft, prompts, args.max_tokens, args.block_size)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, r in report["drafts"].items():
            print(f"draft {name:>6}: tau {r['tokens_per_cycle']:.2f} tokens/cycle, acceptance {r['acceptance']:.1%}, "
                  f"draft {r['draft_ms_per_cycle']:.1f} ms/cycle, {r['draft_weight_bytes'] / 2**20:.1f} MiB, "
                  f"{r['identical_replies']}/{report['prompts']} replies identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
