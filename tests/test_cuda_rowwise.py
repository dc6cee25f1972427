"""The row-wise matmul (engine/cuda_rowwise.py) on this machine: its kernel source compiles for
every variant, its wrapper's shapes and checks, and off CUDA it is MLX's own `x @ w.T`.

Bit-equality with MLX CUDA's one-row gemv can only be checked on the GPU
(`python -m dflash_tui.bench.rowwise --shape qwen3-4b`)."""

from __future__ import annotations

import json

import cuda_compile as cc
import mlx.core as mx
import pytest
from cuda_compile import needs_nvcc

from dflash_tui.engine import cuda_kernels as ck
from dflash_tui.engine import cuda_rowwise as cr


def _kernels_source(ctype: str, m: int, npt: int) -> str:
    """Every variant's kernel, for one weight and for the products that share their input, in one
    translation unit."""
    kernels = [cc.kernel(f"rowwise{count}_{name}", cr._source(count),
                         [("x", ctype)] + [(f"w{i}", ctype) for i in range(count)],
                         [(f"out{i}", ctype) for i in range(count)],
                         [f"using T = {ctype}", f"constexpr int M = {m}", f"constexpr int NPT = {npt}",
                          f"constexpr int F = {v.features}", f"constexpr int FS = {v.feature_sets}",
                          f"constexpr int S = {cr.STEPS}", f"constexpr int NST = {cr.STAGES}",
                          f"constexpr int MB = {cr.block_rows(m, v)}"])
               for name, v in cr.VARIANTS.items() for count in (1, 2, 3)]
    return cc.translation_unit(ck._HEADER + cr._ROWWISE_HEADER, kernels)


@needs_nvcc
@pytest.mark.parametrize("ctype,m,npt", [("__nv_bfloat16", 16, 4), ("__half", 7, 2), ("float", 2, 1)])
def test_every_variant_compiles(tmp_path, ctype, m, npt):
    out = cc.nvcc(tmp_path, _kernels_source(ctype, m, npt))
    assert out.returncode == 0, out.stderr[-2000:]


def test_n_per_thread_is_mlx_gemv_rule():
    assert [cr.n_per_thread(k) for k in (2560, 9728, 17408, 2880, 1000, 1001)] == [4, 4, 4, 2, 1, 1]


def test_every_variant_fits_a_block():
    for name, v in cr.VARIANTS.items():
        assert v.features in (1, 2, 4) and 128 * v.feature_sets <= 1024, name
        assert v.features * v.rows <= 128, name  # sums per thread the fold takes
        for m in (2, 7, cr.MAX_ROWS):
            for k, itemsize in ((9728, 2), (2880, 2), (1001, 2), (4096, 4)):
                assert cr.shared_bytes(m, k, itemsize, v) <= 227 * 1024, (name, m, k)
    assert cr.DEFAULT_VARIANT in cr.VARIANTS


def test_block_rows_never_exceed_the_rows():
    v = cr.VARIANTS[cr.DEFAULT_VARIANT]
    assert [cr.block_rows(m, v) for m in (2, 7, 16)] == [2, 7, 16]
    assert cr.block_rows(16, cr.Variant(2, 2, 8)) == 8


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("lead", [(2,), (16,), (1, 5), (3, 4), (1,), (17,)])
def test_off_cuda_it_is_mlx_own_product(dtype, lead):
    x = mx.random.normal((*lead, 96)).astype(dtype)
    w = mx.random.normal((40, 96)).astype(dtype)
    assert not cr.applies(x, w)
    out = cr.rowwise_matmul(x, w)
    assert out.shape == (*lead, 40) and out.dtype == dtype
    assert mx.array_equal(out, x @ w.T)
    for variant in cr.VARIANTS:
        assert mx.array_equal(cr.rowwise_matmul(x, w, variant), out)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_several_weights_off_cuda_are_mlx_own_products(dtype):
    x = mx.random.normal((1, 5, 64)).astype(dtype)
    ws = [mx.random.normal((n, 64)).astype(dtype) for n in (48, 16, 16)]
    outs = cr.rowwise_matmuls(x, ws)
    assert [o.shape for o in outs] == [(1, 5, 48), (1, 5, 16), (1, 5, 16)]
    assert all(mx.array_equal(o, x @ w.T) for o, w in zip(outs, ws))
    with pytest.raises(ValueError, match="not \\[..., K\\]"):
        cr.rowwise_matmuls(x, [ws[0], mx.zeros((8, 32), dtype=dtype)])


