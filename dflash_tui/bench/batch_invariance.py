"""Benchmark (not a test): do a verify's rows equal single decode steps, bit for bit?

A 16-token verify and 16 single-token decode steps compute the same rows, but on a GPU
with different kernels (a gemm against a gemv, multi-query against single-query
attention), so their bf16 results can round differently and a near-tie flips a token.
This script measures, on one random-weight real-shape target, how many of a verify's
rows equal the decode steps' bit for bit, part by part and for the whole model:

- `linear`: one weight matrix, `x @ W.T` on 16 rows (MLX's gemm) and the row-wise kernel
  (engine/cuda_rowwise.py: each row reduced in the order of MLX CUDA's gemv), each against
  the 16 one-row products (MLX's gemv);
- `rowwise`: the row-wise kernel, shape by shape and in a verify-long chain
  (bench/rowwise.py);
- `attention`: 16 queries over a KV cache grown as decoding grows it, MLX's multi-query
  attention and per-query calls on the cache's own slices, against the decode steps;
- `per-row ops`: RMSNorm, RoPE at an offset, SwiGLU on 16 rows against one row;
- `model`: the target's logits for a 16-token verify (plain, and with the candidate
  linears and per-query attention swapped in) against 16 decode steps.

It prints JSON: equal rows out of 16 per part, the largest difference, and times.

    python -m dflash_tui.bench.batch_invariance --shape qwen3-4b --context 100 300 1000
    python -m dflash_tui.bench.batch_invariance --shape tiny   # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from dflash_tui import random_pair as rp
from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.cycle_cost import SHAPES
from dflash_tui.engine.cuda_kernels import on_cuda
from dflash_tui.engine.cuda_rowwise import rowwise_matmul

ROWS = 16

class RowwiseLinear(nn.Linear):
    """nn.Linear whose 2..16-row products are row-wise (a class swapped onto instances). With a
    bias MLX's one-row product is cuBLAS's addmm, not its gemv: left as it is."""

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return super().__call__(x)
        return rowwise_matmul(x, self.weight)


class RowwiseEmbedding(nn.Embedding):
    def as_linear(self, x: mx.array) -> mx.array:
        return rowwise_matmul(x, self.weight)


def per_query_sdpa(original: Callable) -> Callable:
    """mlx-lm's attention call with a causal L-query call split into L one-query calls, each
    over the cache's own slice up to its position (what a decode step passes)."""

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        n = queries.shape[2]
        if n == 1 or mask != "causal" or sinks is not None:
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        s = keys.shape[2]
        by_token = queries.transpose(0, 2, 1, 3)
        # each query laid out as a decode step's is ([B, 1, H, D] contiguous, seen as [B, H, 1, D]):
        # MLX CUDA picks its attention kernel by the arrays' strides too
        outs = [original(mx.contiguous(by_token[:, i : i + 1]).transpose(0, 2, 1, 3), keys[:, :, : s - n + i + 1],
                         values[:, :, : s - n + i + 1], cache=cache, scale=scale, mask=None) for i in range(n)]
        return mx.concatenate(outs, axis=2)

    return sdpa


def swap_in_candidates(model: nn.Module) -> None:
    """Give every Linear, the tied head and every attention module the candidates above."""
    for _, module in model.named_modules():
        if type(module) is nn.Linear:
            module.__class__ = RowwiseLinear
        elif type(module) is nn.Embedding:
            module.__class__ = RowwiseEmbedding
        else:
            fn = getattr(type(module), "__call__", None)
            g = getattr(fn, "__globals__", {})
            if fn is not None and "scaled_dot_product_attention" in getattr(fn, "__code__", types.CodeType).co_names \
                    and "scaled_dot_product_attention" in g:
                patched = dict(g, scaled_dot_product_attention=per_query_sdpa(g["scaled_dot_product_attention"]))
                call = types.FunctionType(fn.__code__, patched, fn.__name__, fn.__defaults__, fn.__closure__)
                module.__class__ = type(f"PerQuery{type(module).__name__}", (type(module),), {"__call__": call})


