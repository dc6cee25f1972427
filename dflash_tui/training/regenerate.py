"""Regenerate responses with the target itself (greedy), as the DFlash recipe asks.

The draft learns to predict what the target says, not what a dataset says.
Prompts are grouped by length so each batch needs no padding: every row of a
batch sits at the same positions, and the plain KV cache serves the batch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from dflash_tui.engine.target import Target
from dflash_tui.training.common import Progress


def _generate_batch(target: Target, prompts: np.ndarray, max_new: int, eos: set[int], finish: float = 1.0) -> list[list[int]]:
    """Greedy continuations of same-length prompts; stops once a `finish` share of rows has ended.

    Rows still running then are cut short (no stop token): a long straggler
    would otherwise hold the whole batch to `max_new` steps.
    """
    cache = target.make_cache()
    logits = target.model(mx.array(prompts), cache=cache)
    token = mx.argmax(logits[:, -1], axis=-1)
    out = [token]
    for i in range(1, max_new):
        if i % 16 == 0:
            done = np.isin(np.stack([np.asarray(t) for t in out], axis=1), list(eos)).any(axis=1)
            if done.mean() >= finish:
                break
        logits = target.model(token[:, None], cache=cache)
        token = mx.argmax(logits[:, -1], axis=-1)
        mx.async_eval(token)
        out.append(token)
    rows = np.stack([np.asarray(t) for t in out], axis=1).tolist()
    responses = []
    for row in rows:
        cut = next((j for j, t in enumerate(row) if t in eos), None)
        responses.append(row if cut is None else row[: cut + 1])  # keep the stop token: the draft predicts it too
    return responses


def regenerate(target: Target, prompts: Sequence[list[int]], max_new: int, eos_ids: set[int], batch_size: int = 256,
               seconds: Optional[float] = None, finish: float = 1.0) -> list[Optional[list[int]]]:
    """Greedy responses (ending in an EOS id when one came); None for prompts the time budget left out."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[len(p)].append(i)
    work = [(n, idx[s : s + batch_size]) for n, idx in sorted(groups.items()) for s in range(0, len(idx), batch_size)]
    # big batches first: the budget is best spent where the GPU is fullest
    work.sort(key=lambda w: (-len(w[1]), w[0]))
    results: list[Optional[list[int]]] = [None] * len(prompts)
    progress = Progress("regenerate", len(prompts))
    start, done, tokens = time.perf_counter(), 0, 0
    for n, idx in work:
        if seconds is not None and time.perf_counter() - start > seconds:
            break
        batch = np.asarray([prompts[i] for i in idx], dtype=np.int32)
        for i, resp in zip(idx, _generate_batch(target, batch, max_new, eos_ids, finish)):
            results[i] = resp
            tokens += len(resp)
        done += len(idx)
        elapsed = time.perf_counter() - start
        progress.update(done, prompts_per_s=done / elapsed, tokens_per_s=tokens / elapsed)
    progress.update(done, force=True)
    progress.close()
    return results
