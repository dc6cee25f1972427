"""Benchmark and check (not a test) of the block kernels on MLX CUDA.

For each kernel of `engine.cuda_kernels`: its largest difference from MLX's own
ops on the same inputs (relative to the largest output), and its time per call
against MLX's own path, both measured in one run as a chain of calls evaluated
together (so host-side costs count, as they do in a forward). Shapes are
Qwen3-4B's and Qwen3.5-4B's. Attention rows time every split-K variant at
every cache length (where `SPLIT_FROM_KEYS` and `SPLIT_CHUNK` come from).

    python -m dflash_tui.bench.block_kernels --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import mlx.core as mx

from dflash_tui.engine import cuda_gated_delta as gd
from dflash_tui.engine import cuda_kernels as ck


def _timed(fn: Callable[[], list[mx.array]], reps: int) -> float:
    mx.eval(fn())  # warm-up: the first call compiles
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def _rel(a: mx.array, b: mx.array) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return float((mx.abs(a - b).max() / mx.maximum(mx.abs(b).max(), 1e-6)).item())


# (SPLIT_CHUNK, SPLIT_WARPS) tried for the split-K path; None: one block per (KV head, query)
SPLIT_VARIANTS = (None, (128, 4), (256, 4), (512, 4), (256, 8), (512, 8))


def _with_split(variant, fn):
    """Run fn with block_attention forced to one of SPLIT_VARIANTS."""
    saved = ck.SPLIT_FROM_KEYS, ck.SPLIT_CHUNK, ck.SPLIT_WARPS, ck.SPLIT_MAX_HEAD_DIM
    try:
        if variant is None:
            ck.SPLIT_FROM_KEYS = 1 << 30
        else:
            ck.SPLIT_FROM_KEYS, (ck.SPLIT_CHUNK, ck.SPLIT_WARPS) = 0, variant
            ck.SPLIT_MAX_HEAD_DIM = 1 << 30
        return fn()
    finally:
        ck.SPLIT_FROM_KEYS, ck.SPLIT_CHUNK, ck.SPLIT_WARPS, ck.SPLIT_MAX_HEAD_DIM = saved


def attention_rows(chain: int, reps: int) -> list[dict[str, Any]]:
    """Each split variant against MLX's fused kernel (on a repeated shape, its best case) and
    the float32 reference; the engine's own choice at each length is `chosen_us`."""
    rows = []
    for H, Hkv, D in ((32, 8, 128), (16, 4, 256)):
        for S in (160, 1024, 2048, 4096, 16384):
            cap = -(-S // 256) * 256  # keys are read in place from a longer buffer, as from a KVCache
            keys = mx.random.normal((1, Hkv, cap, D)).astype(mx.bfloat16)
            values = mx.random.normal((1, Hkv, cap, D)).astype(mx.bfloat16)
            for L, causal in ((16, True), (16, False), (8, True)):
                q = mx.random.normal((1, H, L, D)).astype(mx.bfloat16)
                mx.eval(q, keys, values)
                k, v = keys[:, :, :S], values[:, :, :S]
                scale = D**-0.5
                ref = ck._attention_reference(q, k, v, scale, causal)
                mask = "causal" if causal else None
                fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
                row: dict[str, Any] = {"H": H, "Hkv": Hkv, "D": D, "S": S, "L": L, "causal": causal,
                                       "splits": ck.attention_splits(S, D), "fused_rel_err": _rel(fused, ref)}
                row["fused_us"] = _timed(lambda: [mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
                                                  for _ in range(chain)], reps) / chain * 1e6
                for variant in SPLIT_VARIANTS:
                    name = "one_block" if variant is None else f"split_{variant[0]}x{variant[1]}w"
                    row[f"{name}_rel_err"] = _with_split(variant, lambda: _rel(ck.block_attention(q, k, v, scale, causal),
                                                                               ref))
                    row[f"{name}_us"] = _with_split(variant, lambda: _timed(
                        lambda: [ck.block_attention(q, k, v, scale, causal) for _ in range(chain)], reps)) / chain * 1e6
                row["chosen_us"] = _timed(lambda: [ck.block_attention(q, k, v, scale, causal) for _ in range(chain)],
                                          reps) / chain * 1e6
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # progress
    return rows


def gated_delta_rows(chain: int, reps: int) -> list[dict[str, Any]]:
    rows = []
    B, Hk, Hv, Dk, Dv = 1, 16, 32, 128, 128
    for T in (1, 4, 16):
        q = (mx.random.normal((B, T, Hk, Dk)) * 0.1).astype(mx.bfloat16)
        k = (mx.random.normal((B, T, Hk, Dk)) * 0.1).astype(mx.bfloat16)
        v = mx.random.normal((B, T, Hv, Dv)).astype(mx.bfloat16)
        g = mx.random.uniform(0.8, 1.0, (B, T, Hv))
        beta = mx.random.uniform(0, 1, (B, T, Hv)).astype(mx.bfloat16)
        state = mx.random.normal((B, Hv, Dv, Dk)) * 0.1
        mx.eval(q, k, v, g, beta, state)
        y_ref, s_ref = gd._gated_delta_reference(q, k, v, g, beta, state)
        y, states = gd.gated_delta_steps(q, k, v, g, beta, state)
        row: dict[str, Any] = {"T": T, "rel_err_y": _rel(y, y_ref), "rel_err_state": _rel(states[-1], s_ref[-1]),
                               "rel_err_first_state": _rel(states[0], s_ref[0])}
        row["ops_us"] = _timed(lambda: [gd._gated_delta_reference(q, k, v, g, beta, state)[0] for _ in range(chain)],
                               reps) / chain * 1e6
        row["kernel_us"] = _timed(lambda: [gd.gated_delta_steps(q, k, v, g, beta, state)[0] for _ in range(chain)],
                                  reps) / chain * 1e6
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chain", type=int, default=24, help="calls evaluated together per timing")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--parts", nargs="+", default=["attention", "gated_delta"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not ck.on_cuda():
        print("block_kernels: needs MLX's CUDA backend (the kernels are CUDA); here the references would run")
        return 2
    report: dict[str, Any] = {"mlx": mx.__version__, "device": mx.device_info().get("device_name")}
    parts = {"attention": attention_rows, "gated_delta": gated_delta_rows}
    for name in args.parts:
        try:
            report[name] = parts[name](args.chain, args.reps)
        except Exception as exc:  # one kernel failing to build must not hide the others' figures
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        if not args.json:
            print(name, json.dumps(report[name], indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
