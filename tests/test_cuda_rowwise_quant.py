"""The row-wise quantized matmul: its CPU path is MLX's own call, its arguments are checked,
and (where nvcc is) every instantiation of its CUDA source compiles. Bit-equality with MLX's
qmv is checked on the device by `bench/batch_invariance --parts rowwise-quant`."""

from __future__ import annotations

import json

import cuda_compile as cc
import mlx.core as mx
import numpy as np
import pytest
from cuda_compile import needs_nvcc

from dflash_tui.engine import cuda_rowwise_quant as rq


def _quantized(n: int, k: int, dtype: mx.Dtype, group_size: int, bits: int, rows: int = 16):
    mx.random.seed(11)
    x = mx.random.normal((rows, k)).astype(dtype)
    wq, scales, biases = mx.quantize((mx.random.normal((n, k)) * k ** -0.5).astype(dtype), group_size, bits)
    return x, wq, scales, biases


@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 32), (8, 64), (8, 32)])
def test_cpu_path_is_mlx_quantized_matmul(bits, group_size):
    x, wq, scales, biases = _quantized(96, 256, mx.bfloat16, group_size, bits)
    got = rq.rowwise_quantized_matmul(x, wq, scales, biases, group_size, bits)
    want = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group_size, bits=bits)
    assert got.shape == (16, 96) and got.dtype == mx.bfloat16
    assert mx.array_equal(got, want)
    # a [1, L, K] activation keeps its leading axes
    got3 = rq.rowwise_quantized_matmul(x[None, :5], wq, scales, biases, group_size, bits)
    assert got3.shape == (1, 5, 96) and mx.array_equal(got3[0], want[:5])


def test_replays_qmv_only_for_the_cases_whose_one_row_call_is_qmv():
    x, wq, scales, biases = _quantized(64, 256, mx.bfloat16, 64, 4)
    assert rq.replays_qmv(x, wq, scales, biases, 64, 4)
    assert rq.replays_qmv(x[:1], wq, scales, biases, 64, 4)
    assert not rq.replays_qmv(x, wq, scales, None, 64, 4)  # no biases: not affine
    assert not rq.replays_qmv(x.astype(mx.float32), wq, scales, biases, 64, 4)
    assert not rq.replays_qmv(mx.concatenate([x, x[:1]]), wq, scales, biases, 64, 4)  # 17 rows
    x3, wq3, s3, b3 = _quantized(64, 256, mx.bfloat16, 64, 3)
    assert not rq.replays_qmv(x3, wq3, s3, b3, 64, 3)  # 3-bit: not replayed
    # a group as wide as K: MLX's per-channel sm90 gemm may take even one row
    xk, wqk, sk, bk = _quantized(64, 64, mx.bfloat16, 64, 4)
    assert not rq.replays_qmv(xk, wqk, sk, bk, 64, 4)
    assert not rq.replays_qmv(x, wq, scales, biases, 32, 4)  # wrong group size for these scales


@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 32), (8, 64)])
def test_numpy_qmv_replay_computes_the_quantized_product(bits, group_size):
    from dflash_tui.bench import qmv_order

    x, wq, scales, biases = _quantized(48, 1024 + 3 * group_size, mx.bfloat16, group_size, bits, rows=3)
    w = np.array(mx.dequantize(wq, scales, biases, group_size, bits).astype(mx.float32), dtype=np.float64)
    want = np.array(x.astype(mx.float32), dtype=np.float64) @ w.T  # the exact product
    full = qmv_order.qmv_rows(x, wq, scales, biases, group_size, bits)
    assert full.shape == (3, 48)
    # rounded in bf16 along the way: close, not equal
    assert np.abs(full - want).max() <= 0.02 * np.abs(want).max()
    assert np.array_equal(full, qmv_order.round_bf16(full))  # every value is a bf16 value
    # only the first features when asked
    assert np.array_equal(qmv_order.qmv_rows(x, wq, scales, biases, group_size, bits, features=5), full[:, :5])