def _rows_equal(a: mx.array, b: mx.array) -> tuple[int, float]:
    """Rows (first axis after flattening to [16, -1]) equal bit for bit, and the largest difference."""
    a2, b2 = a.reshape(ROWS, -1), b.reshape(ROWS, -1)
    same = sum(bool(mx.array_equal(a2[i], b2[i]).item()) for i in range(ROWS))
    return same, float(mx.abs(a2.astype(mx.float32) - b2.astype(mx.float32)).max().item())


def _timed(fn: Callable[[], mx.array], reps: int = 20) -> float:
    mx.eval(fn())
    tic = time.perf_counter()
    for _ in range(reps):
        mx.eval(fn())
    return (time.perf_counter() - tic) / reps * 1e3


def check_linear(k: int, n: int, dtype: mx.Dtype) -> dict[str, Any]:
    mx.random.seed(3)
    x = (mx.random.normal((ROWS, k)) * 0.5).astype(dtype)
    w = (mx.random.normal((n, k)) * k ** -0.5).astype(dtype)
    one = mx.concatenate([x[i : i + 1] @ w.T for i in range(ROWS)], axis=0)
    gemm = x @ w.T
    row = {"part": "linear", "k": k, "n": n, "gemm_equal_rows": _rows_equal(gemm, one)[0],
           "gemm_ms": _timed(lambda: x @ w.T), "one_row_ms": _timed(lambda: x[:1] @ w.T)}
    row["rowwise_equal_rows"] = _rows_equal(rowwise_matmul(x, w), one)[0]
    row["rowwise_ms"] = _timed(lambda: rowwise_matmul(x, w))
    return row


def check_quantized_linear(k: int, n: int, dtype: mx.Dtype, bits: int = 4) -> dict[str, Any]:
    """mlx-lm's 4-bit layers: MLX's quantized matmul on 16 rows against one row (qmv)."""
    mx.random.seed(3)
    x = (mx.random.normal((ROWS, k)) * 0.5).astype(dtype)
    wq, scales, biases = mx.quantize((mx.random.normal((n, k)) * k ** -0.5).astype(dtype), 64, bits)
    qmm = lambda a: mx.quantized_matmul(a, wq, scales, biases, transpose=True, group_size=64, bits=bits)  # noqa: E731
    one = mx.concatenate([qmm(x[i : i + 1]) for i in range(ROWS)], axis=0)
    return {"part": f"{bits}-bit linear", "k": k, "n": n, "qmm_equal_rows": _rows_equal(qmm(x), one)[0],
            "qmm_ms": _timed(lambda: qmm(x)), "one_row_ms": _timed(lambda: qmm(x[:1]))}


