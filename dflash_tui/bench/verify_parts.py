"""Benchmark (not a test): where a verify's time goes against a decode step's, part by part.

For one random-weight real-shape target (cycle_cost's shapes), one layer of each kind
(attention; Gated DeltaNet on hybrids) is taken apart: every linear in it, its mixer (the
attention or the Gated DeltaNet, with a cache of `--context` tokens), its MLP, the whole
layer, and the head. Each part runs on 1 row (a decode step) and on `--rows` rows run as
the engine's verify runs them (inside its verify scope: its attention kernel on MLX CUDA; a
Gated DeltaNet cache armed: the recorded one-launch kernel), as a chain of `--chain` calls
evaluated at once, so the time per call is the
device's with launches overlapped as in a forward (parts with a cache are put back after
each chain). `x layers` multiplies a layer part by the number of layers of its kind: the
share of one forward, to hold against `cycle_profile`'s whole step and verify.

    python -m dflash_tui.bench.verify_parts --shape qwen3-8b-4bit qwen3.5-4b --context 128 --rows 16
    python -m dflash_tui.bench.verify_parts --shape tiny tiny-hybrid --chain 2 --reps 1   # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.cycle_cost import SHAPES, build, random_prompt
from dflash_tui.engine import gdn_tape, step_rows
from dflash_tui.engine.state import DecodeState


def chained_ms(fn: Callable[[mx.array], Any], inputs: list[mx.array], reps: int,
               reset: Callable[[], None] = lambda: None) -> float:
    """Median over `reps` of (one evaluation of fn on every input) / len(inputs), in ms."""
    mx.eval(fn(inputs[0]))  # builds and warms the kernels
    reset()
    times = []
    for _ in range(reps):
        mx.synchronize()
        tic = time.perf_counter()
        mx.eval([fn(x) for x in inputs])
        times.append((time.perf_counter() - tic) * 1e3 / len(inputs))
        reset()
    return statistics.median(times)


def input_dims(module: nn.Module) -> int:
    w = module["weight"]
    return w.shape[1] * 32 // module.bits if isinstance(module, nn.QuantizedLinear) else w.shape[1]


def put_back(cache: Any) -> Callable[[], None]:
    """A function that gives a layer cache back what it holds now (trim, or its arrays)."""
    if hasattr(cache, "trim") and hasattr(cache, "offset"):
        offset = cache.offset
        return lambda: cache.trim(cache.offset - offset)
    saved = list(cache.state)
    return lambda: setattr(cache, "state", saved)


def layer_parts(layer: nn.Module, cache: Any) -> dict[str, tuple[Callable[[mx.array], Any], int, bool]]:
    """name -> (fn of x [1, rows, dims], dims, uses the cache)."""
    parts: dict[str, tuple[Callable[[mx.array], Any], int, bool]] = {}
    for name, m in layer.named_modules():
        if isinstance(m, (nn.Linear, nn.QuantizedLinear)) and name:
            parts[name] = (m, input_dims(m), False)
    hidden = layer.input_layernorm.weight.shape[0]

    def mask(x: mx.array):
        return "causal" if x.shape[1] > 1 else None

    mixer_name = "self_attn" if hasattr(layer, "self_attn") else "linear_attn"
    mixer = getattr(layer, mixer_name)
    if mixer_name == "self_attn":
        parts[mixer_name] = (lambda x: mixer(x, mask(x), cache), hidden, True)
    else:
        parts[mixer_name] = (lambda x: mixer(x, None, cache), hidden, True)
    parts["mlp"] = (layer.mlp, hidden, False)
    parts["layer"] = (lambda x: layer(x, mask(x) if mixer_name == "self_attn" else None, cache), hidden, True)
    return parts


def as_verify(fn: Callable[[mx.array], Any], target: Any, cache: Any) -> Callable[[mx.array], Any]:
    """fn as the engine's verify runs it: in its verify scope, a Gated DeltaNet cache armed."""
    # a hybrid's linear layer (the head has no cache)
    record = bool(getattr(target, "recorded", None)) and cache is not None and not hasattr(cache, "offset")

    def run(x: mx.array) -> Any:
        if record:
            gdn_tape.arm(cache, target.rollback_mode)
        with step_rows.verifying(True, as_steps=target.step_rows):
            out = fn(x)
        if record:
            gdn_tape.disarm(cache)
        return out

    return run


def profile(shape: str, context: int, rows: int, chain: int, reps: int, dtype: mx.Dtype,
            modes: tuple[str, ...] = ("batched",)) -> list[dict[str, Any]]:
    target, draft = build(shape, 5, dtype)
    state = DecodeState(target, draft)
    state.prefill(random_prompt(target.vocab_size, context))
    cache = state.target_cache
    out: list[dict[str, Any]] = []
    kinds: dict[str, list[int]] = {}
    for i, layer in enumerate(target.layers):
        kinds.setdefault("attention" if hasattr(layer, "self_attn") else "linear", []).append(i)
    mx.random.seed(3)
    hidden = target.hidden_size
    for kind, ids in kinds.items():
        i = ids[0]
        restore = put_back(cache[i])
        for name, (fn, dims, cached) in layer_parts(target.layers[i], cache[i]).items():
            for mode in modes:
                row: dict[str, Any] = {"shape": shape, "context": context, "layer": kind, "part": name,
                                       "verify": mode}
                try:
                    for n in (1, rows):
                        xs = [mx.random.normal((1, n, dims)).astype(dtype) for _ in range(chain)]
                        target.use_step_rows(mode == "steps")
                        run = fn if n == 1 else as_verify(fn, target, cache[i])
                        ms = chained_ms(run, xs, reps, restore if cached else (lambda: None))
                        row[f"ms_{n}"] = ms
                        row[f"ms_{n}_x_layers"] = ms * len(ids)
                    row["ratio"] = row[f"ms_{rows}"] / row["ms_1"]
                except Exception as exc:  # one part failing must not lose the others
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                out.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    for mode in modes:
        target.use_step_rows(mode == "steps")
        head: dict[str, Any] = {"shape": shape, "context": context, "layer": "head", "part": "head", "verify": mode}
        for n in (1, rows):
            xs = [mx.random.normal((1, n, hidden)).astype(dtype) for _ in range(chain)]
            fn = target.head if n == 1 else as_verify(target.head, target, None)
            head[f"ms_{n}"] = head[f"ms_{n}_x_layers"] = chained_ms(fn, xs, reps)
        head["ratio"] = head[f"ms_{rows}"] / head["ms_1"]
        out.append(head)
        print(json.dumps(head), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["tiny"])
    p.add_argument("--context", type=int, nargs="+", default=[128])
    p.add_argument("--rows", type=int, default=16, help="the verify's rows")
    p.add_argument("--chain", type=int, default=8, help="calls evaluated at once per timing")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--verify", choices=["batched", "steps"], nargs="+", default=["batched"],
                   help="the verify's rows together (the engine's way) and/or as decode steps (MLX CUDA)")
    args = p.parse_args(argv)
    require_at_least(p, args, {"context": 1, "rows": 1, "chain": 1, "reps": 1})
    rows = [r for shape in args.shape for ctx in args.context
            for r in profile(shape, ctx, args.rows, args.chain, args.reps, getattr(mx, args.dtype),
                                     tuple(args.verify))]
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
