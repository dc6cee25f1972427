"""Benchmark and check (not a test) of the block kernels on MLX CUDA.

For each kernel of `engine.cuda_kernels`: its largest difference from MLX's own
ops on the same inputs (relative to the largest output), and its time per call
against MLX's own path, both measured in one run as a chain of calls evaluated
together (so host-side costs count, as they do in a forward). Shapes are
Qwen3-4B's and Qwen3.5-4B's. Attention rows time every attention kernel and
setting side by side at every cache length (where the thresholds of
`cuda_kernels.attention_kernel` come from: `SPLIT_*`, `ALLQ_*`).

    python -m dflash_tui.bench.block_kernels --json
    python -m dflash_tui.bench.block_kernels --parts attention --chain 12 --reps 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.engine import cuda_allq_attention as cqa
from dflash_tui.engine import cuda_gated_delta as gd
from dflash_tui.engine import cuda_kernels as ck
from dflash_tui.engine import cuda_split_attention as csa


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


ALLQ_CHUNKS = (128, 256, 512, 1024)  # key ranges tried for the all-queries kernel


def attention_variants(H: int, Hkv: int, L: int, D: int, S: int) -> dict[str, Callable[..., mx.array]]:
    """Every kernel block_attention can choose, with the settings tried: name -> f(q, k, v,
    scale, causal). "chosen" is block_attention itself (its thresholds' pick)."""
    rows = L * (H // Hkv)
    variants: dict[str, Callable[..., mx.array]] = {
        "fused": lambda q, k, v, scale, causal: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask="causal" if causal else None),
        "one_block": ck._one_block_attention,
        "split_512x4w": lambda q, k, v, scale, causal: csa.split_attention(
            q, k, v, scale, causal, -(-S // 512), 512, 4),
    }
    tiles = [t for t in (32, 16) if cqa.allq_fits(rows, D, t, 1024)]
    for chunk in ALLQ_CHUNKS:
        for tile in tiles[:1]:
            variants[f"allq_{chunk}x{tile}"] = (lambda q, k, v, scale, causal, c=chunk, t=tile:
                                                cqa.allq_attention(q, k, v, scale, causal, c, t))
    variants["chosen"] = ck.block_attention
    return variants


ATTENTION_HEADS = ((32, 8, 128), (16, 4, 256))  # (H, Hkv, D): Qwen3-4B's, Qwen3.5-4B's
ATTENTION_KEYS = (160, 1024, 4096, 16384)
ATTENTION_QUERIES = ((16, True), (8, True))  # (L, causal): the verify of a 16- and an 8-token block


def attention_rows(chain: int, reps: int, heads=ATTENTION_HEADS, lengths=ATTENTION_KEYS,
                   queries=ATTENTION_QUERIES, only: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Each kernel and setting against MLX's fused kernel (on a repeated shape, its best case)
    and the float32 reference: `<variant>_us` per call, `<variant>_rel_err` its largest
    difference from the reference (relative to the largest output); `best` the fastest of
    the engine's own kernels. `only`: the variants whose names start with one of these."""
    rows = []
    for H, Hkv, D in heads:
        for S in lengths:
            cap = -(-S // 256) * 256 + 256  # keys are read in place from a longer buffer, as from a KVCache
            keys = mx.random.normal((1, Hkv, cap, D)).astype(mx.bfloat16)
            values = mx.random.normal((1, Hkv, cap, D)).astype(mx.bfloat16)
            for L, causal in queries:
                q = mx.random.normal((1, H, L, D)).astype(mx.bfloat16)
                mx.eval(q, keys, values)
                k, v = keys[:, :, :S], values[:, :, :S]
                scale = D**-0.5
                row: dict[str, Any] = {"H": H, "Hkv": Hkv, "D": D, "S": S, "L": L, "causal": causal,
                                       "chosen_kernel": ck.attention_kernel(S, D, L, H // Hkv)}
                try:
                    ref = ck._attention_reference(q, k, v, scale, causal)
                    mx.eval(ref)
                except Exception as exc:
                    row["error"] = f"reference: {type(exc).__name__}: {exc}"
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    continue
                for name, fn in attention_variants(H, Hkv, L, D, S).items():
                    if only and not name.startswith(only):
                        continue
                    try:  # one variant failing to build must not hide the others' figures
                        row[f"{name}_rel_err"] = _rel(fn(q, k, v, scale, causal), ref)
                        row[f"{name}_us"] = _timed(lambda: [fn(q, k, v, scale, causal) for _ in range(chain)],
                                                   reps) / chain * 1e6
                    except Exception as exc:
                        row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                ours = {n[:-3]: t for n, t in row.items() if n.endswith("_us") and n not in ("fused_us", "chosen_us")}
                if ours:
                    row["best"] = min(ours, key=ours.get)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # progress: a run cut short keeps its rows
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
    p.add_argument("--variants", nargs="+", default=[],
                   help="attention: only the variants whose names start with these (fused, one_block, split, "
                        "allq, chosen); a kernel that faults spoils the GPU context for the rest")
    args = p.parse_args(argv)
    require_at_least(p, args, {"chain": 1, "reps": 1})
    if not ck.on_cuda():
        print("block_kernels: needs MLX's CUDA backend (the kernels are CUDA); here the references would run")
        return 2
    report: dict[str, Any] = {"mlx": mx.__version__, "device": mx.device_info().get("device_name")}
    parts = {"attention": lambda chain, reps: attention_rows(chain, reps, only=tuple(args.variants)),
             "gated_delta": gated_delta_rows}
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
