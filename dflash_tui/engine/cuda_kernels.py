"""Custom CUDA kernels for the few-token forwards of a cycle (MLX's CUDA backend only).

A DFlash cycle runs forwards of 2-16 tokens (the draft's block, the target's
verify). MLX CUDA runs single-token decoding on fused kernels, but attention
with several queries goes to a fused kernel built anew for every cache length,
or to a few generic matmuls, and the Gated DeltaNet recurrence runs as about a
dozen small kernels per token per layer. These kernels do the same work in one
launch each (measured with `python -m dflash_tui.bench.block_kernels`):

- `block_attention`: L <= 16 queries over a KV cache buffer (causal or not,
  GQA), softmax in float32 with the usual running maximum;
- `gated_delta_steps`: T steps of the gated delta rule in one launch, with the
  recurrent state after every step (what the hybrid rollback keeps).

Each has a pure-MLX reference with the same signature and meaning, which runs
wherever the kernels cannot (and lets the CPU tests check the wiring).
Results equal MLX's own ops up to float32 summation order.
"""

from __future__ import annotations

import os
import struct

import mlx.core as mx

MAX_ROWS = 16  # queries block_attention takes; longer forwards (prefill) use MLX's own attention

_HEADER = """
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float dflash_f(float x) { return x; }
__device__ __forceinline__ float dflash_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float dflash_f(__half x) { return __half2float(x); }

// PER contiguous elements of a row (lane's share: lane * PER ...), in one 8- or 16-byte load
// where the row is contiguous and the share is 4 or 8 half floats, else one element at a time.
template <int PER, typename T>
__device__ __forceinline__ void dflash_load_share(const T* row, int64_t col, int lane, float (&out)[PER]) {
  if constexpr (sizeof(T) == 2 && (PER == 4 || PER == 8)) {
    if (col == 1) {
      alignas(16) T h[PER];
      if constexpr (PER == 8) *reinterpret_cast<uint4*>(h) = *reinterpret_cast<const uint4*>(row + lane * PER);
      else *reinterpret_cast<uint2*>(h) = *reinterpret_cast<const uint2*>(row + lane * PER);
#pragma unroll
      for (int i = 0; i < PER; i++) out[i] = dflash_f(h[i]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < PER; i++) out[i] = dflash_f(row[(lane * PER + i) * col]);
}

__device__ __forceinline__ float dflash_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
"""

