"""Build the bundled demo pair, end to end, inside time budgets.

    python -m dflash_tui.training.build_demo --work DIR [--corpus DIR] [--tokenizer DIR]

1. corpus: (docstring summary, function) pairs mined from the installed Python
   source (`corpus.py`), unless --corpus names a mined one;
2. tokenizer: byte-level BPE + ChatML special tokens + a mask token;
3. target: a small `qwen3` trained from scratch (`train_target.py`);
4. draft: the DFlash trainer against that target (`trainer.py`);
5. tokens per cycle on held-out requests.
Given the same corpus and step counts, every stage is seeded and repeatable;
with time budgets the step counts follow the machine's pace. The defaults are
the budgets the bundled pair was built with on one H200; there it ran as two
calls, `--regen-only` (target + regeneration) then `--skip-target --sequences
WORK/sequences.npz` (draft + evaluation).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import numpy as np

from dflash_tui.training.common import log
from dflash_tui.training.tokenizer import TOKENIZER_FILES

PACKAGE_DEMO = Path(__file__).resolve().parent.parent / "demo"


def _export(src: Path, dest: Optional[Path], names: list[str]) -> None:
    """Copy chosen files of a model directory out as soon as they exist (a killed run keeps them)."""
    if dest is None:
        return
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (src / name).exists():
            shutil.copyfile(src / name, dest / name)


def draft_prompts(train_ex: list[dict], unseen_file: Path, n: int, unseen_share: float, seed: int) -> list[list[dict]]:
    """Requests for the draft's regeneration: a seeded mix of training requests and unseen ones.

    On unseen requests the target writes new code, as it does for users; on
    its training requests it recites. A draft trained on recitals alone
    learns them by heart and accepts poorly on anything new.
    """
    from dflash_tui.training.corpus import read_examples

    rng = np.random.default_rng(seed)
    unseen = read_examples(unseen_file) if unseen_file.exists() and unseen_share > 0 else []
    n_unseen = min(len(unseen), int(round(n * unseen_share)))
    picked = [unseen[i]["prompt"] for i in rng.permutation(len(unseen))[:n_unseen]]
    picked += [train_ex[i]["prompt"] for i in rng.permutation(len(train_ex))[: n - n_unseen]]
    order = rng.permutation(len(picked))  # mixed, so a time budget cuts both kinds alike
    return [[{"role": "user", "content": picked[i]}] for i in order]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Build the bundled DFlash demo pair (target + draft).")
    p.add_argument("--work", type=Path, required=True, help="scratch directory")
    p.add_argument("--corpus", type=Path, help="a mined corpus (train.jsonl.gz + heldout.jsonl); default: mine one")
    p.add_argument("--named-per-cent", type=int, default=50, help="share of undocumented functions when mining")
    p.add_argument("--tokenizer", type=Path, help="a trained tokenizer directory; default: train one")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--target-out", type=Path, default=PACKAGE_DEMO / "target")
    p.add_argument("--draft-out", type=Path, default=PACKAGE_DEMO / "draft")
    p.add_argument("--export", type=Path, help="also copy weights + metrics here as each stage ends")
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--target-batch", type=int, default=32)
    p.add_argument("--target-lr", type=float, default=1e-3)
    p.add_argument("--target-steps", type=int)
    p.add_argument("--target-seconds", type=float, default=240.0)
    p.add_argument("--skip-target", action="store_true", help="reuse the target already in --target-out")
    p.add_argument("--draft-layers", type=int, default=3)
    p.add_argument("--target-layers", type=int, nargs="+", help="target layer ids to capture (default: the trainer's)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--draft-batch", type=int, default=64)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--draft-lr", type=float, default=1e-3)
    p.add_argument("--draft-init", default="copy", metavar="copy|random|DIR",
                   help="the draft's start: the target's last layers, random, or a saved draft to go on training")
    p.add_argument("--draft-steps", type=int)
    p.add_argument("--draft-seconds", type=float, default=340.0)
    p.add_argument("--draft-checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also save a usable draft under WORK/draft_run every STEPS steps (0: only at the end)")
    p.add_argument("--regen-prompts", type=int, default=200000)
    p.add_argument("--regen-seconds", type=float, default=160.0)
    p.add_argument("--regen-batch", type=int, default=4096)
    p.add_argument("--regen-finish", type=float, default=0.9, help="a regeneration batch stops once this share of rows ended")
    p.add_argument("--unseen-share", type=float, default=0.5, help="share of draft prompts the target never trained on")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--eval-prompts", type=int, default=8)
    p.add_argument("--eval-max-tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, help="seconds for the whole build; the final evaluation is skipped near it")
    p.add_argument("--regen-only", action="store_true",
                   help="stop after regenerating the draft's data (saved as WORK/sequences.npz)")
    p.add_argument("--sequences", type=Path, help="train the draft on this saved regeneration instead of regenerating")
    p.add_argument("--no-compile", action="store_true")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save_metrics() -> None:
        (work / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        if args.export:
            args.export.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "metrics.json", args.export / "metrics.json")

    # 1. corpus
    from dflash_tui.training.corpus import default_roots, read_examples, write_corpus

    corpus = args.corpus
    if corpus is None:
        corpus = work / "corpus"
        counts = write_corpus(default_roots(), corpus, named_per_cent=args.named_per_cent)
        log(f"[corpus] mined {counts}")
    train_ex = read_examples(corpus / "train.jsonl.gz")
    held_ex = read_examples(corpus / "heldout.jsonl")
    metrics["corpus"] = {"train_pairs": len(train_ex), "heldout_pairs": len(held_ex),
                         "docstring_pairs": sum(e.get("kind", "doc") == "doc" for e in train_ex)}

    # 2. tokenizer
    from dflash_tui.training.tokenizer import sample_texts, train_tokenizer

    tok_dir = args.tokenizer
    if tok_dir is None:
        tok_dir = work / "tokenizer"
        train_tokenizer(sample_texts(train_ex, 20_000_000), tok_dir, args.vocab_size)
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size()
    eos = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).token_to_id("<|im_end|>")

    # 3. target
    from dflash_tui.training.train_target import (TargetShape, encode_examples, init_target, save_target,
                                                  target_config, train_target)

    shape = TargetShape(args.hidden, args.layers, args.heads, args.kv_heads, args.head_dim, args.intermediate)
    config = target_config(vocab, eos, shape)
    if not args.skip_target:
        tic = time.perf_counter()
        train_seqs = encode_examples(tok_dir, train_ex, args.seq_len + 1)
        valid_seqs = encode_examples(tok_dir, held_ex, args.seq_len + 1)
        n_tokens = int(sum(len(s) for s in train_seqs))
        metrics["corpus"].update(train_tokens=n_tokens, encoded_pairs=len(train_seqs))
        log(f"[target] {len(train_seqs)} pairs, {n_tokens:,} tokens (encoded in {time.perf_counter() - tic:.1f}s)")
        model = init_target(config, seed=args.seed)
        n_params = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters()))
        log(f"[target] {n_params / 1e6:.2f}M params, shape {asdict(shape)}")
        tm = train_target(model, train_seqs, valid_seqs, steps=args.target_steps,
                          seconds=None if args.target_steps else args.target_seconds, batch=args.target_batch,
                          seq_len=args.seq_len, lr=args.target_lr, seed=args.seed, compile=not args.no_compile)
        metrics["target"] = {"params": int(n_params), "shape": asdict(shape), **tm}
        save_target(model, config, tok_dir, args.target_out)
        del model
        _export(args.target_out, args.export / "target" if args.export else None,
                sorted(p.name for p in args.target_out.glob("*")
                       if p.suffix in (".json", ".safetensors") and p.name not in TOKENIZER_FILES))
        save_metrics()

    # 4. draft
    from dflash_tui.engine.draft import save_draft  # noqa: F401  (the format the trainer writes)
    from dflash_tui.engine.loading import load_target
    from dflash_tui.training.prompts import prompt_ids
    from dflash_tui.training.trainer import Sequences, TrainConfig, build_sequences, train_draft

    target = load_target(str(args.target_out))
    prompts = draft_prompts(train_ex, corpus / "unseen.jsonl.gz", args.regen_prompts, args.unseen_share, args.seed)
    evals = [[{"role": "user", "content": e["prompt"]}] for e in held_ex[: args.eval_prompts]]
    cfg = TrainConfig(layers=args.draft_layers, block_size=args.block_size, target_layer_ids=args.target_layers,
                      steps=args.draft_steps, seconds=None if args.draft_steps else args.draft_seconds,
                      lr=args.draft_lr, batch_size=args.draft_batch, anchors=args.anchors, seq_len=args.seq_len,
                      max_new_tokens=args.max_new_tokens, regen_batch=args.regen_batch, regen_finish=args.regen_finish,
                      regen_seconds=args.regen_seconds, seed=args.seed, eval_max_tokens=args.eval_max_tokens,
                      checkpoint_every=args.draft_checkpoint_every, init=args.draft_init, compile=not args.no_compile)
    data = Sequences.load(args.sequences) if args.sequences else None
    if args.regen_only:
        tic = time.perf_counter()
        data = build_sequences(target, [prompt_ids(target.tokenizer, m) for m in prompts], cfg)
        n_tok = int(sum(len(t) for t in data.tokens))
        metrics["regeneration"] = {"sequences": len(data.tokens), "tokens": n_tok, "seconds": time.perf_counter() - tic}
        data.save(work / "sequences.npz")
        log(f"[data] {len(data.tokens)} sequences, {n_tok:,} tokens -> {work / 'sequences.npz'}")
        save_metrics()
        return 0
    run_dir = work / "draft_run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    dm = train_draft(target, prompts, run_dir, cfg, data=data)
    metrics["draft"] = {"config": {k: v for k, v in asdict(cfg).items() if k != "extra"}, **dm["train"]}
    args.draft_out.mkdir(parents=True, exist_ok=True)
    for old in args.draft_out.glob("*.safetensors"):
        old.unlink()
    names = ["config.json"] + sorted(p.name for p in run_dir.glob("*.safetensors"))
    _export(run_dir, args.draft_out, names)
    _export(run_dir, args.export / "draft" if args.export else None, names)
    save_metrics()

    # 5. evaluation
    left = None if args.deadline is None else args.deadline - (time.perf_counter() - t0)
    if evals and (left is None or left > 45):
        from dflash_tui.training.trainer import evaluate_checkpoint

        try:
            metrics["eval"] = evaluate_checkpoint(target, args.draft_out, evals, cfg)
        except Exception as exc:  # the weights are saved already; say what failed and finish
            log(f"[eval] failed: {type(exc).__name__}: {exc}")
            metrics["eval"] = {"error": f"{type(exc).__name__}: {exc}"}
    elif evals:
        log(f"[eval] skipped: {left:.0f}s left before the deadline")
    metrics["seconds"] = time.perf_counter() - t0
    save_metrics()
    log(f"[demo] done in {metrics['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
