"""`dflash-tui` (chat): the terminal UI."""

from __future__ import annotations

import argparse
from typing import Optional

from dflash_tui.commands.common import add_draft_quant_argument, add_model_arguments
from dflash_tui.errors import UserError


# flag -> Config key; values are checked as config.toml's are (one message for a bad one)
DECODING_FLAGS: dict[str, str] = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_tokens": "max_tokens",
    "seed": "seed",
    "block_size": "block_size",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_draft_quant_argument(parser)
    g = parser.add_argument_group("decoding (for this run; config.toml's values otherwise)")
    g.add_argument("--temp", "--temperature", dest="temp", metavar="T", help="sampling temperature; 0 = greedy")
    g.add_argument("--top-p", metavar="P", help="nucleus sampling: the top tokens up to probability P (1 = off)")
    g.add_argument("--top-k", metavar="K", help="sample from the K likeliest tokens (0 = off)")
    g.add_argument("--min-p", metavar="P", help="drop tokens less likely than P times the likeliest (0 = off)")
    g.add_argument("--max-tokens", metavar="N", help="longest reply, in tokens")
    g.add_argument("--seed", metavar="S", help="fix the sampling seed (-1 = none)")
    g.add_argument("--block-size", metavar="B",
                   help="auto (adaptive, the default; the demo pair drafts its own), 0 (the draft's own) or N from 2 "
                        "up to the draft's own")
    r = parser.add_argument_group("remote engine")
    r.add_argument("--remote", metavar="URL",
                   help="chat with an OpenAI-compatible server instead (dflash-tui serve, vLLM, SGLang, mlx_lm.server, "
                        "Ollama…); --model then names the server's model")
    r.add_argument("--api-key", metavar="KEY", help="the server's API key (or api_key in config.toml)")
    parser.add_argument("--system-prompt", "--system", dest="system", metavar="S", help="a system prompt for this run")
    parser.add_argument("--theme", metavar="NAME", help="a theme for this run (the one in config.toml otherwise)")
    parser.add_argument("--no-probe", action="store_true",
                        help="skip the short target-only run after load (the meter then shows no speedup until a /baseline turn)")


def _pair(args: argparse.Namespace, configured: str) -> tuple[Optional[str], Optional[str]]:
    if args.demo:
        if args.model or args.draft:
            raise UserError("--demo cannot be combined with --model/--draft")
        return _demo()
    if args.draft and not args.model:
        raise UserError("--draft needs --model")
    if args.model:
        return args.model, args.draft
    if configured:
        return None, None  # the app takes the pair from config.toml
    try:
        return _demo()
    except UserError:
        return None, None  # the app opens the model picker


def _remote(args: argparse.Namespace, config):
    """The RemoteTarget to chat with: --remote, else config.toml's `remote` unless a local pair is named."""
    url = getattr(args, "remote", None) or (config.remote if not (args.model or args.demo) else "")
    if not url:
        if getattr(args, "api_key", None):
            raise UserError("--api-key needs --remote URL (or remote in config.toml)")
        return None
    if args.demo or args.draft:
        raise UserError("--remote cannot be combined with --demo or --draft: the server has its own pair")
    from dflash_tui.remote.client import RemoteTarget, normalize_url

    try:
        url = normalize_url(url)
    except ValueError as exc:
        raise UserError(f"--remote: {exc}") from None
    return RemoteTarget(url, getattr(args, "api_key", None) or config.api_key or None, args.model or None)


def _demo() -> tuple[str, str]:
    try:
        from dflash_tui.demo import demo_draft_path, demo_target_path
    except ImportError:
        raise UserError("the demo pair is not part of this install; pass --model") from None
    return str(demo_target_path()), str(demo_draft_path())


def run(args: argparse.Namespace) -> int:
    import sys

    from dflash_tui.config import load_config
    from dflash_tui.ui.app import DFlashApp

    loaded = load_config()
    remote = _remote(args, loaded.config)
    model, draft = (None, None) if remote is not None else _pair(args, loaded.config.model)
    apply_flags(args, loaded)
    if args.system is not None:
        loaded.config.system = args.system
    if getattr(args, "draft_quant", None) is not None:
        loaded.config.draft_quant = args.draft_quant  # this run only
    app = DFlashApp(
        model=model,
        draft=draft,
        trust_remote_code=True if args.trust_remote_code else None,
        config=loaded,
        probe_tokens=0 if args.no_probe else None,
        remote=remote,
        theme=args.theme,
    )
    # the engine thread drops the GIL at every MLX eval; a short switch interval hands it back
    # quickly while the UI thread renders, instead of the default 5 ms per hand-over
    sys.setswitchinterval(0.001)
    return run_to_the_end(app)


def apply_flags(args: argparse.Namespace, loaded) -> None:
    """Put the decoding flags given into `loaded.config` (this run only: the file is not written)."""
    from dflash_tui.config import VALIDATORS, BadValue

    for flag, key in DECODING_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        try:
            setattr(loaded.config, key, VALIDATORS[key](value))
        except BadValue as exc:
            raise UserError(f"--{flag.replace('_', '-')}: {exc}", exit_code=2) from None  # a usage error, as argparse's
        loaded.given.add(key)


def run_to_the_end(app, **run_kwargs) -> int:
    """Run the app; once it has quit, the process ends, even with the engine thread still inside a
    load or a long MLX call (Python would otherwise wait for it behind a blank screen)."""
    import os
    import sys

    app.run(**run_kwargs)
    code = app.return_code or 0
    if app.engine.alive:
        print("dflash-tui: the engine was still busy; quit without waiting for it", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: MLX is never torn down under a running thread
    return code