# One block per (KV head, query): the G query heads that share the KV head are done together,
# so each key and value row is read once for all of them. The block's warps take the keys in
# turns of U (U loads in flight per lane, U x G dot products reduced together), keep a running
# maximum and sum per head, then combine through shared memory. k/v may be views into a
# cache's buffers (read in place through their strides).
_ATTENTION_SOURCE = """
  constexpr int U = 2;
  constexpr int PER = D / 32;
  // sizes and strides arrive as kernel arguments (no small arrays to copy to the device)
  const int L = q_shape[2], S = k_shape[2];
  const int hk = blockIdx.x / L, l = blockIdx.x % L;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float sc = __int_as_float(SCALE_BITS);
  float qv[G][PER], acc[G][PER], m_run[G], l_run[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
    const T* qb = q + (hk * G + g) * q_strides[1] + l * q_strides[2];
#pragma unroll
    for (int i = 0; i < PER; i++) { qv[g][i] = dflash_f(qb[(lane + 32 * i) * q_strides[3]]) * sc; acc[g][i] = 0.f; }
    m_run[g] = __int_as_float(0xff800000);  // -infinity
    l_run[g] = 0.f;
  }
  const int last = CAUSAL ? (S - L + l) : (S - 1);
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const int64_t k_row = k_strides[2], v_row = v_strides[2], k_col = k_strides[3], v_col = v_strides[3];
  for (int s0 = warp * U; s0 <= last; s0 += WARPS * U) {
    float dot[U][G];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = min(s0 + u, last);
      float kv[PER];
#pragma unroll
      for (int i = 0; i < PER; i++) kv[i] = dflash_f(kb[s * k_row + (lane + 32 * i) * k_col]);
#pragma unroll
      for (int g = 0; g < G; g++) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) d += qv[g][i] * kv[i];
        dot[u][g] = d;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int g = 0; g < G; g++) dot[u][g] += __shfl_xor_sync(0xffffffffu, dot[u][g], o);
    float p[U][G];
#pragma unroll
    for (int g = 0; g < G; g++) {
      float m_new = m_run[g];
#pragma unroll
      for (int u = 0; u < U; u++) if (s0 + u <= last) m_new = fmaxf(m_new, dot[u][g]);
      const float corr = __expf(m_run[g] - m_new);
      l_run[g] *= corr;
#pragma unroll
      for (int i = 0; i < PER; i++) acc[g][i] *= corr;
#pragma unroll
      for (int u = 0; u < U; u++) { p[u][g] = s0 + u <= last ? __expf(dot[u][g] - m_new) : 0.f; l_run[g] += p[u][g]; }
      m_run[g] = m_new;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (s0 + u <= last) {
        const int64_t row = (s0 + u) * v_row;
#pragma unroll
        for (int i = 0; i < PER; i++) {
          const float vv = dflash_f(vb[row + (lane + 32 * i) * v_col]);
#pragma unroll
          for (int g = 0; g < G; g++) acc[g][i] += p[u][g] * vv;
        }
      }
    }
  }
  __shared__ float sm_m[WARPS][G], sm_l[WARPS][G];
  __shared__ float sm_acc[WARPS][G][D];
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) { sm_m[warp][g] = m_run[g]; sm_l[warp][g] = l_run[g]; }
#pragma unroll
    for (int i = 0; i < PER; i++) sm_acc[warp][g][lane + 32 * i] = acc[g][i];
  }
  __syncthreads();
  for (int g = warp; g < G; g += WARPS) {  // one warp writes each head's output
    float mx_all = sm_m[0][g];
#pragma unroll
    for (int w = 1; w < WARPS; w++) mx_all = fmaxf(mx_all, sm_m[w][g]);
    float wts[WARPS], total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) { wts[w] = sm_l[w][g] > 0.f ? __expf(sm_m[w][g] - mx_all) : 0.f; total += sm_l[w][g] * wts[w]; }
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int d = lane + 32 * i;
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; w++) o += sm_acc[w][g][d] * wts[w];
      out[(((size_t)hk * G + g) * L + l) * D + d] = T(o / total);
    }
  }
"""

