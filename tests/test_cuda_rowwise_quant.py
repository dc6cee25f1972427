"""The row-wise quantized matmul: its CPU path is MLX's own call, its arguments are checked,
(where nvcc is) every instantiation of its CUDA source compiles, and (where g++ is) its CUDA
source, run on the CPU by tests/cuda_emulate.py, equals a NumPy replay of MLX's qmv bit for bit
on inputs where any change of qmv's order shows. Bit-equality with MLX's own qmv is checked on
the device (the CUDA-only test below, and `bench/batch_invariance --parts rowwise-quant`)."""

from __future__ import annotations

import json

import cuda_compile as cc
import cuda_emulate as ce
import mlx.core as mx
import numpy as np
import pytest
from cuda_compile import needs_nvcc
from cuda_emulate import needs_cxx

from dflash_tui.engine import cuda_rowwise_quant as rq


def _quantized(n: int, k: int, dtype: mx.Dtype, group_size: int, bits: int, rows: int = 16):
    mx.random.seed(11)
    x = mx.random.normal((rows, k)).astype(dtype)
    wq, scales, biases = mx.quantize((mx.random.normal((n, k)) * k ** -0.5).astype(dtype), group_size, bits)
    return x, wq, scales, biases


def _order_sensitive(n: int, k: int, group_size: int, bits: int, rows: int, seed: int = 5):
    """Inputs on which qmv's order shows in the bf16 result: random rows, except that qmv lanes 0
    and 16 (and 8 and 24) start with products of +-2^24 (2^20) that cancel exactly, over weights
    equal in those columns. Summed in another order than qmv's (the lane sums, the butterfly), the
    small products are lost beside the large ones or not: most outputs change."""
    rng = np.random.default_rng(seed)
    e = 16 if bits == 4 else 8  # qmv's elems_per_thread
    x = rng.standard_normal((rows, k))
    w = rng.standard_normal((n, k)) * k ** -0.5
    for a, b, big in ((0, 16, 2.0 ** 24), (8, 24, 2.0 ** 20)):
        x[:, a * e], x[:, b * e] = big, -big
        for lane in (a, b):
            start = lane * e - lane * e % group_size
            w[:, start : start + group_size] = w[:, :group_size]
    wq, scales, biases = mx.quantize(mx.array(w.astype(np.float32)).astype(mx.bfloat16), group_size, bits)
    return mx.array(x.astype(np.float32)).astype(mx.bfloat16), wq, scales, biases


@pytest.mark.skipif(rq.on_cuda(), reason="on MLX CUDA the rows follow qmv, not the 16-row qmm (tests below)")
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


