"""The row-wise matmul (engine/cuda_rowwise.py) on this machine: its kernel source compiles for
every geometry it launches, its wrapper's shapes and checks, and off CUDA it is MLX's own `x @ w.T`.

Its CUDA source also runs on the CPU (tests/cuda_emulate.py) against a NumPy replay of MLX's
gemv order, on inputs where that order shows. Bit-equality with MLX CUDA's own gemv can only be
checked on the GPU (`python -m dflash_tui.bench.rowwise --shape qwen3-4b`)."""

from __future__ import annotations

import json

import cuda_compile as cc
import cuda_emulate as ce
import mlx.core as mx
import numpy as np
import pytest
from cuda_compile import needs_nvcc
from cuda_emulate import needs_cxx

from dflash_tui.engine import cuda_kernels as ck
from dflash_tui.engine import cuda_rowwise as cr


def _kernels_source(ctype: str, m: int, npt: int) -> str:
    """The kernel of one weight and of the products that share their input, each at the geometry
    it launches with, in one translation unit."""
    kernels = [cc.kernel(f"rowwise{count}_{v.name()}", cr._source(count),
                         [("x", ctype)] + [(f"w{i}", ctype) for i in range(count)],
                         [(f"out{i}", ctype) for i in range(count)],
                         [f"using T = {ctype}", f"constexpr int M = {m}", f"constexpr int NPT = {npt}",
                          f"constexpr int F = {v.features}", f"constexpr int FS = {v.feature_sets}",
                          f"constexpr int S = {cr.STEPS}", f"constexpr int NST = {cr.STAGES}",
                          f"constexpr int MB = {cr.block_rows(m, v)}"])
               for count in (1, 2, 3) for v in [cr.geometry(count)]]
    return cc.translation_unit(ck._HEADER + cr._ROWWISE_HEADER, kernels)


@needs_nvcc
@pytest.mark.parametrize("ctype,m,npt", [("__nv_bfloat16", 16, 4), ("__half", 7, 2), ("float", 2, 1)])
def test_every_launched_kernel_compiles(tmp_path, ctype, m, npt):
    out = cc.nvcc(tmp_path, _kernels_source(ctype, m, npt))
    assert out.returncode == 0, out.stderr[-2000:]


def test_n_per_thread_is_mlx_gemv_rule():
    assert [cr.n_per_thread(k) for k in (2560, 9728, 17408, 2880, 1000, 1001)] == [4, 4, 4, 2, 1, 1]


def test_every_geometry_fits_a_block():
    for count in (1, 2, 3, 4):
        v = cr.geometry(count)
        assert v.features in (1, 2, 4) and 128 * v.feature_sets <= 1024, v
        assert v.features * v.rows <= 128, v  # sums per thread the fold takes
        for m in (2, 7, cr.MAX_ROWS):
            for k, itemsize in ((9728, 2), (2880, 2), (1001, 2), (4096, 4)):
                assert cr.shared_bytes(m, k, itemsize, v) <= 227 * 1024, (v, m, k)


def test_geometry_follows_the_measured_rule():
    # q, k, v in one launch: one feature set a block; a single product or gate/up: two
    assert cr.geometry(3) == cr.Geometry(4, 1, 16)
    assert cr.geometry(1) == cr.geometry(2) == cr.Geometry(4, 2, 16)
    _, launch = cr._launch_arguments(16, 2560, (2560,), mx.bfloat16)
    assert launch["threadgroup"] == (256, 1, 1) and launch["grid"] == (80 * 256, 1, 1)  # 32 features a block
    _, launch = cr._launch_arguments(16, 2560, (4096, 1024, 1024), mx.bfloat16)
    assert launch["threadgroup"] == (128, 1, 1) and launch["grid"] == ((256 + 64 + 64) * 128, 1, 1)


def test_block_rows_never_exceed_the_rows():
    v = cr.geometry(1)
    assert [cr.block_rows(m, v) for m in (2, 7, 16)] == [2, 7, 16]
    assert cr.block_rows(16, cr.Geometry(2, 2, 8)) == 8


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("lead", [(2,), (16,), (1, 5), (3, 4), (1,), (17,)])
def test_off_cuda_it_is_mlx_own_product(dtype, lead):
    x = mx.random.normal((*lead, 96)).astype(dtype)
    w = mx.random.normal((40, 96)).astype(dtype)
    assert not cr.applies(x, [w])
    out = cr.rowwise_matmul(x, w)
    assert out.shape == (*lead, 40) and out.dtype == dtype
    assert mx.array_equal(out, x @ w.T)


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
    with pytest.raises(ValueError, match="w \\(6, 9\\)"):
        cr.rowwise_matmuls(x, [w, mx.zeros((6, 9))])


