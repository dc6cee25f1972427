"""Attention over a long KV cache split into key ranges (MLX's CUDA backend only).

Two ways to cut a few-query attention (L <= 16 queries, G query heads per KV head)
into more blocks than there are KV heads, each with a second launch that merges
the key ranges' partial outputs (flash decoding):

- `split_attention`: one block per (KV head, query, key range); each block reads
  its range's keys once per query;
- `allq_attention`: one block per (KV head, key range) for all L x G query rows;
  the range's keys and values are read once, a tile at a time, into shared memory
  and dotted with every row there.

`cuda_kernels.block_attention` chooses between these and its one-block kernel.
The pure-MLX references replay each kernel's arithmetic (its ranges, tiles and
combine) wherever the kernels cannot run.
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

# All queries at once: block (KV head, key range) holds the L x G query rows in shared memory
# (row r = query r / G, head r % G), then for each tile of TK keys: the tile's keys into shared
# memory, the ROWS x TK scores (thread: one key, ROWS / (THREADS / TK) rows), each row's running
# maximum and sum (one warp a row), the tile's values into the same buffer, and the ROWS x D
# output (thread: two adjacent columns of a few rows, kept in registers). Every key and value
# of the range is read from memory once for all L x G rows. Partials as the split kernel's.
_ATTENTION_ALLQ_SOURCE = """
  constexpr int THREADS = 256;
  constexpr int ROWS = L * G;
  constexpr int DP = D + 8;                 // padded rows: 16-byte loads of adjacent keys hit other banks
  constexpr int NRG = THREADS / TK;         // score phase: key t % TK, rows t / TK + NRG * i
  constexpr int SR = (ROWS + NRG - 1) / NRG;
  constexpr int NCP = D / 2;                // output phase: columns 2 (t % NCP) +0/+1, rows t / NCP + VRG * i
  constexpr int VRG = THREADS / NCP;
  constexpr int VR = (ROWS + VRG - 1) / VRG;
  constexpr int JW = (TK + 31) / 32;        // softmax phase: a lane's keys of the tile
  constexpr int CH = (TK * (D / 8) + THREADS - 1) / THREADS;
  __shared__ __align__(16) T q_s[ROWS][DP];
  __shared__ __align__(16) T kv_s[TK][DP];
  __shared__ __align__(16) float p_s[ROWS][TK];
  __shared__ float m_s[ROWS], l_s[ROWS], c_s[ROWS];
  const float NEG_INF = __int_as_float(0xff800000);
  const float sc = __int_as_float(SCALE_BITS);
  const int S = k_shape[2], Hkv = k_shape[1];
  const int splits = gridDim.x / Hkv;
  const int hk = blockIdx.x / splits, c = blockIdx.x % splits;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int s_begin = c * CHUNK, s_end = min(s_begin + CHUNK, S);
  for (int i = t; i < ROWS * D; i += THREADS) {
    const int r = i / D, d = i % D;
    q_s[r][d] = q[(hk * G + r % G) * q_strides[1] + (r / G) * q_strides[2] + d * q_strides[3]];
  }
  for (int r = t; r < ROWS; r += THREADS) { m_s[r] = NEG_INF; l_s[r] = 0.f; }
  float acc[VR][2];
