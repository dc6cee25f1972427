"""`dflash-tui train-draft`: train a DFlash draft for a target with MLX."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dflash_tui.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, metavar="M", help="target: a local mlx-lm model directory or a hub repo id")
    parser.add_argument("--prompts", required=True, type=Path, metavar="FILE.jsonl",
                        help='one JSON object a line: {"prompt": ...} or {"messages": [...]}; replies are regenerated')
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="where the draft checkpoint goes: a new or empty folder (see --force, --resume)")
    parser.add_argument("--force", action="store_true",
                        help="replace the model already in --out (its config.json and weights; nothing else there)")
    parser.add_argument("--layers", type=int, default=2, metavar="N", help="draft layers (default 2)")
    parser.add_argument("--block-size", type=int, default=16, metavar="B")
    parser.add_argument("--target-layers", type=int, nargs="+", metavar="ID", help="target layer ids to capture")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, metavar="N")
    length.add_argument("--epochs", type=float, metavar="E")
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
    parser.add_argument("--checkpoint-every", type=int, default=500, metavar="N")
    parser.add_argument("--eval-prompts", type=int, default=8, metavar="N", help="held out from FILE for the final tokens-per-cycle check")
    parser.add_argument("--eval-max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--no-compile", action="store_true", help="run the steps uncompiled")


def run(args: argparse.Namespace) -> int:
    from dflash_tui.engine.loading import load_target
    from dflash_tui.training.prompts import read_prompts
    from dflash_tui.training.trainer import TrainConfig, train_draft

    for name in ("layers", "block_size", "batch_size", "anchors", "seq_len", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.block_size < 2:
        raise UserError("--block-size must be at least 2")
    check_out(args.out, args.target, force=args.force, resume=args.resume)
    convs = read_prompts(args.prompts)
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
    metrics = train_draft(target, train, args.out, cfg, eval_prompts=evals, resume=args.resume)
    summary = {"out": str(args.out), "steps": metrics["train"]["steps"], "final_loss": metrics["train"]["final_loss"]}
    if "eval" in metrics:
        summary["mean_tokens_per_cycle"] = metrics["eval"]["mean_tokens_per_cycle"]
    print(json.dumps(summary))
    return 0


def check_out(out: Path, target: str, force: bool, resume: bool) -> None:
    """Refuse an --out that would destroy a model: the target itself, or a folder that holds one."""
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
        return
    if holds_model(out) and not force:
        raise UserError(f"--out {out} already holds a model (config.json or weights); pick a new folder, "
                        "--resume a run there, or pass --force to replace it")
