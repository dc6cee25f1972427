"""`dflash-tui generate`: one reply, headless, as text or one JSON object per event."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Optional

from dflash_tui.commands.common import (
    add_distributed_arguments,
    add_draft_quant_argument,
    add_model_arguments,
    add_sampling_arguments,
    block_size_from_args,
    ranks_from_args,
    resolve_pair,
    settings_from_args,
)
from dflash_tui.errors import UserError
from dflash_tui.figure_rules import reply_summary
from dflash_tui.printable import printable

ALONE = "use --baseline for the target alone"

if TYPE_CHECKING:
    from dflash_tui.engine.distributed import Ranks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", metavar="PROMPT", help="the user message ('-' reads standard input)")
    add_model_arguments(parser)
    add_draft_quant_argument(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--baseline", action="store_true", help="target alone, no draft (for A/B)")
    parser.add_argument("--system-prompt", "--system", dest="system", metavar="S", help="a system message")
    parser.add_argument("--no-chat-template", action="store_true", help="send the prompt as raw text")
    parser.add_argument("--json", action="store_true", help="one JSON object per event on stdout")
    add_distributed_arguments(parser)


def run(args: argparse.Namespace) -> int:
    block_size_from_args(args, ALONE)  # before anything loads, on every rank alike
    ranks = ranks_from_args(args)
    if ranks is None:
        return _run(args, ranks)
    try:
        return _run(args, ranks)
    except UserError as exc:
        ranks.failed = True
        if ranks.is_leader:
            raise
        ranks.follower_failed(exc)  # rank 0 says what went wrong


def _run(args: argparse.Namespace, ranks: Optional["Ranks"]) -> int:
    from dflash_tui.engine.conversation import Conversation
    from dflash_tui.engine.events import Block, Done, Error, Prefill, event_to_dict
    from dflash_tui.engine.block_limit import refusal
    from dflash_tui.engine.loading import load_pair

    prompt = strip_one_newline(read_stdin()) if args.prompt == "-" else args.prompt
    for name, text in (("the prompt", prompt), ("--system", args.system or "")):
        if not is_utf8(text):  # argv bytes that are not UTF-8 arrive as lone surrogates
            raise UserError(f"{name} is not valid UTF-8 text")
    if not prompt.strip():
        raise UserError("the prompt is empty")
    settings = settings_from_args(args, baseline=args.baseline)
    model, draft = resolve_pair(args)
    pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code, require_draft=not args.baseline, ranks=ranks,
                     draft_quant=args.draft_quant or 0)
    block = settings.block_size
    if pair.draft is not None and isinstance(block, int) and (refused := refusal(block, pair.draft.config.block_size)):
        raise UserError(refused, exit_code=2)  # a usage error: the flag's value does not fit this draft
    conv = Conversation(pair, system=args.system, use_chat_template=not args.no_chat_template)
    if ranks is not None:
        conv.ranks = ranks
        settings.seed = ranks.shared_seed(settings.seed)  # sampling draws the same on every rank
    quiet = ranks is not None and not ranks.is_leader
    out = open(os.devnull, "w") if quiet else sys.stdout
    err = out if quiet else sys.stderr
    # on a terminal the model's text cannot drive it (ESC, C1 shown as pictures); a pipe or file gets it exact
    shown = printable if out.isatty() else str
    for event in conv.generate(prompt, settings):
        if isinstance(event, Error):
            raise UserError(event.message)
        if args.json:
            data = event_to_dict(event)
            if isinstance(event, Done):
                s = event.stats
                data.update(  # no cycle drafted: no cycle figures (null), as on the closing line
                    tokens_per_cycle=s.get("tokens_per_cycle") if s.get("cycles") else None,
                    acceptance=s.get("acceptance") if s.get("cycles") else None,
                    tok_per_s=s.get("decode_tps"),
                )
            out.write(json.dumps(data) + "\n")
            out.flush()
        elif isinstance(event, Block):
            out.write(shown(event.text))
            out.flush()
        elif isinstance(event, Done):
            out.write("\n")
            print(figures_line(event), file=err)
        elif isinstance(event, Prefill):
            pass
    return 0


def figures_line(done) -> str:
    """The closing line on stderr: the reply's figures in the chat's words (figure_rules.reply_summary;
    "target only" where no cycle drafted), then the ranks where several ran."""
    parts = [reply_summary(done)]
    s = done.stats
    if "ranks" in s:  # sync: the turn's sync_ms over its agreement checks (each cycle's, and the first token's),
        # the mean time of one check, as the meter shows it
        checks = s.get("agreement_checks") or 0
        sync = s.get("sync_ms", 0.0) / checks if checks else 0.0
        parts.append(f"{s['ranks']} ranks {s['parallel']} parallel · sync {sync:.2f} ms/cycle")
    return f"[{' · '.join(parts)}]"


def strip_one_newline(text: str) -> str:
    """`echo TEXT |` adds a line end the same TEXT as an argument does not have: drop that one."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


MAX_PROMPT_BYTES = 16 << 20  # several times the text of the longest context any model here takes


def read_stdin() -> str:
    """Standard input as UTF-8 text; one clear error for anything else (endless input included)."""
    stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
    raw = stream.read(MAX_PROMPT_BYTES + 1) if stream is not None else \
        sys.stdin.read(MAX_PROMPT_BYTES + 1).encode("utf-8", "surrogateescape")
    if len(raw) > MAX_PROMPT_BYTES:
        raise UserError(f"standard input goes past {MAX_PROMPT_BYTES >> 20} MiB: more text than any context holds")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"standard input is not UTF-8 text (byte {exc.start})") from None


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
