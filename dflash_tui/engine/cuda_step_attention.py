"""A verify's causal attention whose every row equals MLX CUDA's single-query decode step.

A verify of L <= 16 tokens computes query i over the cache's keys up to its own position;
a decode step at that position computes the same thing with MLX's single-query kernel. On
MLX CUDA the two run different kernels and round differently. `step_attention` computes
all L queries in one launch (two from 1025 keys), each query with exactly the arithmetic
of the kernel MLX uses for a one-query call over that many keys, so its rows equal the
decode steps' bit for bit where that kernel is MLX's own `sdpa_vector`:

- below 256 keys, always;
- at every length with `MLX_CUDA_USE_CUDNN_SDPA=0` (MLX then never uses cuDNN).

From 256 keys with cuDNN on, a one-query call over an mlx-lm `KVCache` slice goes to
cuDNN's decode graph, whose order is closed: those rows are computed by one MLX call per
query on keys laid out as a decode step's are (below). Head dims other than 64/96/128
(e.g. 256) have no fused one-query kernel on MLX CUDA at all (MLX composes matmuls and a
softmax): those heads too are computed by one MLX call per query. On the CPU (and any
non-CUDA device) every row is one MLX call per query.

What MLX CUDA does for one query (mlx/backend/cuda/scaled_dot_product_attention.cu and
.cpp, MLX commit 846d17622), replayed by `_PASS1_SOURCE` / `_PASS2_SOURCE`:

- kernel choice: cuDNN (decode graph) if enabled, keys >= 256 and keys/values are slices of
  a buffer whose length is a multiple of 256 (`use_cudnn_for_decoding`); the graph is
  cached and built per shapes *and strides* (`SDPACacheKey`), and it runs on the whole
  buffer with the key count as a padding mask (`unslice_kv`). A decode step's keys are a
  slice of mlx-lm's `KVCache` buffer, which grows by 256 rows from empty: ceil(n / 256) * 256
  rows for n keys. After a verify's rollback the engine's buffer has other lengths (mlx-lm
  regrows it from the offset), so a per-query call first copies the keys into a buffer of
  the decode step's length (decode_layout.py), zero past the keys as a step's is; else
  `sdpa_vector`: `kernel_sdpav_1pass` for <= 1024 keys, `kernel_sdpav_2pass_1/_2` above
  (`sdpa_vector_fallback`: by key length only, not by GQA factor). Head dims 64/96/128.
- 1-pass: one block of 32 warps per (batch, head, query). Lane l holds D/32 consecutive
  values of q and of the output, at l*D/32 + j. q is read once as float and multiplied by
  `scale * M_LOG2E` (computed in double, rounded to float). Warp w takes keys w, w+32, ...
  For each key: score = fma chain over the lane's D/32 products (starting from 0), then a
  butterfly warp sum (xor 16, 8, 4, 2, 1); new_max = fmaxf(max, score);
  factor = exp2f(max - new_max); e = exp2f(score - new_max); sum = fma(sum, factor, e);
  o[j] = fma(factor, o[j], e * v[j]). The running max starts at -FLT_MAX, the sum at 0.
  Combine: lane l takes warp l's max; max over lanes (butterfly, a < b ? b : a);
  factor_l = exp2f(max_l - max); total = butterfly sum of (sum_l * factor_l); inverse =
  total == 0 ? 0 : __frcp_rn(total). Output dims: warp w owns dims w*D/32 + j; for each
  j, the 32 warps' o[j] go through shared memory transposed, lane l multiplies warp l's
  value by factor_l, butterfly sum, times inverse, rounded to T.
- 2-pass, first kernel: 32 blocks of 8 warps per (batch, head, query); warp j of block b
  takes keys b*8 + j, + 256, ...; the same per-key update, but q is scaled by
  `scale * 1.44269504089f` in float. Per block: lane l (< 8) takes warp l's max (lanes
  >= 8: -1e9) and sum (0); butterfly max; sum of sum_l * exp2f(max_l - max); each warp
  scales its o by exp2f(its max - max) and warp 0 adds the 8 warps' values in warp order
  (o_0 + o_1 + ... + o_7). Writes partial[D], sum, max (float32).
- 2-pass, second kernel: one block of 32 warps per (batch, head, query): lane l takes
  block l's max and sum; exactly the 1-pass combine above, with warp w reading block w's
  partial at lane l's D/32 dims.

Every multiply and add below is written as an explicit round-to-nearest intrinsic where
nvcc's contraction choices (read from the SASS of MLX's kernels) must be pinned.
"""

