"""Arguments and helpers shared by the commands that load a model pair."""

from __future__ import annotations

import argparse
import math
from typing import Optional, Union

from dflash_tui.errors import UserError

# --block-size of chat, generate, bench and serve: one rule (config.toml's and chat's), one message
BLOCK_SIZE_RULE = "a block size is auto, 0 (the draft's own) or a number from 2 up to the draft's own"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", "-m", metavar="M", help="target: a local mlx-lm model directory or a hub repo id")
    g.add_argument("--draft", "-d", metavar="D", help="DFlash draft: a local directory or a hub repo id (default: the known draft for --model)")
    g.add_argument("--demo", action="store_true", help="use the bundled offline demo pair")
    g.add_argument("--trust-remote-code", action="store_true", help="allow model code shipped with a checkpoint to run")


def add_draft_quant_argument(parser: argparse.ArgumentParser) -> None:
    """--draft-quant, for the commands that load a draft."""
    parser.add_argument("--draft-quant", type=_draft_quant, default=None, metavar="BITS",
                        help="quantize the draft's linear layers to 4 or 8 bits at load (0: as shipped); "
                             "output is unchanged, acceptance may drop")


def _draft_quant(text: str) -> int:
    if text.strip() not in ("0", "4", "8"):
        raise argparse.ArgumentTypeError(f"draft quantization is 4 or 8 bits (0: none), not {text!r}")
    return int(text)


# the decoding flags of chat, generate and bench: argparse dest -> (the flag named in a refusal, config.toml's key)
SETTING_FLAGS: dict[str, tuple[str, str]] = {
    "temp": ("--temp", "temperature"),  # chat's dest
    "temperature": ("--temp", "temperature"),  # generate's and bench's
    "top_p": ("--top-p", "top_p"),
    "top_k": ("--top-k", "top_k"),
    "min_p": ("--min-p", "min_p"),
    "max_tokens": ("--max-tokens", "max_tokens"),
    "seed": ("--seed", "seed"),
}


def check_setting_flags(args: argparse.Namespace) -> None:
    """One rule for a setting everywhere: a decoding flag given is checked by the validator /temp, /top-p…
    and config.toml use (config.VALIDATORS) and replaced by its value; a refused one is one line naming the
    flag and its range, exit 2 (as argparse's errors). Checked values pass again unchanged."""
    from dflash_tui.config import VALIDATORS, BadValue

    for dest, (flag, key) in SETTING_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        try:
            setattr(args, dest, VALIDATORS[key](value))
        except BadValue as exc:
            message = str(exc)
            if not message.startswith("must be"):  # not a number: name the range as well
                message += _setting_range(VALIDATORS[key])
            raise UserError(f"{flag}: {message}", exit_code=2) from None


def _setting_range(check) -> str:
    """The range a config validator takes, in its own words, as '; must be between 1 and 1000000' (what it
    says of a number below every range: the limits live in config.py only); '' where it says none."""
    from dflash_tui.config import BadValue

    try:
        check(-(10**30))
    except BadValue as exc:
        text = str(exc)
        return "; " + text.rsplit(", got ", 1)[0] if text.startswith("must be") else ""
    return ""


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """generate's decoding flags: text here, checked by `check_setting_flags` before the command runs."""
    g = parser.add_argument_group("decoding")
    g.add_argument("--max-tokens", default=512, metavar="N", help="longest reply, in tokens (default: %(default)s)")
    add_block_size_argument(g, default=None, default_text="0, the draft's own")
    g.add_argument("--temp", "--temperature", dest="temperature", default=0.0, metavar="T",
                   help="sampling temperature; 0 = greedy (default: %(default)s)")
    g.add_argument("--top-p", default=1.0, metavar="P",
                   help="nucleus sampling: the top tokens up to probability P (default: %(default)s = off)")
    g.add_argument("--top-k", default=0, metavar="K",
                   help="sample from the K likeliest tokens (default: %(default)s = off)")
    g.add_argument("--min-p", default=0.0, metavar="P",
                   help="drop tokens less likely than P times the likeliest (default: %(default)s = off)")
    g.add_argument("--seed", default=-1, metavar="S",
                   help="fix the sampling seed, so a sampled reply can be redone (default: %(default)s = none)")


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("several machines (run under mlx.launch)")
    g.add_argument("--distributed", action="store_true",
                   help="shard the target over the ranks mlx.launch started (tensor parallel); rank 0 prints")
    g.add_argument("--pipeline", action="store_true",
                   help="with --distributed: pipeline parallel (each rank holds a run of layers) where mlx-lm has it")
    g.add_argument("--rank-timeout", type=float, default=120.0, metavar="S",
                   help="stop when the ranks make no progress for S seconds (default 120; 0: never)")


