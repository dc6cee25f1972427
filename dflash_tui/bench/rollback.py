"""Benchmark (not a test): Gated DeltaNet rollback time per cycle against verify time per cycle.

A random-weight hybrid target is built in memory (no files, no tokenizer). Each
cycle verifies a block of B random tokens with the linear caches armed, keeps
`keep` of them (cycling through 1..B-1: always a partial accept), and rolls
back; rollback time includes evaluating the restored states, so lazy work is
counted. By default every cycle starts from the same cache length, so a
backend that compiles per shape pays that once, not in every verify.

    python -m dflash_tui.bench.rollback --shape qwen3.5-4b            # the GPU figure
    python -m dflash_tui.bench.rollback --shape qwen3.5-4b --layers 4 # CPU-sized
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import mlx.core as mx

from dflash_tui import random_pair as rp
from dflash_tui.bench.arguments import require_at_least
from dflash_tui.engine.hybrid import HybridCache, HybridTarget

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3.5-4B: 3 Gated DeltaNet layers per full-attention layer
    "qwen3.5-4b": dict(vocab_size=248320, hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256,
                       intermediate=9216, linear_k_heads=16, linear_v_heads=32, linear_head_dim=128, tie=True),
    "tiny": dict(vocab_size=384, hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                 linear_k_heads=2, linear_v_heads=4, linear_head_dim=32, tie=False),
}


def build_target(shape: str, layers: int | None, dtype: mx.Dtype, seed: int, rollback_mode: str) -> HybridTarget:
    dims = dict(SHAPES[shape])
    if layers is not None:
        dims["layers"] = layers
    vocab = dims.pop("vocab_size")
    model = rp.build_model(rp.qwen3_5_config(vocab, **dims), seed=seed, dtype=dtype)
    return HybridTarget(model, tokenizer=None, name=shape, rollback_mode=rollback_mode)


def _eval_cache(cache: list[Any]) -> None:
    mx.eval([c.state for c in cache])


def _saved(target: HybridTarget, cache: HybridCache):
    return [(cache[i][0], cache[i][1]) for i in target.linear_ids], cache.length


def _restore(target: HybridTarget, cache: HybridCache, saved, dropped: int) -> None:
    """Back to the cache as it was before a cycle (linear states by reference, attention by trim)."""
    states, length = saved
    for i, (conv, state) in zip(target.linear_ids, states):
        cache[i][0], cache[i][1] = conv, state
    for i in target.attention_ids:
        cache[i].trim(dropped)
    cache.length = length


def measure(target: HybridTarget, block: int, cycles: int, prompt: int, warmup: int, grow: bool, seed: int) -> dict[str, Any]:
    rng = mx.random.key(seed)
    vocab = target.vocab_size
    cache = target.make_cache()
    tokens = mx.random.randint(0, vocab, (1, prompt), key=rng)
    logits, _ = target.forward(tokens, cache, last_only=True)
    mx.eval(logits)
    _eval_cache(cache)
    verify_ms, rollback_ms, plain_ms, keeps = [], [], [], []
    for n in range(warmup + cycles):
        block_tokens = mx.random.randint(0, vocab, (1, block), key=mx.random.key(seed + 1 + n))
        keep = 1 + n % (block - 1)
        before = _saved(target, cache)

        # the same forward without recording: what the verify costs anyway
        tic = time.perf_counter()
        logits, _ = target.forward(block_tokens, cache)
        mx.eval(logits)
        _eval_cache(cache)
        plain = time.perf_counter() - tic
        _restore(target, cache, before, block)

        tic = time.perf_counter()
        target.begin_verify(cache)
        logits, _ = target.forward(block_tokens, cache)
        mx.eval(logits)
        _eval_cache(cache)
        verified = time.perf_counter()
        target.rollback(cache, keep, block)
        _eval_cache(cache)
        done = time.perf_counter()
        if not grow:
            _restore(target, cache, before, keep)
        if n >= warmup:
            plain_ms.append(plain * 1e3)
            verify_ms.append((verified - tic) * 1e3)
            rollback_ms.append((done - verified) * 1e3)
            keeps.append(keep)
    v, r = statistics.median(verify_ms), statistics.median(rollback_ms)
    return {
        "mode": target.rollback_mode,
        "block_size": block,
        "cycles": cycles,
        "verify_ms": round(v, 3),
        "verify_unrecorded_ms": round(statistics.median(plain_ms), 3),
        "rollback_ms": round(r, 3),
        "rollback_mean_ms": round(statistics.mean(rollback_ms), 3),
        "rollback_max_ms": round(max(rollback_ms), 3),
        "rollback_pct_of_verify": round(100 * r / v, 2),
        "mean_keep": round(statistics.mean(keeps), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_tui.bench.rollback", description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.5-4b")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (e.g. fewer on CPU)")
    p.add_argument("--block-size", type=int, nargs="+", default=[16])
    p.add_argument("--cycles", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompt", type=int, default=256, help="tokens in the cache before the first cycle")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--mode", choices=["auto", "replay", "both"], default="both")
    p.add_argument("--grow", action="store_true", help="let the cache grow cycle by cycle (new shapes every verify)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object per result")
    args = p.parse_args(argv)
    require_at_least(p, args, {"layers": 1, "block_size": 2, "cycles": 1, "warmup": 0, "prompt": 1})

    dtype = getattr(mx, args.dtype)
    tic = time.perf_counter()
    target = build_target(args.shape, args.layers, dtype, args.seed, "auto")
    build_s = time.perf_counter() - tic
    info = {"device": str(mx.default_device()), "shape": args.shape, "layers": target.num_layers,
            "linear_layers": len(target.linear_ids), "dtype": args.dtype, "prompt": args.prompt,
            "grow": args.grow, "build_s": round(build_s, 1)}
    try:
        info["device_name"] = mx.device_info().get("device_name")
    except Exception:  # device_info's keys differ per backend
        pass
    print(json.dumps(info) if args.json else " ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    modes = ["auto", "replay"] if args.mode == "both" else [args.mode]
    if not args.json:
        print(f"{'mode':>7} {'B':>3} {'verify ms':>10} {'(unrecorded)':>12} {'rollback ms':>12} {'max':>8} {'rollback/verify':>16}")
    for block in args.block_size:
        for mode in modes:
            target.rollback_mode = mode
            res = measure(target, block, args.cycles, args.prompt, args.warmup, args.grow, args.seed)
            if args.json:
                print(json.dumps(res), flush=True)
            else:
                print(f"{mode:>7} {block:>3} {res['verify_ms']:>10.2f} {res['verify_unrecorded_ms']:>12.2f} "
                      f"{res['rollback_ms']:>12.3f} {res['rollback_max_ms']:>8.3f} {res['rollback_pct_of_verify']:>15.2f}%",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
