"""`dflash-tui bench`: DFlash vs the target alone (mlx_lm.stream_generate), side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash_tui.commands.common import (
    add_block_size_argument,
    add_draft_quant_argument,
    add_model_arguments,
    block_size_from_args,
    check_setting_flags,
    resolve_pair,
)
from dflash_tui.errors import UserError

ALONE = "bench times the target alone already, next to DFlash"

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_draft_quant_argument(parser)
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", "-p", help="a user message (default: a short coding request)")
    src.add_argument("--prompts", type=Path, metavar="FILE", help="one user message per line, or JSONL with a 'prompt' field")
    parser.add_argument("--max-tokens", default=256, metavar="N",
                        help="longest reply of each run, in tokens; at least 2 (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, metavar="N",
                        help="runs per prompt; the median is reported (default: %(default)s)")
    parser.add_argument("--cooldown", type=float, default=1.0, metavar="S",
                        help="seconds of rest between runs (default: %(default)s)")
    add_block_size_argument(parser, default="auto", default_text="auto")
    parser.add_argument("--temp", "--temperature", dest="temperature", default=0.0, metavar="T",
                        help="sampling temperature; 0 = greedy (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the JSON report here")


def read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts is None:
        return [args.prompt or DEFAULT_PROMPT]
    try:
        lines = [line.strip() for line in args.prompts.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise UserError(f"cannot read prompts file {args.prompts}: {exc.strerror}") from None
    prompts = []
    for line in lines:
        if line.startswith("{"):
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(f"bad JSONL line in {args.prompts}: {line[:60]}") from None
        else:
            prompts.append(line)
    if not prompts:
        raise UserError(f"no prompts in {args.prompts}")
    return prompts


def run(args: argparse.Namespace) -> int:
    from dflash_tui.bench.compare import bench, format_table
    from dflash_tui.engine.block_limit import refusal
    from dflash_tui.engine.loading import load_pair

    check_setting_flags(args)  # done already by cli.main: --max-tokens and --temp take what config.toml takes
    if args.max_tokens < 2:  # bench's own floor: its tok/s counts the tokens after the first
        raise UserError(f"--max-tokens: bench needs 2 or more (its tok/s counts the tokens after the first), got {args.max_tokens}",
                        exit_code=2)
    if args.runs < 1:
        raise UserError(f"--runs: must be at least 1, got {args.runs}", exit_code=2)
    block = block_size_from_args(args, ALONE)
    texts = read_prompts(args)
    model, draft = resolve_pair(args)
    pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code, draft_quant=args.draft_quant or 0)
    draft_block = pair.draft.config.block_size
    if block is None:
        block = draft_block  # 0: the draft's own, named in the report
    elif isinstance(block, int) and (refused := refusal(block, draft_block)):
        raise UserError(refused)  # before the baseline runs, not after
    tok = pair.target.tokenizer
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, enable_thinking=False))
               for t in texts]
    report = bench(pair, prompts, max_tokens=args.max_tokens, runs=args.runs, cooldown=args.cooldown,
                   block_size=block, temperature=args.temperature)
    text = json.dumps(report, indent=2)
    if args.out:
        try:
            args.out.write_text(text + "\n")
        except OSError as exc:
            raise UserError(f"cannot write {args.out}: {exc.strerror}") from None
    print(text if args.json else format_table(report))
    return 0