def check_rowwise_quant(k: int, n: int, dtype: mx.Dtype, bits: int, chain: int, group_size: int = 64) -> dict[str, Any]:
    """A quantized linear on 16 rows: MLX's own call (qmm), the row-wise kernel
    (engine/cuda_rowwise_quant, alone and as three products of one input in one launch) and
    MLX's qmv on slices of at most 7 rows, each against 16
    one-row calls (qmv); single-call times, and `chain` calls on distinct weight copies built
    lazily and evaluated once (as a verify's layers are). Each case fails on its own."""
    from dflash_tui.bench import qmv_order
    from dflash_tui.engine import cuda_rowwise_quant as rq

    mx.random.seed(3)
    x = (mx.random.normal((ROWS, k)) * 0.5).astype(dtype)
    packed = mx.quantize((mx.random.normal((n, k)) * k ** -0.5).astype(dtype), group_size, bits)
    qmm = lambda a, p=packed: mx.quantized_matmul(a, *p, transpose=True, group_size=group_size, bits=bits)

    def rowwise(a: mx.array, p: tuple = packed) -> mx.array:
        out = rq.rowwise_quantized_matmul(a, *p, group_size, bits)
        if out is None:
            raise ValueError("MLX's one-row call here is not the qmv the kernel replays")
        return out

    paths = {"qmm": qmm, "rowwise": rowwise,
             "qmv16": lambda a, p=packed: mx.concatenate([qmm(a[i : i + 1], p) for i in range(ROWS)]),
             "qmv7": lambda a, p=packed: mx.concatenate([qmm(a[i : i + 7], p) for i in range(0, ROWS, 7)])}
    row: dict[str, Any] = {"part": "rowwise-quant", "bits": bits, "group_size": group_size, "k": k, "n": n}

    def case(key: str, measure: Callable[[], Any]) -> None:
        try:
            row[key] = measure()
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:2000]

    one = paths["qmv16"](x)
    mx.eval(one)
    for name, fn in paths.items():
        if name != "qmv16":
            case(f"{name}_equal_rows", lambda f=fn: _rows_equal(f(x), one)[0])
            case(f"{name}_max_diff", lambda f=fn: _rows_equal(f(x), one)[1])
        case(f"{name}_ms", lambda f=fn: _timed(lambda: f(x)))
    # MLX's qmv against a NumPy replay of the order the kernel follows (first 256 features)
    case("numpy_qmv_equal_rows", lambda: _rows_equal(mx.array(qmv_order.qmv_rows(
        x, *packed, group_size, bits, 256).astype("float32")).astype(dtype), one[:, :256])[0])
    # distinct weight copies (at most ~2 GB of them: fewer for the head), as a model's layers are
    copies = [packed]
    for _ in range(min(chain, int(2e9 // sum(a.nbytes for a in packed))) - 1):
        copies.append(mx.quantize((mx.random.normal((n, k)) * k ** -0.5).astype(dtype), group_size, bits))
        mx.eval(copies[-1])
    for name, fn in paths.items():
        case(f"chain_{name}_ms", lambda f=fn: _timed(lambda: [f(x, copies[i % len(copies)]) for i in range(chain)], 5))
    # three products of one input (q, k, v; gate, up): one launch against three
    three = copies[:3] if len(copies) >= 3 else [packed] * 3
    case("three_separate_ms", lambda: _timed(lambda: [rowwise(x, p) for p in three]))
    case("three_one_launch_ms", lambda: _timed(lambda: rq.rowwise_quantized_matmuls(x, three, group_size, bits)))
    row["chain_copies"] = len(copies)
    return row


def _attention_case(heads: int, kv_heads: int, head_dim: int, context: int, dtype: mx.Dtype, seed: int):
    """Random keys/values for `context` + 16 positions and 16 queries (laid out as mlx-lm lays
    them out); the 16 decode steps' outputs ([1, H, 16, D], each one MLX call on a KVCache grown
    a token at a time, the query laid out as a step's) and the verify's keys and values (a second
    KVCache given the 16 positions at once). -> q, scale, k_all, v_all, steps, keys, values."""
    from mlx_lm.models.cache import KVCache

    mx.random.seed(seed)
    k_all = mx.random.normal((1, kv_heads, context + ROWS, head_dim)).astype(dtype)
    v_all = mx.random.normal((1, kv_heads, context + ROWS, head_dim)).astype(dtype)
    q = mx.random.normal((1, ROWS, heads, head_dim)).astype(dtype).transpose(0, 2, 1, 3)
    scale = head_dim ** -0.5
    step_cache, block_cache = KVCache(), KVCache()
    for c in (step_cache, block_cache):
        c.update_and_fetch(k_all[:, :, :context], v_all[:, :, :context])
    mx.eval(step_cache.keys, block_cache.keys)
    steps = []
    for i in range(ROWS):
        keys, values = step_cache.update_and_fetch(k_all[:, :, context + i : context + i + 1],
                                                   v_all[:, :, context + i : context + i + 1])
        q_step = mx.contiguous(q.transpose(0, 2, 1, 3)[:, i : i + 1]).transpose(0, 2, 1, 3)
        steps.append(mx.fast.scaled_dot_product_attention(q_step, keys, values, scale=scale, mask=None))
        mx.eval(steps[-1])
    keys, values = block_cache.update_and_fetch(k_all[:, :, context:], v_all[:, :, context:])
    mx.eval(keys, values)
    return q, scale, k_all, v_all, mx.concatenate(steps, axis=2), keys, values


def check_attention(heads: int, kv_heads: int, head_dim: int, context: int, dtype: mx.Dtype) -> dict[str, Any]:
    from mlx_lm.models.cache import KVCache

    q, scale, k_all, v_all, steps, keys, values = _attention_case(heads, kv_heads, head_dim, context, dtype, seed=4)
    steps = steps.transpose(0, 2, 1, 3)
    fused = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask="causal").transpose(0, 2, 1, 3)
    per_query = per_query_sdpa(lambda *a, **kw: mx.fast.scaled_dot_product_attention(
        a[0], a[1], a[2], scale=kw["scale"], mask=kw["mask"]))
    split = per_query(q, keys, values, None, scale, "causal").transpose(0, 2, 1, 3)
    # as inside a model: the verify's keys are the cache update of the same graph, not evaluated first
    lazy_cache = KVCache()
    lazy_cache.update_and_fetch(k_all[:, :, :context], v_all[:, :, :context])
    mx.eval(lazy_cache.keys)
    lazy_keys, lazy_values = lazy_cache.update_and_fetch(k_all[:, :, context:] * 1, v_all[:, :, context:] * 1)
    lazy = per_query(q * 1, lazy_keys, lazy_values, None, scale, "causal").transpose(0, 2, 1, 3)
    return {"part": "attention", "context": context, "per_query_in_graph_equal_rows": _rows_equal(lazy, steps)[0],
            "fused_equal_rows": _rows_equal(fused, steps)[0], "per_query_equal_rows": _rows_equal(split, steps)[0],
            "per_query_max_diff": _rows_equal(split, steps)[1],
            "fused_ms": _timed(lambda: mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask="causal")),
            "per_query_ms": _timed(lambda: per_query(q, keys, values, None, scale, "causal"))}


def check_step_attention(heads: int, kv_heads: int, head_dim: int, context: int, dtype: mx.Dtype) -> dict[str, Any]:
    """16 verify queries over a KVCache against 16 decode steps: MLX's multi-query call, one
    MLX call per query, the step-attention kernel on every row (CUDA, head dims 64/96/128)
    and `step_attention` as routed (kernel where exact, MLX calls where the step is cuDNN's);
    times of one call and of 36 layers' calls in one graph."""
    from dflash_tui.engine import cuda_step_attention as sa

    q, scale, _, _, steps, keys, values = _attention_case(heads, kv_heads, head_dim, context, dtype, seed=5)
    row: dict[str, Any] = {"part": "step-attention", "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                           "context": context, "cudnn_decoding": sa.cudnn_decoding(),
                           "step_kernels": sorted({sa.single_query_kernel(context + i + 1, head_dim)
                                                   for i in range(ROWS)})}
    variants = {"fused": lambda: mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask="causal"),
                "per_query": lambda: sa.per_query_attention(q, keys, values, scale),
                "routed": lambda: sa.step_attention(q, keys, values, scale)}
    if sa.on_cuda() and head_dim in sa.VECTOR_HEAD_DIMS:
        variants["kernel"] = lambda: sa.step_attention_kernel(q, keys, values, scale)
    for name, fn in variants.items():
        try:
            out = fn()
            mx.eval(out)
            same = [bool(mx.array_equal(out[:, :, i], steps[:, :, i]).item()) for i in range(ROWS)]
            row[f"{name}_equal_rows"] = sum(same)
            row[f"{name}_rows"] = "".join("=" if x else "x" for x in same)
            row[f"{name}_max_diff"] = float(mx.abs(out.astype(mx.float32) - steps.astype(mx.float32)).max().item())
            row[f"{name}_repeatable"] = bool(mx.array_equal(fn(), out).item())
            row[f"{name}_ms"] = _timed(fn)
            row[f"{name}_36_layers_ms"] = _timed(lambda: [fn() for _ in range(36)], reps=5)  # noqa: B023
        except Exception as e:  # one variant failing must not lose the others
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def step_attention_rows(shape: str, contexts: list[int], dtype: mx.Dtype) -> list[dict[str, Any]]:
    """`check_step_attention` for the shape's attention and, beside a real shape, Qwen3.5's
    full-attention layers (256-wide heads); each row printed to stderr as soon as measured."""
    rows = []
    for name in [shape] + (["qwen3.5-4b"] if shape != "tiny" else []):
        d = SHAPES[name]["dims"]
        for c in contexts:
            try:
                row = check_step_attention(d["heads"], d["kv_heads"], d["head_dim"], c, dtype)
            except Exception as e:
                row = {"part": "step-attention", "shape": name, "context": c, "error": f"{type(e).__name__}: {e}"[:300]}
            row["shape"] = name
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def check_row_ops(hidden: int, heads: int, head_dim: int, dtype: mx.Dtype) -> dict[str, Any]:
    from mlx_lm.models.activations import swiglu

    mx.random.seed(5)
    x = mx.random.normal((1, ROWS, hidden)).astype(dtype)
    w = (1 + 0.1 * mx.random.normal((hidden,))).astype(dtype)
    qh = mx.random.normal((1, heads, ROWS, head_dim)).astype(dtype)
    gate, up = x * 1.5, x - 0.25
    norm = mx.fast.rms_norm(x, w, 1e-6)
    norm_one = mx.concatenate([mx.fast.rms_norm(x[:, i : i + 1], w, 1e-6) for i in range(ROWS)], axis=1)
    rope = mx.fast.rope(qh, head_dim, traditional=False, base=1e6, scale=1.0, offset=200)
    rope_one = mx.concatenate([mx.fast.rope(qh[:, :, i : i + 1], head_dim, traditional=False, base=1e6, scale=1.0,
                                            offset=200 + i) for i in range(ROWS)], axis=2)
    act = swiglu(gate, up)
    act_one = mx.concatenate([swiglu(gate[:, i : i + 1], up[:, i : i + 1]) for i in range(ROWS)], axis=1)
    return {"part": "per-row ops", "rms_norm_equal_rows": _rows_equal(norm[0], norm_one[0])[0],
            "rope_equal_rows": _rows_equal(rope.transpose(0, 2, 1, 3), rope_one.transpose(0, 2, 1, 3))[0],
            "swiglu_equal_rows": _rows_equal(act[0], act_one[0])[0]}


