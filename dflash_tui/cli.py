"""Entry point `dflash-tui` and its subcommands.

Each subcommand lives in `dflash_tui/commands/<name>.py` with
`add_arguments(parser)` and `run(args) -> int`. Imports are lazy so that
`dflash-tui --help` and replay never pay for loading MLX models.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

from dflash_tui import __version__
from dflash_tui.errors import UserError
from dflash_tui.printable import one_line

BROKEN_PIPE_EXIT = 141  # what a shell reports for a command ended by SIGPIPE (128 + 13)

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "chat": ("dflash_tui.commands.chat", "chat in the terminal UI (the default)"),
    "generate": ("dflash_tui.commands.generate", "generate one reply headlessly"),
    "bench": ("dflash_tui.commands.bench", "DFlash vs the target alone, side by side"),
    "replay": ("dflash_tui.commands.replay", "replay a saved session's acceptance trace"),
    "sessions": ("dflash_tui.commands.sessions", "list, show, export or delete saved sessions"),
    "train-draft": ("dflash_tui.commands.train_draft", "train a DFlash draft for a target"),
    "doctor": ("dflash_tui.commands.doctor", "which draft a model gets, whether the pair fits, and in how much memory"),
    "serve": ("dflash_tui.commands.serve", "an OpenAI-compatible HTTP server with per-request DFlash figures"),
}
# the commands whose decoding flags (--temp, --max-tokens…) take what /temp, /max-tokens… and config.toml take
SETTING_COMMANDS = ("chat", "generate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-tui",
        description="Chat with a local LLM on MLX and watch DFlash speculative decoding work.",
    )
    parser.add_argument("--version", action="version", version=f"dflash-tui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            importlib.import_module(module).add_arguments(p)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            p.set_defaults(_missing=True)
        p.set_defaults(_module=module)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    # transformers warns on stderr about prompts past its tokenizer's length before the engine's own
    # one-line check can speak; the errors it has stay
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        try:
            return _main(argv)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except BrokenPipeError:  # `dflash-tui sessions list | head`: the reader left early
        _drop_stdout()
        print("dflash-tui: output closed early (broken pipe)", file=sys.stderr)
        return BROKEN_PIPE_EXIT


def _main(argv: Optional[Sequence[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # bare `dflash-tui [--model M ...]` is chat
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["chat", *argv]
    args = parser.parse_args(argv)
    if getattr(args, "_missing", False):
        print(f"dflash-tui: '{args.command}' is not available in this build", file=sys.stderr)
        return 2
    try:
        if args.command in SETTING_COMMANDS:
            from dflash_tui.commands.common import check_setting_flags

            check_setting_flags(args)  # before anything loads: a refused value is one line, exit 2
        return int(importlib.import_module(args._module).run(args) or 0)
    except UserError as exc:
        print(f"dflash-tui: {one_line(str(exc))}", file=sys.stderr)  # file names and data in it stay inert
        return exc.exit_code
    except KeyboardInterrupt:
        print("dflash-tui: interrupted", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not fail again on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file (a test's capture): nothing to flush
        pass