def ranks_from_args(args: argparse.Namespace):
    """The Ranks of a --distributed run (watchdog started), or None."""
    timeout = getattr(args, "rank_timeout", 0.0)
    if not (math.isfinite(timeout) and timeout >= 0):  # a usage error, as argparse's
        raise UserError(f"--rank-timeout: seconds, 0 or more (0: never), got {timeout}", exit_code=2)
    if not getattr(args, "distributed", False):
        if getattr(args, "pipeline", False):
            raise UserError("--pipeline needs --distributed (under mlx.launch)", exit_code=2)
        return None
    from dflash_tui.engine.distributed import Ranks, init_group

    ranks = Ranks(init_group(), kind="pipeline" if args.pipeline else "tensor", timeout_s=args.rank_timeout)
    ranks.start_watchdog()
    ranks.stop_on_sigterm()
    ranks.beat(grace=10 * args.rank_timeout)  # loading too: a rank that never loads must not hang the others
    return ranks


def add_block_size_argument(parser: "argparse._ActionsContainer", default: Optional[str], default_text: str) -> None:
    """--block-size as text; `block_size_from_args` checks it when the command runs (one line, no usage)."""
    parser.add_argument("--block-size", default=default, metavar="B",
                        help=f"auto (adaptive), 0 (the draft's own) or N from 2 up to the draft's own "
                             f"(default: {default_text})")


def block_size_problem(text: Union[str, int], alone: str, own: int = 0) -> Optional[str]:
    """Why `text` is not a block size by the one rule (the rule, naming the draft's `own` size where it is
    known; for 1, also `alone`: where this command runs the target alone), or None where it is one."""
    from dflash_tui.config import VALIDATORS, BadValue

    try:
        VALIDATORS["block_size"](text)
        return None
    except BadValue:
        try:
            one = int(str(text).strip()) == 1
        except ValueError:
            one = False
        return BLOCK_SIZE_RULE + (f" ({own})" if own else "") + (f"; 1 drafts nothing: {alone}" if one else "")


def parse_block_size(text: Union[str, int, None], alone: str) -> Union[int, str, None]:
    """The rule chat and config.toml apply: "auto", 0 (the draft's own: None) or 2..; the draft's own limit
    is checked once it is loaded (`block_limit.refusal`). `alone`: where this command runs the target alone."""
    if text is None:
        return None
    problem = block_size_problem(text, alone)
    if problem:
        raise UserError(f"--block-size {text}: {problem}", exit_code=2)  # a usage error, as the other flags
    from dflash_tui.config import VALIDATORS

    value = VALIDATORS["block_size"](text)
    return None if value == 0 else value


def block_size_from_args(args: argparse.Namespace, alone: str) -> Union[int, str, None]:
    """Check --block-size and put the engine's value in `args.block_size` (None: the draft's own)."""
    args.block_size = parse_block_size(args.block_size, alone)
    return args.block_size


def _block_size(text: str):
    """An argparse type for bench.exactness's list of block sizes; the commands use `parse_block_size`."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"block size must be an integer or 'auto', not {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError("block size must be between 1 and 64")
    return value


def resolve_pair(args: argparse.Namespace) -> tuple[str, Optional[str]]:
    """(target, draft) named by --model/--draft/--demo; the demo pair when nothing is named."""
    if args.demo or not args.model:
        if args.model or args.draft:
            if args.demo:
                raise UserError("--demo cannot be combined with --model/--draft")
            raise UserError("--draft needs --model")
        try:
            from dflash_tui.demo import demo_draft_path, demo_target_path
        except ImportError:
            raise UserError("the demo pair is not part of this install; pass --model") from None
        return str(demo_target_path()), str(demo_draft_path())
    return args.model, args.draft


def settings_from_args(args: argparse.Namespace, **extra):
    from dflash_tui.engine.conversation import GenerationSettings

    check_setting_flags(args)  # done already by cli.main; a namespace built elsewhere gets the same rule
    block = args.block_size
    kwargs = dict(
        max_tokens=args.max_tokens,
        block_size=block,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=None if args.seed is None or args.seed < 0 else args.seed,  # -1: none, as in config.toml
    )
    kwargs.update(extra)
    return GenerationSettings(**kwargs)
