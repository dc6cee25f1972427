"""`dflash-tui generate`: one reply, headless, as text or one JSON object per event."""

from __future__ import annotations

import argparse
import json
import sys

from dflash_tui.commands.common import add_model_arguments, add_sampling_arguments, resolve_pair, settings_from_args
from dflash_tui.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", metavar="PROMPT", help="the user message ('-' reads standard input)")
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--baseline", action="store_true", help="target alone, no draft (for A/B)")
    parser.add_argument("--system", metavar="S", help="a system message")
    parser.add_argument("--no-chat-template", action="store_true", help="send the prompt as raw text")
    parser.add_argument("--json", action="store_true", help="one JSON object per event on stdout")


def run(args: argparse.Namespace) -> int:
    from dflash_tui.engine.conversation import Conversation
    from dflash_tui.engine.events import Block, Done, Error, Prefill, event_to_dict
    from dflash_tui.engine.loading import load_pair

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise UserError("the prompt is empty")
    settings = settings_from_args(args, baseline=args.baseline)
    model, draft = resolve_pair(args)
    pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code, require_draft=not args.baseline)
    conv = Conversation(pair, system=args.system, use_chat_template=not args.no_chat_template)
    out = sys.stdout
    for event in conv.generate(prompt, settings):
        if isinstance(event, Error):
            raise UserError(event.message)
        if args.json:
            data = event_to_dict(event)
            if isinstance(event, Done):
                s = event.stats
                data.update(
                    tokens_per_cycle=s.get("tokens_per_cycle"),
                    acceptance=s.get("acceptance"),
                    tok_per_s=s.get("decode_tps"),
                )
            out.write(json.dumps(data) + "\n")
            out.flush()
        elif isinstance(event, Block):
            out.write(event.text)
            out.flush()
        elif isinstance(event, Done):
            out.write("\n")
            s = event.stats
            print(
                f"[{s['generated_tokens']} tokens, {s['decode_tps']:.1f} tok/s, "
                f"{s['tokens_per_cycle']:.2f} tokens/cycle, acceptance {s['acceptance']:.0%}, {event.finish_reason}]",
                file=sys.stderr,
            )
        elif isinstance(event, Prefill):
            pass
    return 0