#pragma unroll
  for (int i = 0; i < VR; i++) { acc[i][0] = 0.f; acc[i][1] = 0.f; }
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const int64_t k_row = k_strides[2], v_row = v_strides[2], k_col = k_strides[3], v_col = v_strides[3];
  const bool k_vec = k_col == 1 && k_row % 8 == 0 && (reinterpret_cast<size_t>(kb) & 15) == 0;
  const bool v_vec = v_col == 1 && v_row % 8 == 0 && (reinterpret_cast<size_t>(vb) & 15) == 0;
  const int jq = t % TK, rq = t / TK, cp = t % NCP, rv = t / NCP;
  // a tile's keys or values, 8 elements a piece, CH pieces a thread: fetched into registers while
  // the previous phase computes, then stashed into shared memory (rows past the range: zeros)
  auto fetch = [&](const T* base, int64_t row, int64_t col, bool vec, int s0, uint4 (&reg)[CH]) {
#pragma unroll
    for (int u = 0; u < CH; u++) {
      const int i = t + u * THREADS, s = s0 + i / (D / 8), d = (i % (D / 8)) * 8;
      const bool in = i < TK * (D / 8) && s < s_end;
      alignas(16) T h[8];
      if (in && vec) *reinterpret_cast<uint4*>(h) = *reinterpret_cast<const uint4*>(base + s * row + d);
      else {
#pragma unroll
        for (int e = 0; e < 8; e++) h[e] = in ? base[s * row + (d + e) * col] : T(0.f);
      }
      reg[u] = *reinterpret_cast<const uint4*>(h);
    }
  };
  auto stash = [&](const uint4 (&reg)[CH]) {
#pragma unroll
    for (int u = 0; u < CH; u++) {
      const int i = t + u * THREADS;
      if (i < TK * (D / 8)) *reinterpret_cast<uint4*>(&kv_s[i / (D / 8)][(i % (D / 8)) * 8]) = reg[u];
    }
  };
  uint4 k_reg[CH], v_reg[CH];
  fetch(kb, k_row, k_col, k_vec, s_begin, k_reg);
  for (int s0 = s_begin; s0 < s_end; s0 += TK) {
    __syncthreads();  // the last tile's values are read (and q_s, m_s, l_s written before the first)
    stash(k_reg);
    __syncthreads();
    fetch(vb, v_row, v_col, v_vec, s0, v_reg);  // in flight during the scores
    {
      float dot[SR];
#pragma unroll
      for (int i = 0; i < SR; i++) dot[i] = 0.f;
#pragma unroll 2
      for (int d = 0; d < D; d += 8) {
        float kf[8];
        dflash_unpack8<T>(*reinterpret_cast<const uint4*>(&kv_s[jq][d]), kf);
#pragma unroll
        for (int i = 0; i < SR; i++) {
          float qf[8];
          dflash_unpack8<T>(*reinterpret_cast<const uint4*>(&q_s[min(rq + NRG * i, ROWS - 1)][d]), qf);
#pragma unroll
          for (int e = 0; e < 8; e++) dot[i] = fmaf(qf[e], kf[e], dot[i]);
        }
      }
      const int s = s0 + jq;
#pragma unroll
      for (int i = 0; i < SR; i++) {
        const int r = rq + NRG * i;
        if (r < ROWS) p_s[r][jq] = s < s_end && (!CAUSAL || s <= S - L + r / G) ? dot[i] * sc : NEG_INF;
      }
    }
    __syncthreads();
    stash(v_reg);  // the values replace the keys
    if (s0 + TK < s_end) fetch(kb, k_row, k_col, k_vec, s0 + TK, k_reg);  // in flight during softmax and output
    for (int r = warp; r < ROWS; r += THREADS / 32) {
      float x[JW], m_tile = NEG_INF;
#pragma unroll
      for (int u = 0; u < JW; u++) {
        const int j = lane + 32 * u;
        x[u] = j < TK ? p_s[r][j] : NEG_INF;
        m_tile = fmaxf(m_tile, x[u]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, o));
      const float m_old = m_s[r], m_new = fmaxf(m_old, m_tile);
      const float base = m_new == NEG_INF ? 0.f : m_new;  // no key yet: every weight 0, no NaN
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < JW; u++) {
        const int j = lane + 32 * u;
        const float p = __expf(x[u] - base);
        if (j < TK) p_s[r][j] = p;
        sum += p;
      }
      sum = dflash_warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        const float corr = __expf(m_old - base);
        m_s[r] = m_new;
        l_s[r] = l_s[r] * corr + sum;
        c_s[r] = corr;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < VR; i++) {
      const float corr = c_s[min(rv + VRG * i, ROWS - 1)];
      acc[i][0] *= corr;
      acc[i][1] *= corr;
    }
#pragma unroll 1
    for (int j = 0; j < TK; j += 4) {
      float2 vf[4];
#pragma unroll
      for (int e = 0; e < 4; e++) vf[e] = dflash_pair<T>(&kv_s[j + e][2 * cp]);
#pragma unroll
      for (int i = 0; i < VR; i++) {
        const float4 p = *reinterpret_cast<const float4*>(&p_s[min(rv + VRG * i, ROWS - 1)][j]);
        acc[i][0] = fmaf(p.x, vf[0].x, fmaf(p.y, vf[1].x, fmaf(p.z, vf[2].x, fmaf(p.w, vf[3].x, acc[i][0]))));
        acc[i][1] = fmaf(p.x, vf[0].y, fmaf(p.y, vf[1].y, fmaf(p.z, vf[2].y, fmaf(p.w, vf[3].y, acc[i][1]))));
      }
    }
  }
  // partials [Hkv, L, splits, G, D] and [.., G, 2], as the split kernel writes them
#pragma unroll
  for (int i = 0; i < VR; i++) {
    const int r = rv + VRG * i;
    if (r < ROWS) {
      const size_t j = (((size_t)hk * L + r / G) * splits + c) * G + r % G;
      part_o[j * D + 2 * cp] = acc[i][0];
      part_o[j * D + 2 * cp + 1] = acc[i][1];
    }
  }
  for (int r = t; r < ROWS; r += THREADS) {
    const size_t j = (((size_t)hk * L + r / G) * splits + c) * G + r % G;
    part_ml[j * 2] = m_s[r];
    part_ml[j * 2 + 1] = l_s[r];
  }
