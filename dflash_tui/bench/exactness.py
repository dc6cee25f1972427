"""Benchmark (not a test): how often greedy DFlash output equals vanilla mlx-lm, token for token.

For each prompt, the reference is `mlx_lm.stream_generate` on a separate
`mlx_lm.load` of the target (what a user would run instead); DFlash runs
through the engine at each block size asked for. On MLX's CPU backend the two
are equal by construction (the tests check it); on a GPU in bf16 a many-row
verify may round a near-tie differently from a one-row decode step, and this
counts how often that changes a reply, and where.

    python -m dflash_tui.bench.exactness --demo --prompts dflash_tui/demo/heldout_prompts.jsonl \\
        --max-tokens 256 --block-size 4 8 16 auto --json

`--shape NAME` (cycle_cost's shapes) runs a random-weight pair of a real model's
shape instead, on `--random-prompts` prompts of `--prompt-tokens` random ids; the
reference is a second, equal instance of the same random target.

    python -m dflash_tui.bench.exactness --shape qwen3-4b qwen3-8b-4bit --random-prompts 4 --block-size 4 8 16 auto

`--verify batched steps` counts both ways of computing a verify in one run: its rows
together (MLX's many-row kernels, the engine's way) and as the decode steps compute them
(engine/step_rows.py; on MLX CUDA only, elsewhere the two are the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Union

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.compare import fresh_turn
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.loading import Pair, load_pair
from dflash_tui.engine.target import finish_stream_generate


@dataclass
class Comparison:
    verify: str  # "steps" or "batched"
    prompt: int
    block_size: Union[int, str]  # "-" for the reference run again
    tokens: int  # the reference's length
    identical: bool
    first_difference: Optional[int]  # index of the first differing token, None when identical


def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def vanilla_tokens(model: Any, tokenizer: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of `mlx_lm.stream_generate` (the EOS excluded, as it reports them)."""
    import mlx_lm

    out = []
    for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        if r.finish_reason == "stop":
            break
        out.append(r.token)
    finish_stream_generate()
    return out


def _reported(row: Comparison) -> Comparison:
    """Each comparison on stderr as it completes: a run cut short keeps what it measured."""
    print(json.dumps(asdict(row)), file=sys.stderr, flush=True)
    return row


def compare(pair: Pair, vanilla: tuple[Any, Any], prompts: list[list[int]], max_tokens: int,
            block_sizes: list[Union[int, str]], verifies: tuple[str, ...] = ("batched",),
            reference_twice: bool = False) -> list[Comparison]:
    conv = Conversation(pair)
    rows = []
    before = pair.target.step_rows
    for i, prompt in enumerate(prompts):
        ref = vanilla_tokens(*vanilla, prompt, max_tokens)
        if reference_twice:  # is the reference itself a function of its input on this device?
            again = first_difference(ref, vanilla_tokens(*vanilla, prompt, max_tokens))
            rows.append(_reported(Comparison("vanilla again", i, "-", len(ref), again is None, again)))
        for verify in verifies:
            pair.target.use_step_rows(verify == "steps")
            for b in block_sizes:
                done = fresh_turn(conv, prompt, GenerationSettings(max_tokens=max_tokens, block_size=b))[-1]
                diff = first_difference(ref, done.tokens)
                rows.append(_reported(Comparison(verify, i, b, len(ref), diff is None, diff)))
    pair.target.use_step_rows(before)
    return rows


def random_shape_rows(shape: str, count: int, prompt_tokens: int, max_tokens: int,
                      block_sizes: list[Union[int, str]], dtype: mx.Dtype,
                      verifies: tuple[str, ...] = ("batched",), reference_twice: bool = False) -> list[Comparison]:
    """`compare` on a random-weight pair of `shape` against a second, equal instance of its target."""
    from dflash_tui.bench.cycle_cost import build, random_prompt, target_model
    from dflash_tui.bench.references import tokenizer_for

    target, draft = build(shape, 5, dtype)
    target.tokenizer = tokenizer_for()
    vanilla = target_model(shape, dtype)[0]
    mx.random.seed(7)
    prompts = [random_prompt(target.vocab_size, prompt_tokens) for _ in range(count)]
    return compare(Pair(target, draft, shape, shape), (vanilla, target.tokenizer), prompts, max_tokens, block_sizes,
                   verifies, reference_twice)


def summary(rows: list[Comparison]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(f"{r.verify} {r.block_size}", {"identical": 0, "prompts": 0, "first_differences": []})
        s["prompts"] += 1
        s["identical"] += r.identical
        if not r.identical:
            s["first_differences"].append(r.first_difference)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    import mlx_lm

    from dflash_tui.bench.cycle_cost import SHAPES
    from dflash_tui.commands.bench import read_prompts
    from dflash_tui.commands.common import _block_size, add_model_arguments, resolve_pair

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--prompts", type=Path, default=None, metavar="FILE", help="one request per line, or JSONL")
    p.add_argument("--prompt", default=None)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--block-size", type=_block_size, nargs="+", default=[16])
    p.add_argument("--shape", nargs="+", default=None, choices=sorted(SHAPES),
                   help="random-weight pairs of these shapes (cycle_cost's)")
    p.add_argument("--random-prompts", type=int, default=4, help="with --shape: prompts per shape")
    p.add_argument("--prompt-tokens", type=int, default=64, help="with --shape: tokens per prompt")
    p.add_argument("--verify", nargs="+", choices=["batched", "steps"], default=["batched"],
                   help="a verify's rows together (the engine's way) and/or as decode steps (MLX CUDA)")
    p.add_argument("--reference-twice", action="store_true",
                   help="also run vanilla mlx-lm a second time on each prompt: is the reference repeatable?")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    require_at_least(p, args, {"max_tokens": 1, "random_prompts": 1, "prompt_tokens": 1})
    if args.shape:
        reports = {shape: summary(random_shape_rows(shape, args.random_prompts, args.prompt_tokens, args.max_tokens,
                                                    args.block_size, mx.bfloat16, tuple(args.verify),
                                                    args.reference_twice))
                   for shape in args.shape}
        print(json.dumps({"device": str(mx.default_device()), "max_tokens": args.max_tokens, "summary": reports},
                         indent=2))
        return 0
    texts = read_prompts(args)
    model, draft = resolve_pair(args)
    pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code)
    vanilla = mlx_lm.load(model)[:2]  # a second, untouched instance
    tok = pair.target.tokenizer
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                            enable_thinking=False)) for t in texts]
    rows = compare(pair, vanilla, prompts, args.max_tokens, args.block_size, tuple(args.verify),
                   args.reference_twice)
    report = {"device": str(mx.default_device()), "dtype": str(pair.target.dtype), "attention": pair.target.attention_mode,
              "step_rows": pair.target.step_rows,
              "max_tokens": args.max_tokens, "summary": summary(rows), "rows": [asdict(r) for r in rows]}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for b, s in report["summary"].items():
            print(f"{b}: {s['identical']}/{s['prompts']} identical; first differences at {s['first_differences']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