# Split-K (flash decoding) for long caches: block (KV head, query, split) reads only keys
# [split x CHUNK, +CHUNK) (a lane holds D/32 adjacent elements: one wide load per row), keeps
# the same running maximum and sum, and writes its unnormalized partial output with its
# maximum and sum; a second launch combines the splits of each (head, query).
_ATTENTION_SPLIT_SOURCE = """
  constexpr int U = 2;
  constexpr int PER = D / 32;
  const int L = q_shape[2], S = k_shape[2], Hkv = k_shape[1];
  const int splits = gridDim.x / (Hkv * L);
  const int c = blockIdx.x % splits, hk = blockIdx.x / splits / L, l = (blockIdx.x / splits) % L;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float sc = __int_as_float(SCALE_BITS);
  const int last = CAUSAL ? (S - L + l) : (S - 1);
  const int s_begin = c * CHUNK, s_end = min(s_begin + CHUNK, last + 1);  // may be empty (causal tail)
  float qv[G][PER], acc[G][PER], m_run[G], l_run[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
    const T* qb = q + (hk * G + g) * q_strides[1] + l * q_strides[2];
#pragma unroll
    for (int i = 0; i < PER; i++) { qv[g][i] = dflash_f(qb[(lane * PER + i) * q_strides[3]]) * sc; acc[g][i] = 0.f; }
    m_run[g] = __int_as_float(0xff800000);  // -infinity
    l_run[g] = 0.f;
  }
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const int64_t k_row = k_strides[2], v_row = v_strides[2], k_col = k_strides[3], v_col = v_strides[3];
  for (int s0 = s_begin + warp * U; s0 < s_end; s0 += WARPS * U) {
    float dot[U][G];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kv[PER];
      dflash_load_share<PER>(kb + min(s0 + u, s_end - 1) * k_row, k_col, lane, kv);
#pragma unroll
      for (int g = 0; g < G; g++) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) d += qv[g][i] * kv[i];
        dot[u][g] = d;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int g = 0; g < G; g++) dot[u][g] += __shfl_xor_sync(0xffffffffu, dot[u][g], o);
    float p[U][G];
#pragma unroll
    for (int g = 0; g < G; g++) {
      float m_new = m_run[g];
#pragma unroll
      for (int u = 0; u < U; u++) if (s0 + u < s_end) m_new = fmaxf(m_new, dot[u][g]);
      const float corr = __expf(m_run[g] - m_new);
      l_run[g] *= corr;
#pragma unroll
      for (int i = 0; i < PER; i++) acc[g][i] *= corr;
#pragma unroll
      for (int u = 0; u < U; u++) { p[u][g] = s0 + u < s_end ? __expf(dot[u][g] - m_new) : 0.f; l_run[g] += p[u][g]; }
      m_run[g] = m_new;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (s0 + u < s_end) {
        float vv[PER];
        dflash_load_share<PER>(vb + (s0 + u) * v_row, v_col, lane, vv);
#pragma unroll
        for (int i = 0; i < PER; i++)
#pragma unroll
          for (int g = 0; g < G; g++) acc[g][i] += p[u][g] * vv[i];
      }
    }
  }
  __shared__ float sm_m[WARPS][G], sm_l[WARPS][G];
  __shared__ float sm_acc[WARPS][G][D];
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) { sm_m[warp][g] = m_run[g]; sm_l[warp][g] = l_run[g]; }
#pragma unroll
    for (int i = 0; i < PER; i++) sm_acc[warp][g][lane * PER + i] = acc[g][i];
  }
  __syncthreads();
  const size_t part = (size_t)blockIdx.x * G;  // partials [Hkv, L, splits, G, D] and [.., G, 2]
  for (int g = warp; g < G; g += WARPS) {
    float mx_all = sm_m[0][g];
#pragma unroll
    for (int w = 1; w < WARPS; w++) mx_all = fmaxf(mx_all, sm_m[w][g]);
    float wts[WARPS], total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) { wts[w] = sm_l[w][g] > 0.f ? __expf(sm_m[w][g] - mx_all) : 0.f; total += sm_l[w][g] * wts[w]; }
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int d = lane + 32 * i;
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; w++) o += sm_acc[w][g][d] * wts[w];
      part_o[(part + g) * D + d] = o;
    }
    if (lane == 0) { part_ml[(part + g) * 2] = mx_all; part_ml[(part + g) * 2 + 1] = total; }
  }
"""

# One thread per output element: the splits' partials weighted by exp(m_split - m_max), over
# the splits' sums weighted the same way (splits that saw no key have sum 0 and are skipped).
_ATTENTION_COMBINE_SOURCE = """
  const int L = part_ml_shape[1], splits = part_ml_shape[2], G = part_ml_shape[3], D = part_o_shape[4];
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t n = (size_t)part_ml_shape[0] * L * G * D;
  if (idx >= n) return;
  const int d = idx % D, g = (idx / D) % G;
  const size_t hl = idx / D / G;  // hk * L + l
  const int l = hl % L, hk = hl / L;
  float m_max = __int_as_float(0xff800000);
  for (int c = 0; c < splits; c++) {
    const size_t j = ((hl * splits + c) * G + g) * 2;
    if (part_ml[j + 1] > 0.f) m_max = fmaxf(m_max, part_ml[j]);
  }
  float o = 0.f, total = 0.f;
  for (int c = 0; c < splits; c++) {
    const size_t j = (hl * splits + c) * G + g;
    const float lsum = part_ml[j * 2 + 1];
    if (lsum > 0.f) {
      const float w = __expf(part_ml[j * 2] - m_max);
      total += lsum * w;
      o += part_o[j * D + d] * w;
    }
  }
  out[(((size_t)hk * G + g) * L + l) * D + d] = T(o / total);
"""

