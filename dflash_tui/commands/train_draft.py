"""`dflash-tui train-draft`: train a DFlash draft for a target with MLX."""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Optional

from dflash_tui.errors import UserError

MAX_SEED = 2**31 - 1  # config.toml's and generate's seeds go as high
MAX_BLOCK = 256  # the engine decodes blocks up to this (--block-size of chat, generate, bench)
MAX_STATE_BYTES = 1 << 20  # trainer_state/state.json: a few lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, metavar="M", help="target: a local mlx-lm model directory or a hub repo id")
    parser.add_argument("--prompts", required=True, type=Path, metavar="FILE.jsonl",
                        help='one JSON object a line: {"prompt": ...} or {"messages": [...]}; replies are regenerated')
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="where the draft checkpoint goes: a new or empty folder (see --force, --resume)")
    parser.add_argument("--force", action="store_true",
                        help="replace the model or run already in --out (its config.json, weights and trainer_state/; "
                             "nothing else there)")
    parser.add_argument("--layers", type=int, default=2, metavar="N", help="draft layers (default 2)")
    parser.add_argument("--block-size", type=int, default=16, metavar="B", help=f"2 to {MAX_BLOCK} (default 16)")
    parser.add_argument("--target-layers", type=int, nargs="+", metavar="ID", help="target layer ids to capture")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, metavar="N", help="training steps, 1 or more")
    length.add_argument("--epochs", type=float, metavar="E", help="passes over the data, above 0")
    parser.add_argument("--seconds", type=float, metavar="S", help="a wall-clock budget for training (the schedule fits it)")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=32, metavar="K", help="blocks per sequence per step")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=384, help="longest regenerated reply")
    parser.add_argument("--gamma", type=float, help="position-weight decay (default 7 for blocks of 16)")
    parser.add_argument("--init", default="copy", metavar="copy|random|DIR",
                        help="start from the target's last layers (copy), at random, or from a saved draft DIR")
    parser.add_argument("--mask-token-id", type=int, help="default: the tokenizer's <|mask|>")
    parser.add_argument("--checkpoint-every", type=int, default=500, metavar="N", help="0: only at the end")
    parser.add_argument("--eval-prompts", type=int, default=8, metavar="N", help="held out from FILE for the final tokens-per-cycle check")
    parser.add_argument("--eval-max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help=f"0 to {MAX_SEED}")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--no-compile", action="store_true", help="run the steps uncompiled")


