"""Benchmark (not a test): the row-wise matmul against MLX's gemm and its one-row gemv.

For each weight shape of a target (and a few other models' shapes: other K, K not a multiple
of 128), it prints how many of 16 rows of `engine.cuda_rowwise` equal the 16 one-row products
`x[i:i+1] @ w.T` bit for bit (also for 2 and 7 rows on one shape), and the time of one call
(median of 20, each synced) beside MLX's gemm. Then a *chain*: a verify's matmuls (every
layer's q, k, v, o, gate, up, down with its own weights, then the head) built lazily and
evaluated at once, beside MLX's gemm chain and 16 one-row products per matmul. The chain's
products are independent, so the GPU may overlap them where a forward's wait on each other:
compare a kernel's shapes by each call's own device time (Nsight Compute) or whole forwards
(`cycle_profile`), not by chains.

Each result is one JSON line on stderr as soon as it is measured; the whole report, with each
shape's times and the rows that were not equal, is JSON on stdout.

    python -m dflash_tui.bench.rowwise --shape qwen3-4b
    python -m dflash_tui.bench.rowwise --shape tiny     # CPU smoke run (MLX's own product)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.cycle_cost import SHAPES
from dflash_tui.engine import cuda_rowwise as cr
from dflash_tui.engine.cuda_kernels import on_cuda

ROWS = 16
# (K, N) of other models' layers: Qwen3-8B and -14B MLPs, gpt-oss's hidden size (K % 128 = 64:
# MLX's gemv reads 2 values per lane), K % 64 != 0 (1 value per lane; odd K: unaligned rows)
EXTRA = {"tiny": [(96, 40), (33, 20)],
         "": [(4096, 12288), (12288, 4096), (5120, 17408), (17408, 5120), (2880, 4096), (1000, 2048), (1001, 512)]}


def layer_shapes(spec: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, K, N) of one layer's matmuls, in a verify's order, and the head."""
    d = spec["dims"]
    h, q, kv, i = d["hidden"], d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"], d["intermediate"]
    return [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h), ("gate", h, i), ("up", h, i), ("down", i, h),
            ("head", h, spec["vocab"])]


