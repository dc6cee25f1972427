"""All queries per key range: one block per (KV head, key range) for all L x G query rows
(MLX's CUDA backend only).

The range's keys and values are read once, a tile at a time, into shared memory and
dotted there with every query row of the KV head, instead of once per query as the
split kernel (`cuda_split_attention`) reads them; the ranges are merged by its
`combine`. The products run on the tensor cores (`allq_attention`);
`allq_attention_reference` replays the arithmetic in MLX ops.
"""

from __future__ import annotations

import mlx.core as mx

from dflash_tui.engine.cuda_base import _float_bits, _kernel
from dflash_tui.engine.cuda_split_attention import (
    allowed_keys,
    combine,
    combine_reference,
)

# All queries at once, on the tensor cores: block (KV head, key range) holds the L x G query
# rows (row r = query r / G, head r % G) in shared memory; for each tile of TK keys, the
# tile's keys, the scores, each row's running maximum and sum, then the tile's values and
# the output (mma.sync m16n8k16, 16-bit inputs, float32 sums; fragment layouts as the PTX
# ISA gives them for that shape). Every key and value of the range is read from memory once
# for all rows; partials as the split kernel's. The rows are padded to MT
# tiles of 16, each warp takes whole 16 x 8 tiles of the scores and of the output (the output
# tiles stay in its registers), the weights rounded to 16 bits for the product with the values.
_ATTENTION_ALLQ_SOURCE = """
  constexpr int THREADS = 256, NWARPS = 8;
  constexpr int ROWS = L * G;
  constexpr int MT = ROWS <= 16 ? 1 : ROWS <= 32 ? 2 : ROWS <= 64 ? 4 : 8;  // 16-row tiles (8 % MT == 0)
  constexpr int RP = MT * 16;
  constexpr int DP = D + 8;
  constexpr int TKP = TK + 4;
  constexpr int ST = MT * (TK / 8);         // score tiles, warp w: w + NWARPS * i
  constexpr int SW = (ST + NWARPS - 1) / NWARPS;
  constexpr int OT = MT * (D / 8);          // output tiles, warp w: w + NWARPS * i (one row tile a warp)
  constexpr int OW = (OT + NWARPS - 1) / NWARPS;
  constexpr int JW = (TK + 31) / 32;
  constexpr int CH = (TK * (D / 8) + THREADS - 1) / THREADS;
  __shared__ __align__(16) T q_s[RP][DP];
  __shared__ __align__(16) T kv_s[TK][DP];
  __shared__ __align__(16) float p_s[RP][TKP];
  __shared__ float m_s[RP], l_s[RP], c_s[RP];
  const float NEG_INF = __int_as_float(0xff800000);
  const float sc = __int_as_float(SCALE_BITS);
  const int S = k_shape[2], Hkv = k_shape[1];
  const int splits = gridDim.x / Hkv;
  const int hk = blockIdx.x / splits, c = blockIdx.x % splits;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, gq = lane >> 2, tq = lane & 3;
  const int s_begin = c * CHUNK, s_end = min(s_begin + CHUNK, S);
  for (int i = t; i < RP * D; i += THREADS) {
    const int r = i / D, d = i % D;
    q_s[r][d] = r < ROWS ? q[(hk * G + r % G) * q_strides[1] + (r / G) * q_strides[2] + d * q_strides[3]] : T(0.f);
  }
  for (int r = t; r < RP; r += THREADS) { m_s[r] = NEG_INF; l_s[r] = 0.f; }
  float acc[OW][4];
#pragma unroll
  for (int i = 0; i < OW; i++) { acc[i][0] = 0.f; acc[i][1] = 0.f; acc[i][2] = 0.f; acc[i][3] = 0.f; }
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const int64_t k_row = k_strides[2], v_row = v_strides[2], k_col = k_strides[3], v_col = v_strides[3];
  const bool k_vec = k_col == 1 && k_row % 8 == 0 && (reinterpret_cast<size_t>(kb) & 15) == 0;
  const bool v_vec = v_col == 1 && v_row % 8 == 0 && (reinterpret_cast<size_t>(vb) & 15) == 0;
  auto fetch = [&](const T* base, int64_t row, int64_t col, bool vec, int s0, uint4 (&reg)[CH]) {
#pragma unroll
    for (int u = 0; u < CH; u++) {
      const int i = t + u * THREADS, s = s0 + i / (D / 8), d = (i % (D / 8)) * 8;
      const bool in = i < TK * (D / 8) && s < s_end;
      reg[u] = !in ? make_uint4(0u, 0u, 0u, 0u)
             : vec ? *reinterpret_cast<const uint4*>(base + s * row + d) : dflash_gather8(base + s * row + d * col, col);
    }
  };
  auto stash = [&](const uint4 (&reg)[CH]) {
#pragma unroll
    for (int u = 0; u < CH; u++) {
      const int i = t + u * THREADS;
      if (i < TK * (D / 8)) *reinterpret_cast<uint4*>(&kv_s[i / (D / 8)][(i % (D / 8)) * 8]) = reg[u];
    }
  };
  auto word = [](const T* p) { return *reinterpret_cast<const uint32_t*>(p); };
  auto half_bits = [](const T* p) { return (uint32_t)*reinterpret_cast<const unsigned short*>(p); };
  uint4 k_reg[CH], v_reg[CH];
  fetch(kb, k_row, k_col, k_vec, s_begin, k_reg);
  for (int s0 = s_begin; s0 < s_end; s0 += TK) {
    __syncthreads();  // the last tile's values are read (and q_s, m_s, l_s written before the first)
    stash(k_reg);
    __syncthreads();
    fetch(vb, v_row, v_col, v_vec, s0, v_reg);  // in flight during the scores
#pragma unroll 1
    for (int i = 0; i < SW; i++) {
      const int f = warp + NWARPS * i;
      if (f < ST) {
        const int m0 = (f % MT) * 16, n0 = (f / MT) * 8;
        float sc4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2  // (fully unrolled: over 128 registers, one block an SM)
        for (int kk = 0; kk < D; kk += 16) {
          const uint32_t a[4] = {word(&q_s[m0 + gq][kk + tq * 2]), word(&q_s[m0 + gq + 8][kk + tq * 2]),
                                 word(&q_s[m0 + gq][kk + tq * 2 + 8]), word(&q_s[m0 + gq + 8][kk + tq * 2 + 8])};
          const uint32_t b[2] = {word(&kv_s[n0 + gq][kk + tq * 2]), word(&kv_s[n0 + gq][kk + tq * 2 + 8])};
          dflash_mma16816(sc4, a, b, (const T*)nullptr);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = m0 + gq + (e >= 2 ? 8 : 0), j = n0 + tq * 2 + (e & 1), s = s0 + j;
          p_s[r][j] = r < ROWS && s < s_end && (!CAUSAL || s <= S - L + r / G) ? sc4[e] * sc : NEG_INF;
        }
      }
    }
    __syncthreads();
    stash(v_reg);  // the values replace the keys
    if (s0 + TK < s_end) fetch(kb, k_row, k_col, k_vec, s0 + TK, k_reg);  // in flight during softmax and output
    for (int r = warp; r < RP; r += NWARPS) {
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
      if (lane == 0) {
        const float corr = __expf(m_old - base);
        m_s[r] = m_new;
        l_s[r] = l_s[r] * corr + sum;
        c_s[r] = corr;
      }
    }
    __syncthreads();
    const int m0 = (warp % MT) * 16;  // this warp's row tile (the same for all its output tiles)
    const float c_lo = c_s[m0 + gq], c_hi = c_s[m0 + gq + 8];
#pragma unroll
    for (int i = 0; i < OW; i++) { acc[i][0] *= c_lo; acc[i][1] *= c_lo; acc[i][2] *= c_hi; acc[i][3] *= c_hi; }
#pragma unroll 1
    for (int kk = 0; kk < TK; kk += 16) {
      uint32_t a[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float2 pw = *reinterpret_cast<const float2*>(&p_s[m0 + gq + (e & 1) * 8][kk + tq * 2 + (e >> 1) * 8]);
        a[e] = dflash_pack2(pw, (const T*)nullptr);
      }
#pragma unroll
      for (int i = 0; i < OW; i++) {
        const int f = warp + NWARPS * i;
        if (f < OT) {
          const int n0 = (f / MT) * 8;
          const int key = kk + tq * 2, col = n0 + gq;  // b: keys key, key + 1 (and + 8, + 9) of column col
          const uint32_t b[2] = {half_bits(&kv_s[key][col]) | (half_bits(&kv_s[key + 1][col]) << 16),
                                 half_bits(&kv_s[key + 8][col]) | (half_bits(&kv_s[key + 9][col]) << 16)};
          dflash_mma16816(acc[i], a, b, (const T*)nullptr);
        }
      }
    }
  }
  // partials [Hkv, L, splits, G, D] and [.., G, 2], as the split kernel writes them
  const int m0 = (warp % MT) * 16;
#pragma unroll
  for (int i = 0; i < OW; i++) {
    const int f = warp + NWARPS * i;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = m0 + gq + h * 8;
      if (f < OT && r < ROWS) {
        const size_t j = (((size_t)hk * L + r / G) * splits + c) * G + r % G;
        const int col = (f / MT) * 8 + tq * 2;
        part_o[j * D + col] = acc[i][h * 2];
        part_o[j * D + col + 1] = acc[i][h * 2 + 1];
      }
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
    """Shared memory of the tensor-core kernel: rows padded to 16-row tiles (a power of 2)."""
    rp = 16 * (1 << max(0, (-(-rows // 16) - 1).bit_length()))
    return (rp + tile) * (head_dim + 8) * 2 + rp * (tile + 4) * 4 + rp * 12


def allq_fits(rows: int, head_dim: int, tile: int, chunk: int) -> bool:
    """Whether the tensor-core kernel takes `rows` query rows of `head_dim`: at most 128 rows,
    head widths 64/128/256, tiles of 16 or 32 keys, at most 64 output registers a thread."""
    mt = 1 << max(0, (-(-rows // 16) - 1).bit_length())
    return (rows <= 128 and head_dim in (64, 128, 256) and tile in (16, 32) and chunk % tile == 0
            and -(-mt * head_dim // 64) * 4 <= 64 and allq_shared_bytes(rows, head_dim, tile) <= SHARED_LIMIT)


def allq_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool,
                       chunk: int, tile: int) -> mx.array:
    """One block per (KV head, key range of `chunk` keys) for all queries and heads, read in
    tiles of `tile` keys on the tensor cores (the weights rounded to the inputs' 16 bits for
    the product with the values); then the ranges combined. Needs `allq_fits`."""
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
    return combine(part_o, part_ml, q)


# -- reference: the kernels' arithmetic in MLX ops ----------------------------------

def allq_attention_reference(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool,
                             chunk: int, tile: int) -> mx.array:
    """The all-queries kernel's arithmetic: per key range, tile after tile, each row's running
    maximum and sum (the output so far rescaled by exp(m_old - m_new)); then the ranges combined.
    The weights are rounded to q's dtype for the product with the values, as the tensor cores
    take them (the sums keep them in float32)."""
    _, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qf = q.astype(mx.float32).reshape(1, Hkv, H // Hkv, L, D)
    allowed = allowed_keys(L, S, causal)
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
            acc = acc * corr + p.astype(q.dtype).astype(mx.float32) @ v[:, :, None, t0:t1].astype(mx.float32)
            m = m_new
        parts.append((acc, m, lsum))
    return combine_reference(parts, q)