from __future__ import annotations

import math
import os
import struct

import mlx.core as mx

from dflash_tui.engine.cuda_kernels import _HEADER, on_cuda
from dflash_tui.engine import decode_layout
from dflash_tui.engine.decode_layout import buffer_rows, laid_out

MAX_ROWS = 16
VECTOR_HEAD_DIMS = (64, 96, 128)  # MLX CUDA's sdpa_vector (dispatch_headdim)
CUDNN_DECODE_FROM_KEYS = 256  # use_cudnn_for_decoding: kv_cache_step
TWO_PASS_FROM_KEYS = 1025  # sdpa_vector_fallback: kL > 1024
_TWO_PASS_BLOCKS = 32  # kernel_sdpav_2pass_1: blocks per query
_TWO_PASS_WARPS = 8  # kernel_sdpav_2pass_1: BN

_STEP_HEADER = _HEADER + """
// cg::reduce(warp, v, cg::plus<float>()) on a 32-thread tile: out = out + shfl_xor(out, m), m = 16..1
__device__ __forceinline__ float sv_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
// cg::reduce(warp, v, cg::greater<float>()): (a < b) ? b : a
__device__ __forceinline__ float sv_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) { const float o = __shfl_xor_sync(0xffffffffu, v, m); v = (v < o) ? o : v; }
  return v;
}
// one key's update of a warp's running state (kernel_sdpav_1pass / _2pass_1 loop body)
template <int VPT, typename T>
__device__ __forceinline__ void sv_key(const float (&qv)[VPT], const T* kr, const T* vr, int64_t kc, int64_t vc,
                                       int lane, float& m, float& s, float (&o)[VPT]) {
  float score = 0.f;
#pragma unroll
  for (int j = 0; j < VPT; j++) score = __fmaf_rn(qv[j], dflash_f(kr[(VPT * lane + j) * kc]), score);
  score = sv_sum(score);
  const float new_max = fmaxf(m, score);
  const float factor = exp2f(m - new_max);
  const float e = exp2f(score - new_max);
  m = new_max;
  s = __fmaf_rn(s, factor, e);
#pragma unroll
  for (int j = 0; j < VPT; j++) o[j] = __fmaf_rn(factor, o[j], __fmul_rn(e, dflash_f(vr[(VPT * lane + j) * vc])));
}
"""