_kernels: dict[str, object] = {}


def _kernel(name: str, inputs: list[str], outputs: list[str], source: str, contiguous: bool = True):
    if name not in _kernels:
        _kernels[name] = mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs,
                                             source=source, header=_HEADER, ensure_row_contiguous=contiguous)
    return _kernels[name]


def on_cuda() -> bool:
    """True where MLX runs on an NVIDIA GPU (its CUDA backend)."""
    return mx.default_device() == mx.gpu and not mx.metal.is_available()


def kernels_wanted() -> bool:
    """`DFLASH_TUI_KERNELS=0|1` forces them off or on (on: the pure-MLX references where no
    CUDA GPU is); unset: on MLX CUDA only."""
    flag = os.environ.get("DFLASH_TUI_KERNELS", "").strip()
    if flag:
        return flag not in ("0", "off", "false")
    return on_cuda()


_HALF = (mx.bfloat16, mx.float16)


def _dtype_fits(dtype: mx.Dtype) -> bool:
    # the kernels read 16-bit floats; the references take any float
    return dtype in _HALF or (dtype == mx.float32 and not on_cuda())


# -- attention ----------------------------------------------------------------

def block_attention_fits(q: mx.array, keys: mx.array, values: mx.array) -> bool:
    if q.ndim != 4 or keys.ndim != 4 or values.ndim != 4 or q.shape[0] != 1 or not 1 <= q.shape[2] <= MAX_ROWS:
        return False
    D = q.shape[3]
    return (keys.shape[3] == D and values.shape[3] == D and D % 32 == 0 and D <= 256 and _dtype_fits(q.dtype)
            and keys.dtype == q.dtype and values.dtype == q.dtype and q.shape[1] % keys.shape[1] == 0
            and keys.shape[2] >= q.shape[2] and _attention_warps(q, keys) > 0)


def _attention_warps(q: mx.array, keys: mx.array) -> int:
    """Warps per block: more for long caches (more keys in flight), as many as the combine
    step's shared memory (warps x G x D floats) allows; 0 if not even 4 fit."""
    G, D = q.shape[1] // keys.shape[1], q.shape[3]
    for warps in ((16, 8, 4) if keys.shape[2] >= 512 else (8, 4)):
        if warps * G * D * 4 <= 40_000:
            return warps
    return 0


def _float_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


# Caches from this many keys on are read split-K, CHUNK keys a block, where the heads are 128
# wide (measured on an H200 with `bench.block_kernels --parts attention`: 16 queries over 4096
# keys 215 -> 176 us, over 16384 keys 1099 -> 587 us; for 256-wide heads, with half the KV heads,
# splitting was no faster at any length, so they keep one block per (KV head, query)).
SPLIT_FROM_KEYS = 1024
SPLIT_CHUNK = 512
SPLIT_WARPS = 4
SPLIT_MAX_HEAD_DIM = 128


