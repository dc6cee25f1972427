"""The step-attention kernel (a verify's rows equal to single-query decode steps), on the CPU.

Bit-equality with MLX CUDA's `sdpa_vector` can only be checked on the GPU
(`python -m dflash_tui.bench.batch_invariance --parts step-attention`). Here: every kernel
instantiation compiles with nvcc (and fits the 1024-thread blocks it is launched with), the
path taken off CUDA equals one `mx.fast.scaled_dot_product_attention` call per query over a
real `KVCache` grown step by step, the kernel-choice rules follow MLX's, and bad shapes are
refused with one clear error.
"""

from __future__ import annotations

import re

import cuda_compile as cc
import mlx.core as mx
import pytest
from cuda_compile import needs_nvcc
from mlx_lm.models.cache import KVCache

from dflash_tui.engine import cuda_step_attention as sa

@needs_nvcc
def test_every_instantiation_compiles_and_fits_1024_threads(tmp_path):
    s1, s2 = sa._f32_bits(sa.one_pass_scale(128 ** -0.5)), sa._f32_bits(sa.two_pass_scale(128 ** -0.5))
    kernels = []
    for t in ("__nv_bfloat16", "__half"):
        for d in sa.VECTOR_HEAD_DIMS:
            for two in ("false", "true"):
                kernels.append(cc.kernel(f"pass1_{t}_{d}_{two}", sa._PASS1_SOURCE, [("q", t), ("k", t), ("v", t)],
                                         [("out", t), ("part_o", "float"), ("part_ms", "float")],
                                        [f"using T = {t}", f"constexpr int D = {d}", f"constexpr bool TWO_PASS = {two}",
                                         f"constexpr int SCALE_1PASS_BITS = {s1}",
                                         f"constexpr int SCALE_2PASS_BITS = {s2}"]))
            kernels.append(cc.kernel(f"pass2_{t}_{d}", sa._PASS2_SOURCE, [("first", t), ("k", t), ("part_o", "float"),
                                                                         ("part_ms", "float")], [("out", t)],
                                    [f"using T = {t}", f"constexpr int D = {d}"]))
    out = cc.nvcc(tmp_path, cc.translation_unit(sa._STEP_HEADER, kernels), "-Xptxas", "-v")
    assert out.returncode == 0, out.stderr[-3000:]
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", out.stderr)]
    assert len(regs) == len(kernels)
    assert max(regs) <= 64, out.stderr  # 65536 registers per block of 1024 threads
    assert set(re.findall(r"(\d+) bytes spill stores", out.stderr)) <= {"0"}, out.stderr


def test_scales_round_as_mlx_does():
    s = 128 ** -0.5
    # 1-pass: float scale times the double M_LOG2E, rounded once; 2-pass: float times float
    assert sa.one_pass_scale(s) == sa._f32(sa._f32(s) * 1.4426950408889634)
    assert sa.two_pass_scale(s) == sa._f32(sa._f32(s) * sa._f32(1.44269504089))
    scales = [sa._f32(x ** -0.5) for x in (64, 96, 128, 80, 72)]
    assert any(sa.one_pass_scale(x) != sa.two_pass_scale(x) for x in scales)


def test_kernel_choice_follows_mlx(monkeypatch):
    monkeypatch.delenv("MLX_CUDA_USE_CUDNN_SDPA", raising=False)
    assert sa.single_query_kernel(255, 128) == "sdpa_vector_1pass"
    assert sa.single_query_kernel(256, 128) == "cudnn"
    assert sa.single_query_kernel(100, 256) == "unfused"
    assert sa.single_query_kernel(4000, 256) == "unfused"
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "0")
    assert sa.single_query_kernel(1024, 64) == "sdpa_vector_1pass"
    assert sa.single_query_kernel(1025, 96) == "sdpa_vector_2pass"
    assert sa.single_query_kernel(4000, 256) == "unfused"


@pytest.mark.parametrize("cudnn", ["1", "0"])
def test_replayed_rows_are_the_rows_no_cudnn_call_takes(monkeypatch, cudnn):
    """The verify's split (replay the first rows, MLX calls for the rest) counts, without a call a
    row, exactly the rows whose decode step would not go to cuDNN."""
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", cudnn)
    for d in (64, 128, 256):
        for rows in (1, 2, 7, 16):
            for keys in range(rows, 300):
                per_row = [sa.single_query_kernel(keys - rows + i + 1, d) != "cudnn" for i in range(rows)]
                n = sa.replayed_rows(keys, rows, d)
                assert per_row == [True] * n + [False] * (rows - n), (d, rows, keys)
    assert sa.replayed_rows(260, 16, 128) == (11 if cudnn == "1" else 16)  # rows 0..10 have 245..255 keys