# Grid: R blocks of 1024 threads per (head, query), blockIdx.x = (h * L + l) * R + r; R = 8
# where some query sees more than 1024 keys (TWO_PASS), else 1. Query l sees
# kL = S - L + l + 1 keys. kL <= 1024: block r = 0 replays kernel_sdpav_1pass (the other
# blocks of the row return at once) and writes the output row. kL > 1024: block r holds 4 groups
# of 8 warps, virtual 2-pass block b = 4 r + group, and replays kernel_sdpav_2pass_1 into
# part_o / part_ms; the second launch replays kernel_sdpav_2pass_2.
_PASS1_SOURCE = """
  constexpr int VPT = D / 32;
  const int H = q_shape[1], L = q_shape[2], S = k_shape[2];
  const int G = H / k_shape[1];
  constexpr int R = TWO_PASS ? 8 : 1;  // blocks per (head, query)
  const int r = blockIdx.x % R, hl = blockIdx.x / R;
  const int h = hl / L, l = hl % L, hk = h / G;
  const int kL = S - L + l + 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* Q = q + h * q_strides[1] + l * q_strides[2];
  const T* K = k + hk * k_strides[1];
  const T* V = v + hk * v_strides[1];
  const int64_t kr = k_strides[2], vr = v_strides[2], kc = k_strides[3], vc = v_strides[3], qc = q_strides[3];
  float qv[VPT], o[VPT];
  float m = __int_as_float(0xff7fffff), s = 0.f;  // Limits<float>::finite_min(): -FLT_MAX
#pragma unroll
  for (int j = 0; j < VPT; j++) o[j] = 0.f;
  if (kL <= 1024) {
    if (r != 0) return;
    __shared__ float outputs[32][33];
    __shared__ float max_scores[32], sum_exp_scores[32];
    const float sl = __int_as_float(SCALE_1PASS_BITS);
#pragma unroll
    for (int j = 0; j < VPT; j++) qv[j] = __fmul_rn(sl, dflash_f(Q[(VPT * lane + j) * qc]));
#pragma unroll 1
    for (int i = warp; i < kL; i += 32) sv_key<VPT>(qv, K + i * kr, V + i * vr, kc, vc, lane, m, s, o);
    if (lane == 0) { max_scores[warp] = m; sum_exp_scores[warp] = s; }
    __syncthreads();
    const float ml = max_scores[lane];
    const float new_max = sv_max(ml);
    const float factor = exp2f(ml - new_max);
    float total = sv_sum(__fmul_rn(sum_exp_scores[lane], factor));
    total = total == 0 ? 0 : __frcp_rn(total);
#pragma unroll
    for (int j = 0; j < VPT; j++) {
      outputs[lane][warp] = o[j];
      __syncthreads();
      o[j] = __fmul_rn(sv_sum(__fmul_rn(outputs[warp][lane], factor)), total);
      __syncthreads();
    }
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < VPT; j++) out[(size_t)hl * D + VPT * warp + j] = T(o[j]);
    }
    return;
  }
  if constexpr (TWO_PASS) {
  __shared__ float g_outputs[4][8][33];
  __shared__ float g_max[4][8], g_sum[4][8];
  const int group = warp >> 3, wj = warp & 7, b = r * 4 + group;
  const float sl = __int_as_float(SCALE_2PASS_BITS);
#pragma unroll
  for (int j = 0; j < VPT; j++) qv[j] = __fmul_rn(sl, dflash_f(Q[(VPT * lane + j) * qc]));
#pragma unroll 1
  for (int i = b * 8 + wj; i < kL; i += 256) sv_key<VPT>(qv, K + i * kr, V + i * vr, kc, vc, lane, m, s, o);
  if (lane == 0) { g_max[group][wj] = m; g_sum[group][wj] = s; }
  __syncthreads();
  const float ml = lane < 8 ? g_max[group][lane] : -1e9f;
  const float new_max = sv_max(ml);
  const float factor = exp2f(ml - new_max);
  const float total = sv_sum(__fmul_rn(lane < 8 ? g_sum[group][lane] : 0.f, factor));
  const size_t part = (size_t)hl * 32 + b;
  if (wj == 0 && lane == 0) { part_ms[part * 2] = new_max; part_ms[part * 2 + 1] = total; }
  const float ff = exp2f(g_max[group][wj] - new_max);
#pragma unroll
  for (int j = 0; j < VPT; j++) {
    g_outputs[group][wj][lane] = __fmul_rn(o[j], ff);
    __syncthreads();
    if (wj == 0) {
      float ot = g_outputs[group][0][lane];
#pragma unroll
      for (int w = 1; w < 8; w++) ot = __fadd_rn(ot, g_outputs[group][w][lane]);
      o[j] = ot;
    }
    __syncthreads();
  }
  if (wj == 0) {
#pragma unroll
    for (int j = 0; j < VPT; j++) part_o[part * D + VPT * lane + j] = o[j];
  }
  }
"""

# One block of 1024 threads per (head, query): rows with kL <= 1024 are copied from the first
# launch's output; the others replay kernel_sdpav_2pass_2 over the 32 partials.
_PASS2_SOURCE = """
  constexpr int VPT = D / 32;
  const int L = first_shape[2], S = k_shape[2];
  const int hl = blockIdx.x, l = hl % L;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (S - L + l + 1 <= 1024) {
    if (threadIdx.x < D) out[(size_t)hl * D + threadIdx.x] = first[(size_t)hl * D + threadIdx.x];
    return;
  }
  __shared__ float outputs[32][33];
  const float* P = part_o + ((size_t)hl * 32 + warp) * D;
  const float* MS = part_ms + (size_t)hl * 32 * 2;
  const float ml = MS[lane * 2];
  const float new_max = sv_max(ml);
  const float factor = exp2f(ml - new_max);
  float total = sv_sum(__fmul_rn(MS[lane * 2 + 1], factor));
  total = total == 0 ? 0 : __frcp_rn(total);
  float o[VPT];
#pragma unroll
  for (int j = 0; j < VPT; j++) o[j] = P[VPT * lane + j];
#pragma unroll
  for (int j = 0; j < VPT; j++) {
    outputs[lane][warp] = o[j];
    __syncthreads();
    o[j] = __fmul_rn(sv_sum(__fmul_rn(outputs[warp][lane], factor)), total);
    __syncthreads();
  }
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < VPT; j++) out[(size_t)hl * D + VPT * warp + j] = T(o[j]);
  }
"""