def fused_shapes(spec: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, K, N) of the products that share an input, as one product each: q, k, v and gate, up."""
    by = {name: (k, n) for name, k, n in layer_shapes(spec)}
    return [("qkv", by["q"][0], by["q"][1] + 2 * by["k"][1]), ("gate_up", by["gate"][0], 2 * by["gate"][1])]


def _emit(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)


def _guarded(rows: list[dict[str, Any]], what: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> None:
    """One measurement; a failure becomes an error row and the run goes on."""
    try:
        _emit(rows, {**what, **fn()})
    except Exception as e:  # noqa: BLE001 - a bench run keeps its other rows
        _emit(rows, {**what, "error": f"{type(e).__name__}: {e}"[:400]})
        traceback.print_exc(file=sys.stderr)


def equal_rows(a: mx.array, b: mx.array) -> int:
    """Rows of a and b equal bit for bit."""
    bits = {2: mx.uint16, 4: mx.uint32}[a.dtype.size]
    return int(mx.all(mx.view(a, bits) == mx.view(b, bits), axis=-1).sum().item())


def call_ms(fn: Callable[[], mx.array], reps: int) -> float:
    mx.eval(fn())
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - tic)
    return statistics.median(times) * 1e3


def _operands(k: int, n: int, dtype: mx.Dtype, seed: int) -> tuple[mx.array, mx.array]:
    key = mx.random.key(seed)
    x = mx.random.normal((ROWS, k), dtype=dtype, scale=0.5, key=key)
    w = mx.random.normal((n, k), dtype=dtype, scale=k ** -0.5, key=mx.random.split(key)[0])
    mx.eval(x, w)
    return x, w


def one_row_products(x: mx.array, w: mx.array) -> mx.array:
    return mx.concatenate([x[i : i + 1] @ w.T for i in range(x.shape[0])], axis=0)


def check_shape(rows: list, name: str, k: int, n: int, dtype: mx.Dtype, reps: int, few_rows: bool) -> None:
    base = {"part": "rowwise", "dtype": str(dtype).split(".")[-1], "matmul": name, "k": k, "n": n,
            "npt": cr.n_per_thread(k)}
    try:
        x, w = _operands(k, n, dtype, seed=k * 7 + n)
        one = one_row_products(x, w)
        mx.eval(one)
    except Exception as e:  # noqa: BLE001
        _emit(rows, {**base, "error": f"{type(e).__name__}: {e}"[:400]})
        return
    _guarded(rows, {**base, "kernel": "mlx"}, lambda: {
        "gemm_equal_rows": equal_rows(x @ w.T, one), "gemm_ms": call_ms(lambda: x @ w.T, reps),
        "one_row_ms": call_ms(lambda: x[:1] @ w.T, reps)})

    def measure() -> dict[str, Any]:
        tic = time.perf_counter()
        out = cr.rowwise_matmul(x, w)
        mx.eval(out)
        row = {"equal_rows": equal_rows(out, one), "first_call_s": round(time.perf_counter() - tic, 3)}
        if few_rows:
            for m in (2, 7):
                row[f"equal_rows_of_{m}"] = equal_rows(cr.rowwise_matmul(x[:m], w), one[:m])
        row["ms"] = call_ms(lambda: cr.rowwise_matmul(x, w), reps)
        return row

    _guarded(rows, {**base, "kernel": "rowwise"}, measure)


def chain(rows: list, spec: dict[str, Any], layers: int, dtype: mx.Dtype, reps: int) -> None:
    """A verify's matmuls (layers x 7 + head, each with its own weights) in one lazy graph, also with
    the products that share an input as one (q, k, v; gate, up)."""
    shapes = layer_shapes(spec)
    weights: list[tuple[int, mx.array]] = []
    for li in range(layers):
        for name, k, n in shapes[:-1]:
            weights.append((k, mx.random.normal((n, k), dtype=dtype, scale=k ** -0.5, key=mx.random.key(li * 31 + n))))
        mx.eval([w for _, w in weights[-7:]])
    _, hk, hn = shapes[-1]
    weights.append((hk, mx.random.normal((hn, hk), dtype=dtype, scale=hk ** -0.5, key=mx.random.key(7))))
    xs = {k: mx.random.normal((ROWS, k), dtype=dtype, scale=0.5, key=mx.random.key(k)) for k, _ in weights}
    mx.eval(weights[-1][1], list(xs.values()))
    gb = sum(w.nbytes for _, w in weights) / 1e9
    modes: dict[str, Callable[[mx.array, mx.array], Any]] = {
        "gemm": lambda x, w: x @ w.T,
        "gemm_weights_first": lambda x, w: (w @ x.T).T,  # the same product as N x 16: another cuBLAS algorithm
        "one_row": lambda x, w: x[:1] @ w.T,  # a decode step's matmuls: what the weights' reading costs
        "one_row_x16": lambda x, w: [x[i : i + 1] @ w.T for i in range(ROWS)],
        "rowwise": lambda x, w: cr.rowwise_matmul(x, w),
    }
    base = {"part": "rowwise chain", "dtype": str(dtype).split(".")[-1], "layers": layers, "matmuls": len(weights),
            "weight_gb": round(gb, 2)}
    for mode, fn in modes.items():
        _guarded(rows, {**base, "mode": mode}, lambda fn=fn: {
            "ms": call_ms(lambda: [fn(xs[k], w) for k, w in weights], reps)})
    if layers:
        # The products that share an input as one launch each (q, k, v; gate, up): what a kernel
        # taking several weights would cost. Every feature's sums are the same either way.
        fused: list[tuple[int, mx.array]] = []
        for li in range(layers):
            (k, wq), (_, wk), (_, wv), o, (kg, wg), (_, wu), down = weights[7 * li : 7 * li + 7]
            fused += [(k, mx.concatenate([wq, wk, wv])), o, (kg, mx.concatenate([wg, wu])), down]
            mx.eval(fused[-4][1], fused[-2][1])
        fused.append(weights[-1])
        _guarded(rows, {**base, "mode": "fused_rowwise", "matmuls": len(fused)}, lambda: {
            "ms": call_ms(lambda: [cr.rowwise_matmul(xs[k], w) for k, w in fused], reps)})
        _guarded(rows, {**base, "mode": "fused_gemm", "matmuls": len(fused)}, lambda: {
            "ms": call_ms(lambda: [xs[k] @ w.T for k, w in fused], reps)})
        fused.clear()

        # The same groups by the kernel that takes several weights (no concatenated copies).
        groups = []
        for li in range(layers):
            (k, wq), (_, wk), (_, wv), (ko, wo), (kg, wg), (_, wu), (kd, wd) = weights[7 * li : 7 * li + 7]
            groups += [(k, [wq, wk, wv]), (ko, [wo]), (kg, [wg, wu]), (kd, [wd])]
        groups.append((weights[-1][0], [weights[-1][1]]))
        _guarded(rows, {**base, "mode": "several_weights", "matmuls": len(groups)}, lambda: {
            "ms": call_ms(lambda: [cr.rowwise_matmuls(xs[k], g) for k, g in groups], reps)})
    weights.clear()  # the chain's gigabytes go before the next dtype's
    xs.clear()


def check_several(rows: list, spec: dict[str, Any], dtype: mx.Dtype) -> None:
    """Bit-equality of the kernel that takes several weights (q, k, v; gate, up) with one-row products."""
    by = {name: (k, n) for name, k, n in layer_shapes(spec)}
    for group in (["q", "k", "v"], ["gate", "up"]):
        k = by[group[0]][0]
        base = {"part": "rowwise several", "dtype": str(dtype).split(".")[-1], "matmuls": "+".join(group), "k": k}

        def measure(group: list[str] = group, k: int = k) -> dict[str, Any]:
            x, _ = _operands(k, 8, dtype, seed=k)
            ws = [_operands(k, by[name][1], dtype, seed=by[name][1] * 3 + i)[1] for i, name in enumerate(group)]
            outs = cr.rowwise_matmuls(x, ws)
            return {"equal_rows": [equal_rows(o, one_row_products(x, w)) for o, w in zip(outs, ws)],
                    "equal_rows_of_7": [equal_rows(o, one_row_products(x[:7], w))
                                        for o, w in zip(cr.rowwise_matmuls(x[:7], ws), ws)],
                    "ms": call_ms(lambda: cr.rowwise_matmuls(x, ws), 20),
                    "separate_ms": call_ms(lambda: [cr.rowwise_matmul(x, w) for w in ws], 20)}

        _guarded(rows, base, measure)


def _exact(r: dict[str, Any]) -> bool:
    return r.get("equal_rows") == ROWS and all(r.get(f"equal_rows_of_{m}", m) == m for m in (2, 7))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape the row-wise kernel's time beside MLX's gemm; the chains; the shapes whose rows
    were not all equal to the one-row products."""
    per_shape: dict[str, Any] = {}
    for r in rows:
        if r.get("part") == "rowwise" and "error" not in r:
            entry = per_shape.setdefault(f'{r["dtype"]} {r["matmul"]} {r["k"]}->{r["n"]}', {})
            if r["kernel"] == "mlx":
                entry["gemm_ms"] = round(r["gemm_ms"], 4)
            else:
                entry["rowwise_ms"] = round(r["ms"], 4)
    chains: dict[str, Any] = {}
    for r in rows:
        if r.get("part") == "rowwise chain" and "ms" in r:
            chains.setdefault(r["dtype"], {})[r["mode"]] = round(r["ms"], 3)
    return {"per_shape": per_shape, "chain_ms": chains,
            "inexact": sorted({f'{r["dtype"]} {r["k"]}->{r["n"]}' for r in rows
                               if r.get("part") == "rowwise" and r.get("kernel") == "rowwise" and not _exact(r)})}


