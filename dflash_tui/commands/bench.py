"""`dflash-tui bench`: DFlash vs the target alone (mlx_lm.stream_generate), side by side."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from dflash_tui.commands.common import (
    add_block_size_argument,
    add_draft_quant_argument,
    add_model_arguments,
    block_size_from_args,
    check_setting_flags,
    resolve_pair,
)
from dflash_tui.commands.generate import is_utf8
from dflash_tui.errors import UserError
from dflash_tui.files import Refused, check_writable, read_regular_file, write_new_file

ALONE = "bench times the target alone already, next to DFlash"

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
MAX_PROMPTS_BYTES = 16 << 20  # each prompt runs 2 x --runs times: a file near this is no prompts file
MAX_COOLDOWN_S = 3600.0  # an hour between runs; more is a typo


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
    parser.add_argument("--cooldown", default=1.0, metavar="S",
                        help=f"seconds of rest between runs, 0 to {MAX_COOLDOWN_S:g} (default: %(default)s)")
    add_block_size_argument(parser, default="auto", default_text="auto")
    parser.add_argument("--temp", "--temperature", dest="temperature", default=0.0, metavar="T",
                        help="sampling temperature; 0 = greedy (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="also write the JSON report to FILE, a new file (one already there is never replaced)")


def read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts is None:
        if args.prompt is None:
            return [DEFAULT_PROMPT]
        if not is_utf8(args.prompt):  # argv bytes that are not UTF-8 arrive as lone surrogates
            raise UserError("the prompt is not valid UTF-8 text")
        if not args.prompt.strip():
            raise UserError("the prompt is empty")
        return [args.prompt]
    path = args.prompts
    try:  # a regular file of a sane size: a fifo would wait forever, /dev/zero would never end
        text = read_regular_file(path, MAX_PROMPTS_BYTES).decode("utf-8")
    except OSError as exc:
        raise UserError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"prompts file {path} is not UTF-8 text (byte {exc.start})") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                row = json.loads(line)
                prompt = row["prompt"] if isinstance(row, dict) else None
            except (ValueError, KeyError, RecursionError):  # bad JSON, 5000-digit numbers, deep nesting
                prompt = None
            if not isinstance(prompt, str):
                raise UserError(f'{path}:{n}: expected a JSON object with "prompt" (text)')
            if not prompt.strip():
                raise UserError(f"{path}:{n}: the prompt is empty")
            prompts.append(prompt)
        else:
            prompts.append(line)
    if not prompts:
        raise UserError(f"no prompts in {path}")
    return prompts


def cooldown_seconds(value) -> float:
    """--cooldown as seconds: a finite number from 0 to MAX_COOLDOWN_S; a usage error (exit 2) otherwise."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0.0 <= seconds <= MAX_COOLDOWN_S:  # also nan
        raise UserError(f"--cooldown: must be a number of seconds from 0 to {MAX_COOLDOWN_S:g}, got {value}",
                        exit_code=2)
    return seconds


def check_out(path: Path) -> None:
    """Before the benchmark runs: --out must be a new file in a folder that exists and takes files (the
    rules write_new_file applies when the report is written; an hour's run must not end in a refusal)."""
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"--out: {'not a folder' if folder.exists() else 'no such folder'}: {folder}")
    if path.is_dir():
        raise UserError(f"--out: {path} is a folder; name a new file")
    if os.path.lexists(path):
        raise UserError(f"--out: already exists: {path}")
    try:
        check_writable(folder)
    except OSError as exc:
        raise UserError(f"--out: cannot write in {folder}: {exc.strerror or exc}") from None


def write_report(path: Path, text: str) -> None:
    """The JSON report as a new file, whole or not at all (a temp file beside it, removed on failure)."""
    try:
        write_new_file(path, (text + "\n").encode("utf-8"))
    except Refused as exc:  # made or taken while the benchmark ran
        raise UserError(f"--out: {exc}; the report went to standard output only") from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; the report went to standard output only") from None


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
    args.cooldown = cooldown_seconds(args.cooldown)
    block = block_size_from_args(args, ALONE)
    if args.out is not None:
        check_out(args.out)
    texts = read_prompts(args)
    model, draft = resolve_pair(args)
    pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code, draft_quant=args.draft_quant or 0)
    draft_block = pair.draft.config.block_size
    if block is None:
        block = draft_block  # 0: the draft's own, named in the report
    elif isinstance(block, int) and (refused := refusal(block, draft_block)):
        raise UserError(refused, exit_code=2)  # before the baseline runs; a usage error, as generate's
    tok = pair.target.tokenizer
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, enable_thinking=False))
               for t in texts]
    report = bench(pair, prompts, max_tokens=args.max_tokens, runs=args.runs, cooldown=args.cooldown,
                   block_size=block, temperature=args.temperature, texts=texts)
    text = json.dumps(report, indent=2)
    try:
        print(text if args.json else format_table(report))  # first: a report that cannot be saved is not lost
        sys.stdout.flush()
    finally:  # and a reader that left early (`| head`) does not cost the file
        if args.out is not None:
            write_report(args.out, text)
    return 0