_kernels: dict[str, object] = {}


def _kernel(name: str, inputs: list[str], outputs: list[str], source: str):
    if name not in _kernels:
        _kernels[name] = mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs, source=source,
                                             header=_STEP_HEADER, ensure_row_contiguous=False)
    return _kernels[name]


def _f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def one_pass_scale(scale: float) -> float:
    """kernel_sdpav_1pass: `params.scale * M_LOG2E` (float times double, in double), as float."""
    return _f32(_f32(scale) * math.log2(math.e))


def two_pass_scale(scale: float) -> float:
    """kernel_sdpav_2pass_1: `params.scale * 1.44269504089f` (float times float)."""
    return _f32(_f32(scale) * _f32(1.44269504089))


def cudnn_decoding() -> bool:
    """MLX CUDA's `MLX_CUDA_USE_CUDNN_SDPA` (default 1): cuDNN may take one-query calls."""
    try:
        return int(os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1")) != 0
    except ValueError:
        return True


def cudnn_takes(head_dim: int) -> bool:
    """Whether cuDNN takes one-query calls of this head size from CUDNN_DECODE_FROM_KEYS keys."""
    return cudnn_decoding() and head_dim <= 128 and head_dim % 8 == 0


def single_query_kernel(keys: int, head_dim: int) -> str:
    """The kernel MLX CUDA gives a decode step's one-query call over `keys` cache keys."""
    if keys >= CUDNN_DECODE_FROM_KEYS and cudnn_takes(head_dim):
        return "cudnn"
    if head_dim not in VECTOR_HEAD_DIMS:
        return "unfused"  # no fused kernel: MLX composes matmuls and a softmax
    return "sdpa_vector_2pass" if keys >= TWO_PASS_FROM_KEYS else "sdpa_vector_1pass"


def replayed_rows(keys: int, rows: int, head_dim: int) -> int:
    """How many of a verify's `rows` queries (the last of `keys` cache positions) a decode step
    would send to a kernel other than cuDNN: row i has keys - rows + i + 1 keys, so those come
    first. Counted without a call a row (a verify's host path makes 36 or more a forward)."""
    if not cudnn_takes(head_dim):
        return rows
    return min(rows, max(0, CUDNN_DECODE_FROM_KEYS - (keys - rows + 1)))


def _check(q: mx.array, keys: mx.array, values: mx.array) -> None:
    if q.ndim != 4 or keys.ndim != 4 or values.ndim != 4 or q.shape[0] != 1:
        raise ValueError(f"step_attention takes q [1, H, L, D] and keys/values [1, Hkv, S, D]; got {q.shape}, "
                         f"{keys.shape}, {values.shape}")
    _, H, L, D = q.shape
    if not 1 <= L <= MAX_ROWS or keys.shape[2] < L or keys.shape != values.shape or keys.shape[3] != D \
            or H % keys.shape[1]:
        raise ValueError(f"step_attention: L must be 1..{MAX_ROWS} and <= S, heads a multiple of KV heads; got "
                         f"q {q.shape}, keys {keys.shape}, values {values.shape}")


def per_query_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, rows: range | None = None) -> mx.array:
    """Each query as a decode step computes it: one MLX call with the query laid out as a
    step's ([1, 1, H, D] contiguous seen as [1, H, 1, D]) over the keys up to its position,
    on MLX CUDA sliced from a buffer of the decode step's length (decode_layout.py).
    -> [1, H, len(rows), D]."""
    L, S = q.shape[2], keys.shape[2]
    by_token = q.transpose(0, 2, 1, 3)
    buffers: dict[int, tuple[mx.array, mx.array]] = {}  # buffer rows -> (keys, values) so laid out
    outs = []
    for i in rows if rows is not None else range(L):
        q_step = mx.contiguous(by_token[:, i : i + 1]).transpose(0, 2, 1, 3)
        n = S - L + i + 1
        k, v = keys, values
        if decode_layout.wanted():
            size = buffer_rows(n)
            if size not in buffers:
                buffers[size] = laid_out(keys, S, size), laid_out(values, S, size)
            k, v = buffers[size]
        outs.append(mx.fast.scaled_dot_product_attention(q_step, k[:, :, :n], v[:, :, :n], scale=scale, mask=None))
    return mx.concatenate(outs, axis=2)