def run(shape: str, dtypes: list[mx.Dtype], layers: int | None = None, reps: int = 20,
        chain_reps: int = 3, extra: bool = True) -> list[dict[str, Any]]:
    spec = SHAPES[shape]
    rows: list[dict[str, Any]] = []
    for di, dtype in enumerate(dtypes):
        shapes = layer_shapes(spec)
        seen = set()
        for name, k, n in shapes + fused_shapes(spec):
            if (k, n) not in seen:
                seen.add((k, n))
                check_shape(rows, name, k, n, dtype, reps, few_rows=(di == 0 and name == "q"))
        check_several(rows, spec, dtype)
        n_layers = layers or spec["dims"]["layers"]
        try:
            chain(rows, spec, n_layers, dtype, chain_reps)
        except Exception as e:  # noqa: BLE001 - e.g. the weights do not fit: the shape rows stand
            _emit(rows, {"part": "rowwise chain", "dtype": str(dtype).split(".")[-1], "mode": "setup",
                         "error": f"{type(e).__name__}: {e}"[:400]})
        if di == 0 and extra:  # other K only in the first dtype (fewer compiles), after its chain
            for k, n in EXTRA.get(shape, EXTRA[""]):
                check_shape(rows, "extra", k, n, dtype, reps, few_rows=False)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=[s for s in SHAPES if SHAPES[s]["kind"] == "qwen3" and "bits" not in SHAPES[s]],
                   default="tiny")
    p.add_argument("--dtypes", nargs="+", choices=["bfloat16", "float16", "float32"], default=["bfloat16", "float16"])
    p.add_argument("--layers", type=int, help="layers in the chain (default: the shape's)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--chain-reps", type=int, default=3, help="timed evaluations of each chain (median)")
    p.add_argument("--no-extra", action="store_true", help="only the shape's own matmuls")
    args = p.parse_args(argv)
    require_at_least(p, args, {"layers": 1, "reps": 1, "chain_reps": 1})
    rows = run(args.shape, [getattr(mx, d) for d in args.dtypes], args.layers, args.reps,
               chain_reps=args.chain_reps, extra=not args.no_extra)
    info = {"device": str(mx.default_device()), "cuda": on_cuda(), "shape": args.shape, "mlx": mx.__version__}
    print(json.dumps({"info": info, "summary": summary(rows), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