def test_round_bf16_rounds_to_nearest_even():
    from dflash_tui.bench.qmv_order import round_bf16 as r

    one_ulp = 2.0 ** -7  # bf16 spacing just above 1
    assert r(np.array([1 + one_ulp / 2]))[0] == 1.0  # tie to even (down)
    assert r(np.array([1 + 3 * one_ulp / 2]))[0] == 1 + 2 * one_ulp  # tie to even (up)
    assert r(np.array([1 + one_ulp * 0.51]))[0] == 1 + one_ulp
    vals = np.array([3.14159, -2.71828, 1e-3, 65504.0])
    assert np.array_equal(r(vals), np.array(mx.array(vals.astype(np.float32)).astype(mx.bfloat16).astype(mx.float32)))


@pytest.mark.skipif(not rq.on_cuda(), reason="bit-equality with MLX's qmv needs MLX CUDA")
@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 32), (8, 64), (8, 32)])
def test_every_row_equals_mlx_one_row_call_on_cuda(bits, group_size):
    x, wq, scales, biases = _quantized(1024, 4096, mx.bfloat16, group_size, bits)
    got = rq.rowwise_quantized_matmul(x, wq, scales, biases, group_size, bits)
    one = [mx.quantized_matmul(x[i : i + 1], wq, scales, biases, transpose=True, group_size=group_size, bits=bits)
           for i in range(16)]
    assert [bool(mx.array_equal(got[i : i + 1], one[i]).item()) for i in range(16)] == [True] * 16


# -- the CUDA source compiles (where nvcc is) ----------------------------------------------------

def _compilable(ctype: str, instances: list[tuple[int, int, int, int, int]]) -> str:
    """One kernel per (M, MB, R, BITS, GS) in one translation unit."""
    inputs = [("x", ctype), ("w", "uint32_t"), ("scales", ctype), ("biases", ctype)]
    kernels = [cc.kernel(f"k{j}", rq._SOURCE, inputs, [("out", ctype)],
                         [f"using T = {ctype}", f"constexpr int M = {m}", f"constexpr int MB = {mb}",
                          f"constexpr int R = {r}", f"constexpr int BITS = {bits}", f"constexpr int GS = {gs}"])
               for j, (m, mb, r, bits, gs) in enumerate(instances)]
    return cc.translation_unit(rq._RQ_HEADER, kernels)


@needs_nvcc
@pytest.mark.parametrize("ctype", ["__nv_bfloat16", "__half"])
def test_every_instantiation_compiles(tmp_path, ctype):
    from dflash_tui.bench import batch_invariance as bi

    instances = [(16, rq.ROWS_PER_WARP, rq.FEATURES_PER_WARP, bits, gs) for bits in rq.BITS for gs in rq.GROUP_SIZES]
    # the shapes the bench measures, and rows that are not a multiple of the warp's slice
    instances += [(16, mb, r, bits, 64) for mb, r in bi.RQ_SPLITS for bits in rq.BITS]
    instances.append((5, 4, 2, 4, 64))
    out = cc.nvcc(tmp_path, _compilable(ctype, instances))
    assert out.returncode == 0, out.stderr[-3000:]


def test_bench_part_runs_on_a_tiny_shape(capsys):
    from dflash_tui.bench import batch_invariance as bi

    assert bi.main(["--shape", "tiny", "--parts", "rowwise-quant", "--chain", "3"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["rows"]
    assert [(r["bits"], r["k"], r["n"]) for r in rows] == [(b, k, n) for b in (4, 8) for k, n in
                                                          ((64, 64), (64, 32), (64, 128), (128, 64), (64, 384))]
    for r in rows:
        assert r["part"] == "rowwise-quant" and not [key for key in r if key.endswith("_error")], r
        # on the CPU every path is MLX's own and row-invariant
        assert r["qmm_equal_rows"] == r["rowwise_equal_rows"] == r["qmv7_equal_rows"] == bi.ROWS
        assert all(r[f"{name}_ms"] > 0 and r[f"chain_{name}_ms"] > 0 for name in ("qmm", "rowwise", "qmv16", "qmv7"))
    # each row went to stderr as one JSON line as soon as it was measured
    streamed = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
    assert streamed == rows