def test_a_repeated_call_takes_its_launch_from_the_kept_plan_until_an_array_is_freed(monkeypatch):
    """The launch MLX CUDA would get, on the CPU: the kernel stands in for its launch and records it."""
    import gc

    launches, checks = [], []

    class Recorder:
        def __call__(self, inputs, output_shapes, output_dtypes, **launch):
            launches.append((len(inputs), output_shapes, launch["grid"]))
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]

    real_check = rq.replays_qmv
    monkeypatch.setattr(rq, "on_cuda", lambda: True)
    monkeypatch.setattr(rq, "_octet_kernels", {n: Recorder() for n in (1, 2, 3)})  # the launch arguments are rq's own
    monkeypatch.setattr(rq, "_octet_launches", {})
    monkeypatch.setattr(rq, "replays_qmv", lambda *a: checks.append(1) or real_check(*a))
    monkeypatch.setattr(rq, "_calls", {})
    x, wq, scales, biases = _quantized(64, 256, mx.bfloat16, 64, 4)
    _, wq2, scales2, biases2 = _quantized(32, 256, mx.bfloat16, 64, 4)
    parts = [(wq, scales, biases), (wq2, scales2, biases2)]
    first = rq.rowwise_quantized_matmuls(x, parts, 64, 4)
    again = rq.rowwise_quantized_matmuls(x, parts, 64, 4)
    assert len(checks) == 2 and len(launches) == 2  # each weight checked once, the pair launched twice
    assert launches[0] == launches[1] and launches[0][:2] == (7, [(16, 64), (16, 32)])
    assert [o.shape for o in first] == [o.shape for o in again] == [(16, 64), (16, 32)]
    assert rq.rowwise_quantized_matmuls(x, parts, 32, 4) is None  # another group size: checked anew, refused
    assert rq.rowwise_quantized_matmuls(x, parts, 32, 4) is None and len(checks) == 3  # the refusal is kept too
    # other scales for the same packed weights are checked anew, not taken from a plan
    assert rq.rowwise_quantized_matmuls(x, [(wq, scales.astype(mx.float32), biases.astype(mx.float32))], 64, 4) is None
    assert rq.rowwise_quantized_matmuls(x, [(wq, scales, None)], 64, 4) is None  # no biases: not affine
    assert len(rq._calls) == 3  # the refused float32 scales were freed, and their entry with them
    del parts, wq2
    gc.collect()
    assert len(rq._calls) == 1  # both of the pair's entries (groups of 64 and 32) went with its second weight


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
    for x, wq, scales, biases in (_quantized(1024, 4096, mx.bfloat16, group_size, bits),
                                  _order_sensitive(1000, 4096 + 64, group_size, bits, 16)):
        got = rq.rowwise_quantized_matmul(x, wq, scales, biases, group_size, bits)
        one = [mx.quantized_matmul(x[i : i + 1], wq, scales, biases, transpose=True, group_size=group_size,
                                   bits=bits) for i in range(16)]
        assert [bool(mx.array_equal(got[i : i + 1], one[i]).item()) for i in range(16)] == [True] * 16


@pytest.mark.skipif(not rq.on_cuda(), reason="bit-equality with MLX's qmv needs MLX CUDA")
@pytest.mark.parametrize("bits", [4, 8])
def test_several_weights_in_one_launch_equal_each_alone_on_cuda(bits):
    x, wq, scales, biases = _order_sensitive(1000, 4096, 64, bits, 16)
    parts = [(wq, scales, biases), (wq[:200], scales[:200], biases[:200]), (wq[200:204], scales[200:204], biases[200:204])]
    got = rq.rowwise_quantized_matmuls(x, parts, 64, bits)
    for out, part in zip(got, parts):
        assert mx.array_equal(out, rq.rowwise_quantized_matmul(x, *part, 64, bits)).item()


# -- the CUDA source compiles (where nvcc is) ----------------------------------------------------

def _compilable(ctype: str) -> str:
    """The kernel at both widths and group sizes, and three weights in one launch, in one unit."""
    kernels = []
    for count, bits, gs in [(1, b, g) for b in rq.BITS for g in rq.GROUP_SIZES] + [(3, b, 64) for b in rq.BITS]:
        f, mb = rq.GEOMETRY[bits]
        names = [("x", ctype)] + [(f"{a}{i}", "uint32_t" if a == "w" else ctype)
                                  for i in range(count) for a in ("w", "scales", "biases")]
        kernels.append(cc.kernel(f"k{count}_{bits}_{gs}", rq._octet_source(count), names,
                                 [(f"out{i}", ctype) for i in range(count)],
                                 [f"using T = {ctype}", "constexpr int M = 16", f"constexpr int MB = {mb}",
                                  f"constexpr int F = {f}", f"constexpr int BITS = {bits}", f"constexpr int GS = {gs}"]))
    return cc.translation_unit(rq._RQ_HEADER, kernels)


@needs_nvcc
@pytest.mark.parametrize("ctype", ["__nv_bfloat16", "__half"])
def test_every_instantiation_compiles(tmp_path, ctype):
    out = cc.nvcc(tmp_path, _compilable(ctype))
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
        assert r["three_one_launch_ms"] > 0 and r["three_separate_ms"] > 0
    # each row went to stderr as one JSON line as soon as it was measured
    streamed = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
    assert streamed == rows