# the numeric flags: dest -> (lowest, highest) for whole numbers; floats are finite and above 0
_WHOLE: dict[str, tuple[int, Optional[int]]] = {
    "layers": (1, None),
    "block_size": (2, MAX_BLOCK),
    "steps": (1, None),
    "batch_size": (1, None),
    "anchors": (1, None),
    "seq_len": (1, None),
    "max_new_tokens": (1, None),
    "mask_token_id": (0, None),
    "checkpoint_every": (0, None),
    "eval_prompts": (0, None),
    "eval_max_tokens": (1, None),
    "seed": (0, MAX_SEED),
}
_POSITIVE = ("epochs", "seconds", "lr", "gamma")


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag in its range, before anything is read or loaded: one line naming the flag, exit 2
    (a usage error, as argparse's own)."""
    def refuse(dest: str, message: str) -> None:
        raise UserError(f"--{dest.replace('_', '-')}: {message}", exit_code=2)

    for dest, (lo, hi) in _WHOLE.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if value < lo or (hi is not None and value > hi):
            refuse(dest, f"must be {f'between {lo} and {hi}' if hi is not None else f'at least {lo}'}, got {value}")
    for dest in _POSITIVE:
        value = getattr(args, dest)
        if value is not None and not (math.isfinite(value) and value > 0):
            refuse(dest, f"must be a finite number above 0, got {value:g}")
    ids = args.target_layers or []
    if any(i < 0 for i in ids):
        refuse("target_layers", f"layer ids are 0 or more, got {min(ids)}")
    if len(set(ids)) < len(ids):
        refuse("target_layers", "each layer once, got " + " ".join(map(str, ids)))


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    check_out(args.out, args.target, force=args.force, resume=args.resume, steps=args.steps)

    from dflash_tui.engine.loading import load_target
    from dflash_tui.training.prompts import read_prompts
    from dflash_tui.training.trainer import TrainConfig, finite_or_none, train_draft

    convs = read_prompts(args.prompts)
    make_out(args.out)  # after the checks, so a refused run leaves no folder behind
    random.Random(args.seed).shuffle(convs)
    n_eval = min(args.eval_prompts, len(convs) - 1)
    evals, train = convs[:n_eval], convs[n_eval:]
    cfg = TrainConfig(layers=args.layers, block_size=args.block_size, target_layer_ids=args.target_layers,
                      steps=args.steps, epochs=args.epochs, seconds=args.seconds, lr=args.lr,
                      batch_size=args.batch_size, anchors=args.anchors, seq_len=args.seq_len,
                      max_new_tokens=args.max_new_tokens, gamma=args.gamma, checkpoint_every=args.checkpoint_every,
                      seed=args.seed, init=args.init, mask_token_id=args.mask_token_id,
                      eval_max_tokens=args.eval_max_tokens, compile=not args.no_compile)
    target = load_target(args.target)
    try:
        metrics = train_draft(target, train, args.out, cfg, eval_prompts=evals, resume=args.resume)
    except OSError as exc:  # a full disk mid-run: the last checkpoint saved whole stays (trainer.staged_checkpoint)
        raise UserError(f"could not save to --out {args.out}: {exc.strerror or exc}") from None
    summary = {"out": str(args.out), "steps": metrics["train"]["steps"], "final_loss": metrics["train"]["final_loss"]}
    if "eval" in metrics:
        summary["mean_tokens_per_cycle"] = metrics["eval"]["mean_tokens_per_cycle"]
    print(json.dumps(finite_or_none(summary), allow_nan=False))  # a loss that is no number is null: valid JSON
    return 0


def check_out(out: Path, target: str, force: bool, resume: bool, steps: Optional[int] = None) -> None:
    """Refuse an --out that would destroy a model (the target itself, a folder that holds one) or be written
    into among a user's other files; nothing is created here."""
    from dflash_tui.engine.checkpoint import holds_model
    from dflash_tui.training.trainer import STATE_DIR

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    target_dir = Path(target).expanduser()
    if target_dir.exists() and out.exists() and out.resolve() == target_dir.resolve():
        raise UserError(f"--out {out} is the target's own folder; the draft needs a folder of its own")
    if resume:
        if not (out / STATE_DIR / "sequences.npz").is_file():
            raise UserError(f"nothing to resume in {out} (no {STATE_DIR}/sequences.npz)")
        done = _steps_done(out / STATE_DIR / "state.json")
        if steps is not None and done is not None and steps <= done:
            raise UserError(f"--steps: the run in {out} has done {done} steps already; ask for more to go on "
                            f"from there, got {steps}", exit_code=2)
        return
    if not out.is_dir():
        return
    if holds_model(out):
        if not force:
            raise UserError(f"--out {out} already holds a model (config.json or weights); pick a new folder, "
                            "--resume a run there, or pass --force to replace it")
        return
    try:
        names = sorted(p.name for p in out.iterdir())
        run_there = (out / STATE_DIR).is_dir() and any((out / STATE_DIR).iterdir())
    except OSError as exc:
        raise UserError(f"cannot read --out {out}: {exc.strerror or exc}") from None
    if run_there:
        if not force:
            raise UserError(f"--out {out} already holds a training run ({STATE_DIR}/); --resume it, pick a new "
                            "folder, or pass --force to start over there")
        return
    others = [n for n in names if not _ours_or_nothing(out, n)]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(f"--out {out} is not empty ({shown}); the draft needs a new or empty folder")


def _ours_or_nothing(out: Path, name: str) -> bool:
    """Entries an empty --out may have: what Finder leaves, a killed run's empty state or half-written save."""
    from dflash_tui.engine.checkpoint import STAGING_PREFIX
    from dflash_tui.training.trainer import STATE_DIR

    if name == STATE_DIR or name.startswith(STAGING_PREFIX):
        return (out / name).is_dir()
    return name == ".DS_Store"


def _steps_done(state_file: Path) -> Optional[int]:
    """The step a saved run reached, or None where its state cannot be read (the resume itself says why)."""
    from dflash_tui.files import read_regular_file

    try:
        step = json.loads(read_regular_file(state_file, MAX_STATE_BYTES))["step"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def make_out(out: Path) -> None:
    """Create --out and make sure a file can be written there, before any work: a read-only place is one
    line now, not a traceback after the replies are regenerated."""
    from dflash_tui.files import check_writable

    try:
        out.mkdir(parents=True, exist_ok=True)
        check_writable(out)
    except OSError as exc:
        raise UserError(f"cannot write to --out {out}: {exc.strerror or exc}") from None