def _recording(module: nn.Module, sink: list) -> None:
    """Make one module instance append its outputs to `sink` (a subclass swapped onto it once)."""
    base = getattr(type(module), "_bench_base", type(module))

    def __call__(self, *args, **kwargs):
        out = base.__call__(self, *args, **kwargs)
        self._bench_sink.append(out)
        return out

    if type(module) is base:
        module.__class__ = type(f"Recording{base.__name__}", (base,), {"__call__": __call__, "_bench_base": base})
    object.__setattr__(module, "_bench_sink", sink)


def first_difference(model: nn.Module, vocab: int, context: int) -> dict[str, Any]:
    """Where the verify first parts from the decode steps: per layer, the attention's and the
    MLP's outputs (rows equal out of 16)."""
    layers = model.model.layers
    sinks = {(i, part): [] for i in range(len(layers)) for part in ("attn", "mlp")}
    for i, layer in enumerate(layers):
        _recording(layer.self_attn, sinks[(i, "attn")])
        _recording(layer.mlp, sinks[(i, "mlp")])
    mx.random.seed(6)
    prompt = mx.random.randint(0, vocab, (context + ROWS,))
    caches = [make_prompt_cache(model) for _ in range(2)]
    for c in caches:
        mx.eval(model(prompt[None, :context], cache=c))
    for sink in sinks.values():
        sink.clear()
    for i in range(ROWS):
        mx.eval(model(prompt[None, context + i : context + i + 1], cache=caches[0]))
    steps = {key: mx.concatenate(sink, axis=1) for key, sink in sinks.items()}
    for sink in sinks.values():
        sink.clear()
    mx.eval(model(prompt[None, context:], cache=caches[1]))
    for i in range(len(layers)):
        for part in ("attn", "mlp"):
            same = _rows_equal(sinks[(i, part)][0], steps[(i, part)])[0]
            if same < ROWS:
                return {"part": "first difference", "context": context, "layer": i, "module": part, "equal_rows": same}
    return {"part": "first difference", "context": context, "layer": None}