# -- the CUDA source run on the CPU (tests/cuda_emulate.py) ---------------------------------------

def _bits(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)


def _emulate(tmp_path, source: str, consts: list[str], x: mx.array, parts: list[tuple], names: list[str],
             grid: tuple[int, int], threads: int) -> list[np.ndarray]:
    inputs = [("x", _bits(x), "__nv_bfloat16")]
    for name, (wq, scales, biases) in zip(names, parts):
        inputs += [(f"w{name}", _bits(wq), "uint32_t"), (f"scales{name}", _bits(scales), "__nv_bfloat16"),
                   (f"biases{name}", _bits(biases), "__nv_bfloat16")]
    outputs = [(f"out{name}", (x.shape[0], wq.shape[0]), "__nv_bfloat16") for name, (wq, _, _) in zip(names, parts)]
    return ce.run_kernel(tmp_path, rq._RQ_HEADER, source, consts, inputs, outputs, grid, threads)


def _consts(rows: int, mb: int, split: str, split_value: int, bits: int, group_size: int) -> list[str]:
    return ["using T = __nv_bfloat16", f"constexpr int M = {rows}", f"constexpr int MB = {mb}",
            f"constexpr int {split} = {split_value}", f"constexpr int BITS = {bits}", f"constexpr int GS = {group_size}"]


ROWS, K, N = 13, 1088, 44  # rows, columns and features that leave a tail everywhere: a partial last
# step of qmv's tiles (1088 = 2 x 512 + 64), a partial row block, a partial feature block


def _replayed(x, part, group_size, bits) -> np.ndarray:
    from dflash_tui.bench import qmv_order

    return ce.bf16_bits(qmv_order.qmv_rows(x, *part, group_size, bits))


@needs_cxx
@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 32), (8, 64), (8, 32)])
def test_octet_kernel_run_on_the_cpu_equals_the_qmv_replay(tmp_path, bits, group_size):
    x, *part = _order_sensitive(N, K, group_size, bits, ROWS)
    f, mb, threads, blocks = rq.octet_geometry(ROWS, (N,), bits)
    got, = _emulate(tmp_path, rq._octet_source(1), _consts(ROWS, mb, "F", f, bits, group_size), x, [part], ["0"],
                    (blocks, -(-ROWS // mb)), threads)
    want = _replayed(x, part, group_size, bits)
    assert [bool(r) for r in (got == want).all(axis=1)] == [True] * ROWS


@needs_cxx
@pytest.mark.parametrize("bits", [4, 8])
def test_several_weights_in_one_octet_launch_run_on_the_cpu_equal_each_alone(tmp_path, bits):
    """q, k, v as one launch: blocks go to each weight's features in turn; a tail block of one
    weight writes nothing of the next one's."""
    x, *part = _order_sensitive(N, K, 64, bits, ROWS)
    parts = [part, [a[:20] for a in part], [a[20:28] for a in part]]
    f, mb, threads, blocks = rq.octet_geometry(ROWS, (44, 20, 8), bits)
    assert blocks == 6 + 3 + 1
    got = _emulate(tmp_path, rq._octet_source(3), _consts(ROWS, mb, "F", f, bits, 64), x, parts, ["0", "1", "2"],
                   (blocks, -(-ROWS // mb)), threads)
    for out, p in zip(got, parts):
        assert np.array_equal(out, _replayed(x, p, 64, bits))


def test_the_order_sensitive_inputs_tell_orders_apart():
    """Summing the 32 lane sums one after another instead of qmv's butterfly changes most outputs."""
    from dflash_tui.bench import qmv_order

    x, wq, scales, biases = _order_sensitive(N, K, 64, 4, 3)
    butterfly = qmv_order.qmv_rows(x, wq, scales, biases, 64, 4)
    sequential = qmv_order.qmv_rows(x, wq, scales, biases, 64, 4, lane_order="sequential")
    assert (butterfly != sequential).mean() > 0.5