def test_bad_arguments_are_one_clear_error():
    x, w = mx.zeros((4, 8)), mx.zeros((6, 8))
    with pytest.raises(ValueError, match="not \\[..., K\\] and \\[N, K\\]"):
        cr.rowwise_matmul(x, mx.zeros((6, 9)))
    with pytest.raises(ValueError, match="not \\[..., K\\]"):
        cr.rowwise_matmul(x, mx.zeros((8,)))
    with pytest.raises(ValueError, match="unknown variant 'r3'"):
        cr.rowwise_matmul(x, w, "r3")


def test_rowwise_bench_runs_on_the_tiny_shape(capsys):
    from dflash_tui.bench import rowwise

    assert rowwise.main(["--shape", "tiny", "--reps", "2", "--layers", "2", "--variants", "f4fs1mb16"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    shapes = {(r["k"], r["n"]) for r in rows if r["part"] == "rowwise"}
    assert {(64, 64), (64, 32), (64, 128), (128, 64), (64, 384), (64, 256), (96, 40), (33, 20)} == shapes  # 256: gate+up
    for r in rows:
        assert "error" not in r, r
        if r["part"] == "rowwise" and r["variant"] != "mlx":
            assert r["equal_rows"] == rowwise.ROWS and r["ms"] > 0  # off CUDA: MLX's own rows equal its one-row ones
    assert {r["variant"] for r in rows if r["part"] == "rowwise"} == {"mlx", "f4fs1mb16"}
    assert all(r["equal_rows_of_2"] == 2 and r["equal_rows_of_7"] == 7
               for r in rows if r["part"] == "rowwise" and r["matmul"] == "q" and r["dtype"] == "bfloat16"
               and r["variant"] != "mlx")
    chains = report["summary"]["chain_ms"]
    assert set(chains) == {"bfloat16", "float16"}
    assert set(chains["bfloat16"]) == {"gemm", "gemm_weights_first", "one_row", "one_row_x16", "auto", "f4fs1mb16",
                                       "fused_rowwise", "fused_gemm", "several_weights"}
    chain_rows = [r for r in rows if r["part"] == "rowwise chain"]
    assert all(r["matmuls"] == (2 * 4 + 1 if r["mode"].startswith(("fused", "several")) else 2 * 7 + 1) for r in chain_rows)
    assert report["summary"]["inexact_variants"] == []
    several = [r for r in rows if r["part"] == "rowwise several"]
    assert [r["matmuls"] for r in several] == ["q+k+v", "gate+up", "q+k+v", "gate+up"]  # both dtypes
    assert all(r["equal_rows"] == [rowwise.ROWS] * len(r["equal_rows"]) for r in several)


def test_equal_rows_compares_bits():
    from dflash_tui.bench.rowwise import equal_rows

    a = mx.zeros((3, 4), dtype=mx.bfloat16)
    b = mx.array([[0, 0, 0, 0], [0, -0.0, 0, 0], [0, 0, 1, 0]], dtype=mx.bfloat16)
    assert equal_rows(a, b) == 1  # -0.0 == 0.0 as numbers, not as bits


def test_batch_invariance_has_the_rowwise_part(capsys):
    from dflash_tui.bench import batch_invariance as bi

    assert bi.main(["--shape", "tiny", "--parts", "rowwise"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["part"] for r in rows} == {"rowwise", "rowwise several", "rowwise chain"}
    assert all(r["equal_rows"] == bi.ROWS for r in rows if r["part"] == "rowwise" and r["variant"] != "mlx")