def check_model(model: nn.Module, vocab: int, context: int, candidates: bool) -> dict[str, Any]:
    """16 decode steps against one 16-token forward, from the same prefilled cache."""
    mx.random.seed(6)
    prompt = mx.random.randint(0, vocab, (context + ROWS,))
    caches = [make_prompt_cache(model) for _ in range(2)]
    for c in caches:
        mx.eval(model(prompt[None, :context], cache=c))
    steps = []
    for i in range(ROWS):
        steps.append(model(prompt[None, context + i : context + i + 1], cache=caches[0]))
        mx.eval(steps[-1])
    steps = mx.concatenate(steps, axis=1)[0]
    block = model(prompt[None, context:], cache=caches[1])[0]
    mx.eval(block)
    same, diff = _rows_equal(block, steps)
    agree = int((block.argmax(-1) == steps.argmax(-1)).sum().item())

    def verify_again() -> mx.array:
        for c in caches[1]:
            c.trim(ROWS)
        return model(prompt[None, context:], cache=caches[1])

    def step_again() -> mx.array:
        for c in caches[0]:
            c.trim(1)
        return model(prompt[None, -1:], cache=caches[0])

    return {"part": "model", "context": context, "candidates": candidates, "equal_rows": same, "max_diff": diff,
            "argmax_agree": agree, "verify_ms": _timed(verify_again, 10), "step_ms": _timed(step_again, 10)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=[s for s in SHAPES if SHAPES[s]["kind"] == "qwen3"], default="tiny")
    p.add_argument("--context", type=int, nargs="+", default=[100])
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--parts", nargs="+",
                   choices=["linear", "rowwise", "attention", "row-ops", "model", "step-attention", "rowwise-quant"],
                   default=["linear", "attention", "row-ops", "model"])
    p.add_argument("--chain", type=int, default=36, help="rowwise-quant: calls in a timed chain (a verify's layers)")
    args = p.parse_args(argv)
    require_at_least(p, args, {"context": 1, "chain": 1})
    dtype = getattr(mx, args.dtype)
    spec = SHAPES[args.shape]
    d = spec["dims"]
    rows: list[dict[str, Any]] = []
    if "linear" in args.parts:
        for k, n in ((d["hidden"], d["heads"] * d["head_dim"]), (d["hidden"], d["intermediate"]),
                     (d["intermediate"], d["hidden"]), (d["hidden"], spec["vocab"])):
            rows.append(check_linear(k, n, dtype))
        rows.append(check_quantized_linear(d["hidden"], d["intermediate"], dtype))
    if "rowwise" in args.parts:
        from dflash_tui.bench import rowwise

        rows += rowwise.run(args.shape, [dtype])
    if "rowwise-quant" in args.parts:
        for bits in (4, 8):
            for k, n in ((d["hidden"], d["heads"] * d["head_dim"]), (d["hidden"], d["kv_heads"] * d["head_dim"]),
                         (d["hidden"], d["intermediate"]), (d["intermediate"], d["hidden"]), (d["hidden"], spec["vocab"])):
                rows.append(check_rowwise_quant(k, n, dtype, bits, args.chain))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if "attention" in args.parts:
        for c in args.context:
            rows.append(check_attention(d["heads"], d["kv_heads"], d["head_dim"], c, dtype))
    if "step-attention" in args.parts:
        rows += step_attention_rows(args.shape, args.context, dtype)
    if "row-ops" in args.parts:
        rows.append(check_row_ops(d["hidden"], d["heads"], d["head_dim"], dtype))
    if "model" in args.parts:
        model = rp.build_model(rp.qwen3_config(spec["vocab"], **d), seed=0, dtype=dtype)
        for c in args.context:
            rows.append(check_model(model, spec["vocab"], c, candidates=False))
        swap_in_candidates(model)
        for c in args.context:
            rows.append(check_model(model, spec["vocab"], c, candidates=True))
        for c in args.context:
            rows.append(first_difference(model, spec["vocab"], c))
    info = {"device": str(mx.default_device()), "cuda": on_cuda(), "shape": args.shape, "dtype": args.dtype,
            "mlx": mx.__version__}
    print(json.dumps({"info": info, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