def step_attention_kernel(q: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """All L rows through the sdpa_vector replay (CUDA only; D in 64/96/128, 16-bit floats):
    row i equals MLX's `sdpa_vector` one-query call over S - L + i + 1 keys."""
    two_pass = keys.shape[2] >= TWO_PASS_FROM_KEYS
    (first_pass, first_args), combine = _step_launches(tuple(q.shape), q.dtype, two_pass, scale)
    first, part_o, part_ms = first_pass(inputs=[q, keys, values], **first_args)
    if combine is None:
        return first
    combine_pass, combine_args = combine
    return combine_pass(inputs=[first, keys, part_o, part_ms], **combine_args)[0]


_launches: dict[tuple, tuple] = {}


def _step_launches(shape: tuple[int, ...], dtype: mx.Dtype, two_pass: bool, scale: float) -> tuple:
    """((first pass kernel, its launch arguments), (combine kernel, its arguments) or None), cached:
    a verify makes one call a layer, and the Python time is on the cycle's path. The kernels
    exist only where MLX runs on CUDA (else None)."""
    key = (shape, dtype, two_pass, scale)
    if key not in _launches:
        _, H, L, D = shape
        part = (H, L, _TWO_PASS_BLOCKS) if two_pass else (1,)
        cuda = on_cuda()
        first = (_kernel(f"dflash_step_attention{'_2p' if two_pass else ''}", ["q", "k", "v"],
                         ["out", "part_o", "part_ms"], _PASS1_SOURCE) if cuda else None,
                 dict(template=[("T", dtype), ("D", D), ("TWO_PASS", two_pass),
                                ("SCALE_1PASS_BITS", _f32_bits(one_pass_scale(scale))),
                                ("SCALE_2PASS_BITS", _f32_bits(two_pass_scale(scale)))],
                      grid=(H * L * (8 if two_pass else 1) * 1024, 1, 1), threadgroup=(1024, 1, 1),
                      output_shapes=[shape, part + (D,) if two_pass else part, part + (2,) if two_pass else part],
                      output_dtypes=[dtype, mx.float32, mx.float32]))
        combine = None
        if two_pass:
            combine = (_kernel("dflash_step_attention_combine", ["first", "k", "part_o", "part_ms"], ["out"],
                               _PASS2_SOURCE) if cuda else None,
                       dict(template=[("T", dtype), ("D", D)], grid=(H * L * 1024, 1, 1), threadgroup=(1024, 1, 1),
                            output_shapes=[shape], output_dtypes=[dtype]))
        _launches[key] = first, combine
    return _launches[key]


def step_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """Causal attention of a verify's L queries (q [1, H, L, D]: the last L of the S cache
    positions) over keys/values [1, Hkv, S, D] (GQA; views into the cache's buffers), each
    row equal bit for bit to the decode step at that position. -> [1, H, L, D]."""
    _check(q, keys, values)
    L, D, S = q.shape[2], q.shape[3], keys.shape[2]
    if not on_cuda() or D not in VECTOR_HEAD_DIMS or q.dtype not in (mx.bfloat16, mx.float16):
        return per_query_attention(q, keys, values, scale)
    # rows whose one-query call goes to cuDNN (closed order) are MLX calls, the rest the replay
    n = replayed_rows(S, L, D)
    if n == L:
        return step_attention_kernel(q, keys, values, scale)
    if n == 0:
        return per_query_attention(q, keys, values, scale)
    head = step_attention_kernel(q[:, :, :n], keys[:, :, : S - L + n], values[:, :, : S - L + n], scale)
    return mx.concatenate([head, per_query_attention(q, keys, values, scale, range(n, L))], axis=2)