def attention_splits(keys: int, head_dim: int) -> int:
    """Key ranges a block_attention call over `keys` keys is split into (1: not split)."""
    return -(-keys // SPLIT_CHUNK) if keys >= SPLIT_FROM_KEYS and head_dim <= SPLIT_MAX_HEAD_DIM else 1


def block_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool) -> mx.array:
    """q [1, H, L, D] over keys/values [1, Hkv, S, D] (GQA; views of a cache's buffers are read
    in place, their rows must be contiguous); with `causal`, the L queries are the last L
    of the S keys. -> [1, H, L, D]."""
    _, H, L, D = q.shape
    splits = attention_splits(keys.shape[2], D)
    if not on_cuda():
        if splits > 1:
            return _split_attention_reference(q, keys, values, scale, causal, splits)
        return _attention_reference(q, keys, values, scale, causal)
    Hkv = keys.shape[1]
    if splits > 1:
        return _split_attention(q, keys, values, scale, causal, splits)
    warps = _attention_warps(q, keys)
    return _kernel("dflash_block_attention", ["q", "k", "v"], ["out"], _ATTENTION_SOURCE, contiguous=False)(
        inputs=[q, keys, values],
        template=[("T", q.dtype), ("D", D), ("G", H // Hkv), ("WARPS", warps), ("CAUSAL", bool(causal)),
                  ("SCALE_BITS", _float_bits(scale))],
        grid=(Hkv * L * 32 * warps, 1, 1),
        threadgroup=(32 * warps, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )[0]


def _split_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool,
                     splits: int) -> mx.array:
    _, H, L, D = q.shape
    Hkv, G, warps = keys.shape[1], H // keys.shape[1], SPLIT_WARPS
    part_o, part_ml = _kernel("dflash_split_attention", ["q", "k", "v"], ["part_o", "part_ml"],
                              _ATTENTION_SPLIT_SOURCE, contiguous=False)(
        inputs=[q, keys, values],
        template=[("T", q.dtype), ("D", D), ("G", G), ("WARPS", warps), ("CAUSAL", bool(causal)),
                  ("CHUNK", SPLIT_CHUNK), ("SCALE_BITS", _float_bits(scale))],
        grid=(Hkv * L * splits * 32 * warps, 1, 1),
        threadgroup=(32 * warps, 1, 1),
        output_shapes=[(Hkv, L, splits, G, D), (Hkv, L, splits, G, 2)],
        output_dtypes=[mx.float32, mx.float32],
    )
    n = Hkv * L * G * D
    return _kernel("dflash_split_combine", ["part_o", "part_ml"], ["out"], _ATTENTION_COMBINE_SOURCE)(
        inputs=[part_o, part_ml],
        template=[("T", q.dtype)],
        grid=(-(-n // 256) * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )[0]


def _attention_reference(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool) -> mx.array:
    _, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qf = (q.astype(mx.float32) * scale).reshape(1, Hkv, H // Hkv, L, D)
    scores = qf @ k.astype(mx.float32)[:, :, None].swapaxes(-1, -2)
    if causal:
        allowed = mx.arange(S)[None] <= (S - L + mx.arange(L))[:, None]
        scores = mx.where(allowed, scores, mx.array(-mx.inf, mx.float32))
    weights = mx.softmax(scores, axis=-1)
    return (weights @ v.astype(mx.float32)[:, :, None]).reshape(1, H, L, D).astype(q.dtype)


def _split_attention_reference(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool,
                               splits: int) -> mx.array:
    """The split kernels' arithmetic in MLX ops: per key range, an unnormalized output with its
    maximum and sum; then the ranges combined."""
    _, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qf = (q.astype(mx.float32) * scale).reshape(1, Hkv, H // Hkv, L, D)
    allowed = mx.arange(S)[None] <= (S - L + mx.arange(L))[:, None] if causal else mx.ones((L, S), mx.bool_)
    parts = []
    for c in range(splits):
        lo, hi = c * SPLIT_CHUNK, min((c + 1) * SPLIT_CHUNK, S)
        scores = qf @ k[:, :, None, lo:hi].astype(mx.float32).swapaxes(-1, -2)
        scores = mx.where(allowed[:, lo:hi], scores, mx.array(-mx.inf, mx.float32))
        m = scores.max(axis=-1, keepdims=True)
        w = mx.where(allowed[:, lo:hi], mx.exp(scores - mx.where(mx.isinf(m), 0.0, m)), 0.0)
        parts.append((w @ v[:, :, None, lo:hi].astype(mx.float32), m, w.sum(axis=-1, keepdims=True)))
    m_max = mx.max(mx.stack([mx.where(lsum > 0, m, -mx.inf) for _, m, lsum in parts]), axis=0)
    out = total = 0.0
    for o, m, lsum in parts:
        wt = mx.where(lsum > 0, mx.exp(m - m_max), 0.0)
        out, total = out + o * wt, total + lsum * wt
    return (out / total).reshape(1, H, L, D).astype(q.dtype)
