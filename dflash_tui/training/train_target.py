"""Train the demo target from scratch: a small mlx-lm `qwen3` model on chat-rendered pairs.

Examples are rendered through the same ChatML text the chat template makes,
tokenized, and packed into fixed-length rows (fixed shapes keep MLX's compiled
step and its GPU kernels reused). Loss is next-token cross-entropy on every token.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from dflash_tui.random_pair import build_model, qwen3_config
from dflash_tui.engine.checkpoint import save_sharded
from dflash_tui.training.common import Progress, StepBudget, compiled_or_plain, log, lr_at
from dflash_tui.training.tokenizer import TOKENIZER_FILES, render_chat


@dataclass
class TargetShape:
    hidden: int = 384
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1024


def target_config(vocab_size: int, eos_token_id: int, shape: TargetShape) -> dict[str, Any]:
    cfg = qwen3_config(vocab_size, hidden=shape.hidden, layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads,
                       head_dim=shape.head_dim, intermediate=shape.intermediate, tie=True, eos_token_id=eos_token_id)
    cfg["max_position_embeddings"] = 4096
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def encode_examples(tokenizer_dir: Path, examples: Sequence[dict], max_tokens: int) -> list[np.ndarray]:
    """Chat-rendered token ids of each (prompt, response); longer ones are dropped."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    texts = [render_chat(e["prompt"], e["response"]) for e in examples]
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        if len(enc.ids) <= max_tokens:
            out.append(np.asarray(enc.ids, dtype=np.int32))
    return out


def packed_rows(seqs: Sequence[np.ndarray], row_len: int, rng: np.random.Generator) -> np.ndarray:
    """One epoch: the examples in a fresh random order, concatenated and cut into rows."""
    order = rng.permutation(len(seqs))
    flat = np.concatenate([seqs[i] for i in order])
    n = len(flat) // row_len
    return flat[: n * row_len].reshape(n, row_len)


def batches(seqs: Sequence[np.ndarray], batch: int, seq_len: int, seed: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    while True:
        rows = packed_rows(seqs, seq_len + 1, rng)
        if len(rows) < batch:
            raise ValueError(f"the corpus is too small for one batch of {batch} x {seq_len + 1} tokens")
        for i in range(0, len(rows) - batch + 1, batch):
            yield rows[i : i + batch]


def init_target(config: dict[str, Any], seed: int = 0) -> nn.Module:
    """mlx-lm's own init, with a small embedding: it is also the (tied) output head."""
    model = build_model(config, seed=seed, scale=1.0, dtype=mx.float32)
    emb = model.model.embed_tokens
    emb.weight = mx.random.normal(emb.weight.shape, key=mx.random.key(seed + 1)) * 0.02
    mx.eval(model.parameters())
    return model


def lm_loss(model: nn.Module, x: mx.array, y: mx.array) -> mx.array:
    logits = model(x).astype(mx.float32)
    return nn.losses.cross_entropy(logits, y, reduction="mean")


def train_target(model: nn.Module, train: Sequence[np.ndarray], valid: Sequence[np.ndarray], *, steps: Optional[int] = None,
                 seconds: Optional[float] = None, batch: int = 32, seq_len: int = 512, lr: float = 1e-3, warmup: int = 200,
                 weight_decay: float = 0.1, seed: int = 0, compile: bool = True) -> dict[str, float]:
    """Train in place until `steps`, or until `seconds` run out (the schedule is fitted to the measured pace)."""
    if steps is None and seconds is None:
        raise ValueError("give steps or seconds")
    optimizer = optim.AdamW(learning_rate=lr, betas=[0.9, 0.95], weight_decay=weight_decay)
    grad_fn = nn.value_and_grad(model, lm_loss)
    optimizer.init(model.trainable_parameters())  # the compiled step must see the full state
    state = [model.state, optimizer.state]

    def step_fn(x, y):
        loss, grads = grad_fn(model, x, y)
        grads, norm = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss, norm

    step = step_fn
    if compile:
        step = compiled_or_plain(partial(mx.compile, inputs=state, outputs=state)(step_fn), step_fn, "target")
    budget = StepBudget(seconds, steps)
    progress = Progress("target", budget.total)
    data = batches(train, batch, seq_len, seed)
    start = time.perf_counter()
    losses: list[mx.array] = []
    i = 0
    while i < budget.total:
        optimizer.learning_rate = lr_at(i, budget.total, lr, warmup)
        rows = mx.array(next(data))
        loss, norm = step(rows[:, :-1], rows[:, 1:])
        mx.eval(loss, norm, state)
        losses = (losses + [loss])[-50:]
        i += 1
        was_fitted = budget.fitted
        if budget.tick(i, time.perf_counter() - start):
            break
        progress.total = budget.total
        if budget.fitted and not was_fitted:
            log(f"[target] {batch * seq_len * i / (time.perf_counter() - start):,.0f} tok/s so far -> {budget.total} steps")
        if i % 50 == 0 or i == budget.total:
            progress.update(i, loss=float(np.mean([l.item() for l in losses])), lr=optimizer.learning_rate.item())
    progress.update(i, force=True, loss=float(np.mean([l.item() for l in losses])))
    progress.close()
    metrics = {
        "steps": i,
        "seconds": time.perf_counter() - start,
        "tokens": i * batch * seq_len,
        "train_loss": float(np.mean([l.item() for l in losses])),
        "valid_loss": evaluate_loss(model, valid, seq_len),
    }
    log(f"[target] done: {json.dumps(metrics)}")
    return metrics


def evaluate_loss(model: nn.Module, seqs: Sequence[np.ndarray], seq_len: int, max_rows: int = 64) -> float:
    """Mean next-token loss on packed held-out rows."""
    if not seqs:
        return float("nan")
    rows = packed_rows(seqs, seq_len + 1, np.random.default_rng(0))[:max_rows]
    if len(rows) == 0:
        flat = np.concatenate(seqs)
        rows = flat[None, : min(len(flat), seq_len + 1)]
    total = 0.0
    for i in range(0, len(rows), 16):
        r = mx.array(rows[i : i + 16])
        total += lm_loss(model, r[:, :-1], r[:, 1:]).item() * len(r)
    return total / len(rows)


def save_target(model: nn.Module, config: dict[str, Any], tokenizer_dir: Path, out_dir: Path, dtype: mx.Dtype = mx.bfloat16) -> Path:
    """An mlx-lm model directory: config.json, tokenizer files, weights in shards under 15 MiB."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(Path(tokenizer_dir) / name, out_dir / name)
    weights = dict(tree_flatten(tree_map(lambda p: p.astype(dtype), model.parameters())))
    save_sharded(weights, out_dir)
    return out_dir


def shape_dict(shape: TargetShape) -> dict[str, int]:
    return asdict(shape)