def test_rowwise_bench_runs_on_the_tiny_shape(capsys):
    from dflash_tui.bench import rowwise

    assert rowwise.main(["--shape", "tiny", "--reps", "2", "--layers", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    shapes = {(r["k"], r["n"]) for r in rows if r["part"] == "rowwise"}
    assert {(64, 64), (64, 32), (64, 128), (128, 64), (64, 384), (64, 256), (96, 40), (33, 20)} == shapes  # 256: gate+up
    for r in rows:
        assert "error" not in r, r
        if r["part"] == "rowwise" and r["kernel"] != "mlx":
            assert r["equal_rows"] == rowwise.ROWS and r["ms"] > 0  # off CUDA: MLX's own rows equal its one-row ones
    assert {r["kernel"] for r in rows if r["part"] == "rowwise"} == {"mlx", "rowwise"}
    assert all(r["equal_rows_of_2"] == 2 and r["equal_rows_of_7"] == 7
               for r in rows if r["part"] == "rowwise" and r["matmul"] == "q" and r["dtype"] == "bfloat16"
               and r["kernel"] != "mlx")
    per_shape = report["summary"]["per_shape"]
    assert len(per_shape) == 2 * 6 + 2  # both dtypes' own shapes, the extra ones in the first only
    assert all(e["rowwise_ms"] > 0 and e["gemm_ms"] > 0 for e in per_shape.values())
    chains = report["summary"]["chain_ms"]
    assert set(chains) == {"bfloat16", "float16"}
    assert set(chains["bfloat16"]) == {"gemm", "gemm_weights_first", "one_row", "one_row_x16", "rowwise",
                                       "fused_rowwise", "fused_gemm", "several_weights"}
    chain_rows = [r for r in rows if r["part"] == "rowwise chain"]
    assert all(r["matmuls"] == (2 * 4 + 1 if r["mode"].startswith(("fused", "several")) else 2 * 7 + 1) for r in chain_rows)
    assert report["summary"]["inexact"] == []
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
    assert all(r["equal_rows"] == bi.ROWS for r in rows if r["part"] == "rowwise" and r["kernel"] != "mlx")


# -- the CUDA source run on the CPU (tests/cuda_emulate.py) ---------------------------------------

def _gemv_replay(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each row of x [M, K] (bf16 values as float64) times w [N, K] as MLX CUDA's gemv computes it
    alone: lane l's float sum over columns NPT*l + 32*NPT*i + j in order, the butterfly, bf16."""
    from dflash_tui.bench.qmv_order import round_bf16

    n, k = w.shape
    npt = cr.n_per_thread(k)
    steps = -(-k // (32 * npt))
    pad = steps * 32 * npt - k  # a lane past K adds nothing
    wt = np.pad(w, ((0, 0), (0, pad))).astype(np.float32).reshape(n, steps, 32, npt)
    out = np.empty((x.shape[0], n))
    for m, row in enumerate(np.pad(x, ((0, 0), (0, pad))).astype(np.float32).reshape(-1, steps, 32, npt)):
        acc = np.zeros((n, 32), dtype=np.float32)
        for i in range(steps):
            for j in range(npt):
                acc = acc + row[i, :, j] * wt[:, i, :, j]  # a bf16 product is exact in float
        for o in (16, 8, 4, 2, 1):
            acc = acc + acc[:, np.arange(32) ^ o]
        out[m] = round_bf16(acc[:, 0].astype(np.float64))
    return out


def _order_sensitive(n: int, k: int, rows: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """bf16 values (as float64) on which gemv's order shows: lanes 0 and 16 (8 and 24) begin with
    products of +-2^24 (2^20) that cancel over equal weights, so another order of the lane sums
    loses the small products beside the large ones or keeps them."""
    from dflash_tui.bench.qmv_order import round_bf16

    rng = np.random.default_rng(seed)
    npt = cr.n_per_thread(k)
    x, w = rng.standard_normal((rows, k)), rng.standard_normal((n, k)) * k ** -0.5
    for a, b, big in ((0, 16, 2.0 ** 24), (8, 24, 2.0 ** 20)):
        x[:, a * npt], x[:, b * npt] = big, -big
        w[:, b * npt] = w[:, a * npt]
    return round_bf16(x), round_bf16(w)


@needs_cxx
@pytest.mark.parametrize("k", [1024, 1088, 1000])  # NPT 4, 2 and 1 (a partial last step)
def test_kernel_run_on_the_cpu_equals_the_gemv_replay(tmp_path, k):
    rows, ns = 13, (44, 20, 8)  # a partial row block; a partial feature block in every weight
    x, w = _order_sensitive(sum(ns), k, rows)
    ws = [w[:44], w[44:64], w[64:]]
    want = [_gemv_replay(x, part) for part in ws]
    for count in (1, 2, 3):  # both geometries: two feature sets below three weights, one at three
        v = cr.geometry(count)
        _, launch = cr._launch_arguments(rows, k, ns[:count], mx.bfloat16)
        threads = launch["threadgroup"][0]
        consts = ["using T = __nv_bfloat16" if c == "T" else f"constexpr int {c} = {val}"
                  for c, val in launch["template"]]
        got = ce.run_kernel(
            tmp_path, ck._HEADER + cr._ROWWISE_HEADER, cr._source(count), consts,
            [("x", ce.bf16_bits(x), "__nv_bfloat16")]
            + [(f"w{i}", ce.bf16_bits(part), "__nv_bfloat16") for i, part in enumerate(ws[:count])],
            [(f"out{i}", (rows, part.shape[0]), "__nv_bfloat16") for i, part in enumerate(ws[:count])],
            (launch["grid"][0] // threads, launch["grid"][1]), threads,
            shared_bytes=cr.shared_bytes(rows, k, 2, v))
        for i in range(count):
            assert np.array_equal(got[i], ce.bf16_bits(want[i])), (count, i)


def test_the_order_sensitive_inputs_tell_gemv_orders_apart():
    x, w = _order_sensitive(44, 1024, 3)
    lanes_in_a_row = (x.astype(np.float32) @ w.T.astype(np.float32))  # BLAS's own order
    assert (ce.bf16_bits(_gemv_replay(x, w)) != ce.bf16_bits(lanes_in_a_row)).mean() > 0.5


def test_a_repeated_call_takes_its_launch_from_the_kept_plan_until_a_weight_is_freed(monkeypatch):
    """The launch MLX CUDA would get, on the CPU: the kernel stands in for its launch and records it."""
    import gc

    launches = []

    class Recorder:
        def __call__(self, inputs, output_shapes, output_dtypes, **launch):
            launches.append((len(inputs), output_shapes, launch))
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]

    checks = []
    monkeypatch.setattr(cr, "on_cuda", lambda: True)
    monkeypatch.setattr(cr, "_kernel", lambda *a: Recorder())
    monkeypatch.setattr(cr, "applies", lambda x, ws: checks.append(1) or True)
    monkeypatch.setattr(cr, "_launches", {})
    monkeypatch.setattr(cr, "_calls", {})
    x = mx.zeros((1, 16, 256), mx.bfloat16)
    ws = [mx.zeros((64, 256), mx.bfloat16), mx.zeros((32, 256), mx.bfloat16)]
    first = cr.rowwise_matmuls(x, ws)
    again = cr.rowwise_matmuls(x, ws)
    assert len(checks) == 1 and len(launches) == 2  # checked once, launched twice
    assert launches[0] == launches[1] and launches[0][1] == [(16, 64), (16, 32)]
    assert [o.shape for o in first] == [o.shape for o in again] == [(1, 16, 64), (1, 16, 32)]
    cr.rowwise_matmuls(x[:, :7], ws)  # other rows: a plan of their own
    assert len(checks) == 2 and launches[2][1] == [(7, 64), (7, 32)]
    with pytest.raises(ValueError):  # a weight of another K is refused, not taken from a plan
        cr.rowwise_matmuls(x, [ws[0], mx.zeros((32, 128), mx.bfloat16)])
    assert len(cr._calls) == 2
    del ws[1]
    gc.collect()
    assert cr._calls == {}  # a freed weight takes its plans with it
