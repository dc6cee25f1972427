"""Benchmark and check (not a test) of the block kernels on MLX CUDA.

For each kernel of `engine.cuda_kernels`: its largest difference from MLX's own
ops on the same inputs (relative to the largest output), and its time per call
against MLX's own path, both measured in one run as a chain of calls evaluated
together (so host-side costs count, as they do in a forward). Shapes are
Qwen3-4B's and Qwen3.5-4B's.

    python -m dflash_tui.bench.block_kernels --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import mlx.core as mx

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


def matmul_rows(chain: int, reps: int) -> list[dict[str, Any]]:
    rows = []
    for K, N in ((2560, 9728), (9728, 2560), (2560, 4096), (2560, 151936)):
        w = (mx.random.normal((N, K)) * K**-0.5).astype(mx.bfloat16)
        ws = [w] if N > 100_000 else [(mx.random.normal((N, K)) * K**-0.5).astype(mx.bfloat16) for _ in range(chain)]
        mx.eval(ws)
        for M in (1, 2, 4, 8, 16):
            x = mx.random.normal((M, K)).astype(mx.bfloat16)
            mx.eval(x)
            row: dict[str, Any] = {"K": K, "N": N, "M": M, "chain": len(ws)}
            row["mlx_us"] = _timed(lambda: [x @ wi.T for wi in ws], reps) / len(ws) * 1e6
            if M >= 2:
                row["rel_err"] = _rel(ck.block_matmul(x, w), x @ w.T)
                row["kernel_us"] = _timed(lambda: [ck.block_matmul(x, wi) for wi in ws], reps) / len(ws) * 1e6
            row["weight_GBps_kernel"] = (N * K * 2 / (row["kernel_us"] * 1e-6) / 1e9) if "kernel_us" in row else None
            rows.append(row)
    return rows


def attention_rows(chain: int, reps: int) -> list[dict[str, Any]]:
    rows = []
    for H, Hkv, D in ((32, 8, 128), (16, 4, 256)):
        for S in (160, 1200, 4096):
            cap = -(-S // 256) * 256  # keys are read in place from a longer buffer, as from a KVCache
            keys = mx.random.normal((1, Hkv, cap, D)).astype(mx.bfloat16)
            values = mx.random.normal((1, Hkv, cap, D)).astype(mx.bfloat16)
            for L, causal in ((16, True), (16, False), (4, True)):
                q = mx.random.normal((1, H, L, D)).astype(mx.bfloat16)
                mx.eval(q, keys, values)
                k, v = keys[:, :, :S], values[:, :, :S]
                scale = D**-0.5
                ref = ck._attention_reference(q, k, v, scale, causal)
                row: dict[str, Any] = {"H": H, "Hkv": Hkv, "D": D, "S": S, "L": L, "causal": causal}
                row["rel_err"] = _rel(ck.block_attention(q, k, v, scale, causal), ref)
                mask = "causal" if causal else None
                row["fused_us"] = _timed(lambda: [mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
                                                  for _ in range(chain)], reps) / chain * 1e6
                row["kernel_us"] = _timed(lambda: [ck.block_attention(q, k, v, scale, causal) for _ in range(chain)],
                                          reps) / chain * 1e6
                rows.append(row)
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
        y_ref, s_ref = ck._gated_delta_reference(q, k, v, g, beta, state)
        y, states = ck.gated_delta_steps(q, k, v, g, beta, state)
        row: dict[str, Any] = {"T": T, "rel_err_y": _rel(y, y_ref), "rel_err_state": _rel(states[-1], s_ref[-1]),
                               "rel_err_first_state": _rel(states[0], s_ref[0])}
        row["ops_us"] = _timed(lambda: [ck._gated_delta_reference(q, k, v, g, beta, state)[0] for _ in range(chain)],
                               reps) / chain * 1e6
        row["kernel_us"] = _timed(lambda: [ck.gated_delta_steps(q, k, v, g, beta, state)[0] for _ in range(chain)],
                                  reps) / chain * 1e6
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chain", type=int, default=24, help="calls evaluated together per timing")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--parts", nargs="+", default=["matmul", "attention", "gated_delta"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not ck.on_cuda():
        print("block_kernels: needs MLX's CUDA backend (the kernels are CUDA); here the references would run")
        return 2
    report: dict[str, Any] = {"mlx": mx.__version__, "device": mx.device_info().get("device_name")}
    parts = {"matmul": matmul_rows, "attention": attention_rows, "gated_delta": gated_delta_rows}
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
