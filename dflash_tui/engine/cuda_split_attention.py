"""Attention over a long KV cache split into key ranges (MLX's CUDA backend only).

A few-query attention (L <= 16 queries, G query heads per KV head) cut into more
blocks than there are KV heads, with a second launch that merges the key ranges'
partial outputs (flash decoding). Here: `split_attention`, one block per (KV head,
query, key range), each block reading its range's keys once per query; the merge
(`combine`), which `cuda_allq_attention` (one block per KV head and key range for
all queries) shares. `cuda_kernels.block_attention` chooses among the kernels.
The pure-MLX references replay each kernel's arithmetic (its ranges and combine)
wherever the kernels cannot run.
"""

from __future__ import annotations

import mlx.core as mx

from dflash_tui.engine.cuda_base import _float_bits, _kernel

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

def combine(part_o: mx.array, part_ml: mx.array, q: mx.array) -> mx.array:
    """The key ranges' partials [Hkv, L, ranges, G, D] (and [.., 2]: maximum, sum) merged into q's shape."""
    Hkv, L, _, G, D = part_o.shape
    n = Hkv * L * G * D
    return _kernel("dflash_split_combine", ["part_o", "part_ml"], ["out"], _ATTENTION_COMBINE_SOURCE)(
        inputs=[part_o, part_ml],
        template=[("T", q.dtype)],
        grid=(-(-n // 256) * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )[0]


def split_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool,
                    splits: int, chunk: int, warps: int) -> mx.array:
    """One block per (KV head, query, key range of `chunk` keys), then the ranges combined."""
    _, H, L, D = q.shape
    Hkv, G = keys.shape[1], H // keys.shape[1]
    part_o, part_ml = _kernel("dflash_split_attention", ["q", "k", "v"], ["part_o", "part_ml"],
                              _ATTENTION_SPLIT_SOURCE, contiguous=False)(
        inputs=[q, keys, values],
        template=[("T", q.dtype), ("D", D), ("G", G), ("WARPS", warps), ("CAUSAL", bool(causal)),
                  ("CHUNK", chunk), ("SCALE_BITS", _float_bits(scale))],
        grid=(Hkv * L * splits * 32 * warps, 1, 1),
        threadgroup=(32 * warps, 1, 1),
        output_shapes=[(Hkv, L, splits, G, D), (Hkv, L, splits, G, 2)],
        output_dtypes=[mx.float32, mx.float32],
    )
    return combine(part_o, part_ml, q)


# -- references: the kernels' arithmetic in MLX ops ----------------------------------------

def allowed_keys(L: int, S: int, causal: bool) -> mx.array:
    return mx.arange(S)[None] <= (S - L + mx.arange(L))[:, None] if causal else mx.ones((L, S), mx.bool_)


def combine_reference(parts: list[tuple[mx.array, mx.array, mx.array]], q: mx.array) -> mx.array:
    """Key ranges' (unnormalized output, maximum, sum) merged as the combine kernel does:
    weights exp(m_range - m_max), ranges that saw no key skipped."""
    _, H, L, D = q.shape
    m_max = mx.max(mx.stack([mx.where(lsum > 0, m, -mx.inf) for _, m, lsum in parts]), axis=0)
    out = total = 0.0
    for o, m, lsum in parts:
        wt = mx.where(lsum > 0, mx.exp(m - m_max), 0.0)
        out, total = out + o * wt, total + lsum * wt
    return (out / total).reshape(1, H, L, D).astype(q.dtype)


def split_attention_reference(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool,
                              splits: int, chunk: int) -> mx.array:
    """The split kernels' arithmetic: per key range, an unnormalized output with its maximum
    and sum; then the ranges combined."""
    _, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qf = (q.astype(mx.float32) * scale).reshape(1, Hkv, H // Hkv, L, D)
    allowed = allowed_keys(L, S, causal)
    parts = []
    for c in range(splits):
        lo, hi = c * chunk, min((c + 1) * chunk, S)
        scores = qf @ k[:, :, None, lo:hi].astype(mx.float32).swapaxes(-1, -2)
        scores = mx.where(allowed[:, lo:hi], scores, mx.array(-mx.inf, mx.float32))
        m = scores.max(axis=-1, keepdims=True)
        w = mx.where(allowed[:, lo:hi], mx.exp(scores - mx.where(mx.isinf(m), 0.0, m)), 0.0)
        parts.append((w @ v[:, :, None, lo:hi].astype(mx.float32), m, w.sum(axis=-1, keepdims=True)))
    return combine_reference(parts, q)