"""

ALLQ_THREADS = 256  # the all-queries kernel's block (THREADS in its source)
SHARED_LIMIT = 48 * 1024  # static shared memory a block may declare


def allq_shared_bytes(rows: int, head_dim: int, tile: int) -> int:
    """Shared memory of the all-queries kernel: query rows and one key/value tile (16-bit, rows
    padded by 8), the tile's scores and the rows' maximum, sum and correction (float32)."""
    return (rows + tile) * (head_dim + 8) * 2 + rows * tile * 4 + rows * 12


def allq_fits(rows: int, head_dim: int, tile: int, chunk: int) -> bool:
    """Whether the all-queries kernel takes `rows` (= L x G) query rows of `head_dim` with this
    tile and key range: shared memory within a block's limit, at most 64 output registers per
    thread, head widths 32/64/128/256."""
    return (head_dim in (32, 64, 128, 256) and tile in (16, 32, 64) and chunk % tile == 0
            and rows * head_dim <= 64 * ALLQ_THREADS and allq_shared_bytes(rows, head_dim, tile) <= SHARED_LIMIT)


def _combine(part_o: mx.array, part_ml: mx.array, q: mx.array) -> mx.array:
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
    return _combine(part_o, part_ml, q)


def allq_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool,
                   chunk: int, tile: int) -> mx.array:
    """One block per (KV head, key range of `chunk` keys) for all queries and heads, read in
    tiles of `tile` keys; then the ranges combined. Needs `allq_fits`."""
    _, H, L, D = q.shape
    Hkv, S, G = keys.shape[1], keys.shape[2], H // keys.shape[1]
    if not allq_fits(L * G, D, tile, chunk):
        raise ValueError(f"allq_attention: {L} x {G} rows of {D} do not fit tiles of {tile} in ranges of {chunk}")
    splits = -(-S // chunk)
    part_o, part_ml = _kernel("dflash_allq_attention", ["q", "k", "v"], ["part_o", "part_ml"],
                              _ATTENTION_ALLQ_SOURCE, contiguous=False)(
        inputs=[q, keys, values],
        template=[("T", q.dtype), ("D", D), ("L", L), ("G", G), ("TK", tile), ("CHUNK", chunk),
                  ("CAUSAL", bool(causal)), ("SCALE_BITS", _float_bits(scale))],
        grid=(Hkv * splits * ALLQ_THREADS, 1, 1),
        threadgroup=(ALLQ_THREADS, 1, 1),
        output_shapes=[(Hkv, L, splits, G, D), (Hkv, L, splits, G, 2)],
        output_dtypes=[mx.float32, mx.float32],
    )
    return _combine(part_o, part_ml, q)


# -- references: the kernels' arithmetic in MLX ops ----------------------------------------

def _allowed(L: int, S: int, causal: bool) -> mx.array:
    return mx.arange(S)[None] <= (S - L + mx.arange(L))[:, None] if causal else mx.ones((L, S), mx.bool_)


def _combine_reference(parts: list[tuple[mx.array, mx.array, mx.array]], q: mx.array) -> mx.array:
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
    allowed = _allowed(L, S, causal)
    parts = []
    for c in range(splits):
        lo, hi = c * chunk, min((c + 1) * chunk, S)
        scores = qf @ k[:, :, None, lo:hi].astype(mx.float32).swapaxes(-1, -2)
        scores = mx.where(allowed[:, lo:hi], scores, mx.array(-mx.inf, mx.float32))
        m = scores.max(axis=-1, keepdims=True)
        w = mx.where(allowed[:, lo:hi], mx.exp(scores - mx.where(mx.isinf(m), 0.0, m)), 0.0)
        parts.append((w @ v[:, :, None, lo:hi].astype(mx.float32), m, w.sum(axis=-1, keepdims=True)))
    return _combine_reference(parts, q)


def allq_attention_reference(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool,
                             chunk: int, tile: int) -> mx.array:
    """The all-queries kernel's arithmetic: per key range, tile after tile, each row's running
    maximum and sum (the output so far rescaled by exp(m_old - m_new)); then the ranges combined."""
    _, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qf = q.astype(mx.float32).reshape(1, Hkv, H // Hkv, L, D)
    allowed = _allowed(L, S, causal)
    neg_inf = mx.array(-mx.inf, mx.float32)
    parts = []
    for lo in range(0, S, chunk):
        hi = min(lo + chunk, S)
        m = mx.full((1, Hkv, H // Hkv, L, 1), -mx.inf)
        lsum, acc = mx.zeros(m.shape), mx.zeros(qf.shape)
        for t0 in range(lo, hi, tile):
            t1 = min(t0 + tile, hi)
            scores = (qf @ k[:, :, None, t0:t1].astype(mx.float32).swapaxes(-1, -2)) * scale
            scores = mx.where(allowed[:, t0:t1], scores, neg_inf)
            m_new = mx.maximum(m, scores.max(axis=-1, keepdims=True))
            base = mx.where(mx.isinf(m_new), 0.0, m_new)  # no key yet: every weight 0
            corr, p = mx.exp(m - base), mx.exp(scores - base)
            lsum = lsum * corr + p.sum(axis=-1, keepdims=True)
            acc = acc * corr + p @ v[:, :, None, t0:t1].astype(mx.float32)
            m = m_new
        parts.append((acc, m, lsum))
    return _combine_reference(parts, q)