def test_step_launches_are_built_once_per_shape():
    one = sa._step_launches((1, 8, 16, 128), mx.bfloat16, False, 128 ** -0.5)
    (_, args), combine = one
    assert combine is None and args["grid"] == (8 * 16 * 1024, 1, 1)
    assert sa._step_launches((1, 8, 16, 128), mx.bfloat16, False, 128 ** -0.5) is one  # cached
    (_, args), (_, combine_args) = sa._step_launches((1, 8, 16, 128), mx.bfloat16, True, 128 ** -0.5)
    assert args["grid"] == (8 * 16 * 8 * 1024, 1, 1) and combine_args["grid"] == (8 * 16 * 1024, 1, 1)
    assert args["output_shapes"][1] == (8, 16, sa._TWO_PASS_BLOCKS, 128)


def _decode_steps(q: mx.array, k_all: mx.array, v_all: mx.array, context: int, scale: float) -> mx.array:
    """16 real decode steps on an mlx-lm KVCache: one query each, over the cache's slice."""
    cache = KVCache()
    cache.update_and_fetch(k_all[:, :, :context], v_all[:, :, :context])
    outs = []
    for i in range(q.shape[2]):
        keys, values = cache.update_and_fetch(k_all[:, :, context + i : context + i + 1],
                                              v_all[:, :, context + i : context + i + 1])
        q_step = mx.contiguous(q.transpose(0, 2, 1, 3)[:, i : i + 1]).transpose(0, 2, 1, 3)
        outs.append(mx.fast.scaled_dot_product_attention(q_step, keys, values, scale=scale, mask=None))
        mx.eval(outs[-1])
    return mx.concatenate(outs, axis=2)


@pytest.mark.parametrize("heads,kv_heads,head_dim,context,rows", [(4, 2, 16, 20, 16), (8, 8, 32, 5, 3),
                                                                   (6, 2, 64, 300, 16)])
def test_rows_equal_decode_steps(heads, kv_heads, head_dim, context, rows):
    mx.random.seed(7)
    k_all = mx.random.normal((1, kv_heads, context + rows, head_dim)).astype(mx.bfloat16)
    v_all = mx.random.normal((1, kv_heads, context + rows, head_dim)).astype(mx.bfloat16)
    q = mx.random.normal((1, rows, heads, head_dim)).astype(mx.bfloat16).transpose(0, 2, 1, 3)
    scale = head_dim ** -0.5
    steps = _decode_steps(q, k_all, v_all, context, scale)
    cache = KVCache()
    cache.update_and_fetch(k_all[:, :, :context], v_all[:, :, :context])
    keys, values = cache.update_and_fetch(k_all[:, :, context:], v_all[:, :, context:])  # the verify's views
    got = sa.step_attention(q, keys, values, scale)
    assert got.shape == (1, heads, rows, head_dim) and got.dtype == mx.bfloat16
    assert mx.array_equal(got, steps).item()
    # and the rows are not all the same computation: a non-causal call differs
    assert not mx.array_equal(got, mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale)).item()


@pytest.mark.parametrize("q_shape,k_shape", [((1, 4, 17, 16), (1, 2, 40, 16)), ((1, 4, 8, 16), (1, 2, 5, 16)),
                                             ((1, 5, 2, 16), (1, 2, 10, 16)), ((2, 4, 2, 16), (2, 2, 10, 16)),
                                             ((1, 4, 2, 16), (1, 2, 10, 32)), ((4, 2, 16), (2, 10, 16))])
def test_bad_shapes_are_refused(q_shape, k_shape):
    q, k = mx.zeros(q_shape, mx.bfloat16), mx.zeros(k_shape, mx.bfloat16)
    with pytest.raises(ValueError, match="step_attention"):
        sa.step_attention(q, k, k, 0.25)


def test_bench_part_runs_on_the_tiny_shape(capsys):
    from dflash_tui.bench import batch_invariance as bi

    assert bi.main(["--shape", "tiny", "--context", "5", "--parts", "step-attention"]) == 0
    out = capsys.readouterr()
    import json

    rows = json.loads(out.out)["rows"]
    assert [r["context"] for r in rows] == [5] and json.loads(out.err.strip().splitlines()[-1]) == rows[0]
    row = rows[0]
    assert "error" not in row and not any(k.endswith("_error") for k in row), row
    # off CUDA both exact paths are one MLX call per query: every row equals its decode step
    assert row["per_query_equal_rows"] == 16 and row["routed_equal_rows"] == 16 and row["routed_rows"] == "=" * 16
    assert row["routed_repeatable"] and row["routed_36_layers_ms"] > 0 and "kernel_equal_rows" not in row

