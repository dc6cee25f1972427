"""A quantized matmul whose every row equals MLX CUDA's one-row result (batch invariance).

mlx-lm's quantized layers call `mx.quantized_matmul(x, wq, scales, biases, transpose=True)`.
On MLX CUDA a one-row call runs the `qmv` kernel and a 16-row call a tensor-core gemm, so a
verify's rows and single decode steps round differently. `rowwise_quantized_matmul` computes
up to 16 rows in one launch, reading each packed weight, scale and bias once for all rows,
and reduces every row in exactly qmv's order with the same precision per step.

MLX CUDA's dispatch (mlx/backend/cuda/quantized/quantized.cpp, QuantizedMatmul::eval_gpu, and
qmm/qmm.cu's supports_*; MLX commit 846d17622), for affine 4/8-bit, bf16/fp16, transpose=True:
- qmm_sm90 only when group_size >= K (per-channel), so never for groups of 32/64 with K > 64;
- compute capability >= 8 with N % 128 == 0 and K % max(64, group) == 0: qmv when M * batch < 8,
  else qmm_sm80 (tensor cores, another order);
- otherwise qmm_naive under the same M * batch < 8 rule, and qmv where no qmm applies;
- qmv needs K % 8 == 0, row-contiguous w/scales/biases and transpose (fp_qmv is for cc > 9 and
  non-affine modes only).
So a one-row call with a group smaller than K is qmv, and so are 2..7 rows (one grid row per x
row: bit-equal to one-row calls); 8..16 rows go to qmm_sm80. That qmv is what is replayed here.

qmv's order (mlx/backend/cuda/quantized/qmm/qmv.cu, qmv_kernel_impl; commit 846d17622; CUTLASS
v4.4.2 as MLX fetches it), for one output feature f, one warp:
- E = elems_per_thread = 16 for 4-bit with a 16-bit T, 8 for 8-bit. Lane l takes the tiles of
  E consecutive columns starting at l*E + r*32*E, r = 0, 1, ... in order (the residue tile at
  l*E + K - K % (32E) is the same sequence continued, since K is a multiple of the group).
- Per tile: scale s and bias b of the tile's group (both T); each value q (exact in T) is
  dequantized as `q * s + b` in T. CUTLASS's bfloat16_t/half_t operators are __hmul then
  __hadd, which on sm_90 are `mul.bf16` and `add.bf16` without a rounding modifier: ptxas
  contracts them into one fma.rn (checked in the SASS nvcc 13 makes of that code:
  HFMA2.BF16_V2 q, s, b). So w = fma_T(q, s, b), one rounding.
- bits < 8: `sums` is an array of E accumulators in T (not float): sums[i] = fma.rn_T(x_i, w_i,
  sums[i]) (cutlass::fma on Array<bfloat16_t> is inline `fma.rn.bf16x2`; half: __hfma2), one
  rounding to T per step, starting at +0.
  bits == 8: sums[i] are floats: sums[i] = fmaf(float(x_i), float(w_i), sums[i]) (the product of
  two 16-bit floats is exact in float, so contraction does not matter).
- Then a float `sum = 0; sum += float(sums[i])` for i = 0..E-1 in order, then cg::reduce over
  the warp, which for float is the xor butterfly out += shfl_xor(out, 16, 8, 4, 2, 1), and lane
  0 stores T(sum) rounded to nearest.

The kernel below keeps that order for every (feature, row): a warp computes R features for MB
rows (the grid's second axis splits M into MB-row slices), so each dequantized weight tile
serves MB rows and each x tile R features; R and MB change the speed, never a row's result.
"""

from __future__ import annotations

import mlx.core as mx

from dflash_tui.engine.cuda_kernels import _HEADER, on_cuda

MAX_ROWS = 16
GROUP_SIZES = (32, 64)
BITS = (4, 8)
ROWS_PER_WARP = 4  # MB; neither it nor the next two change any row's order
FEATURES_PER_WARP = 2  # R
WARPS = 4  # per block

_RQ_HEADER = _HEADER + """
template <bool C, typename A, typename B> struct rq_if { using type = A; };
template <typename A, typename B> struct rq_if<false, A, B> { using type = B; };
template <typename T> struct rq_pair;
template <> struct rq_pair<__nv_bfloat16> { using type = __nv_bfloat162; };
template <> struct rq_pair<__half> { using type = __half2; };

// Two unsigned values (each below 2^BITS) as an exact pair of T, without a slow I2F each: their
// bits under the exponent of 2^7 (bf16, 4-bit), 2^10 (half) or 2^23 (float, 8-bit in bf16),
// minus that power of two. Exact, so the same values as MLX's converters.
template <int BITS>
__device__ __forceinline__ void rq_uint_pair(unsigned lo, unsigned hi, __nv_bfloat162& d) {
  if constexpr (BITS <= 7) {
    const unsigned u = 0x43004300u | lo | (hi << 16);
    d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&u), __float2bfloat162_rn(128.f));
  } else {
    d = __floats2bfloat162_rn(__uint_as_float(0x4B000000u | lo) - 8388608.f,
                              __uint_as_float(0x4B000000u | hi) - 8388608.f);
  }
}
template <int BITS>
__device__ __forceinline__ void rq_uint_pair(unsigned lo, unsigned hi, __half2& d) {
  const unsigned u = 0x64006400u | lo | (hi << 16);
  d = __hsub2(*reinterpret_cast<const __half2*>(&u), __float2half2_rn(1024.f));
}
__device__ __forceinline__ void rq_zero(__nv_bfloat162& a) { a = __float2bfloat162_rn(0.f); }
__device__ __forceinline__ void rq_zero(__half2& a) { a = __float2half2_rn(0.f); }
__device__ __forceinline__ void rq_zero(float& a) { a = 0.f; }

// One lane's tile for one row: 8-bit, E float accumulators, fmaf per element (qmv's float path);
// 4-bit, E accumulators in T kept as pairs, fma.rn per element (qmv's cutlass::fma on T).
template <int P, typename T2>
__device__ __forceinline__ void rq_fma_tile(float* acc, const T2* xv, const T2* wd) {
#pragma unroll
  for (int p = 0; p < P; p++) {
    acc[2 * p] = fmaf(__low2float(xv[p]), __low2float(wd[p]), acc[2 * p]);
    acc[2 * p + 1] = fmaf(__high2float(xv[p]), __high2float(wd[p]), acc[2 * p + 1]);
  }
}
template <int P, typename T2>
__device__ __forceinline__ void rq_fma_tile(T2* acc, const T2* xv, const T2* wd) {
#pragma unroll
  for (int p = 0; p < P; p++) acc[p] = __hfma2(xv[p], wd[p], acc[p]);
}
// qmv's `float sum = 0; sum += sums[i]` for i = 0..E-1 in order
template <int NA>
__device__ __forceinline__ float rq_lane_sum(const float* acc) {
  float sum = 0.f;
#pragma unroll
  for (int a = 0; a < NA; a++) sum += acc[a];
  return sum;
}
template <int NA, typename T2>
__device__ __forceinline__ float rq_lane_sum(const T2* acc) {
  float sum = 0.f;
#pragma unroll
  for (int a = 0; a < NA; a++) {
    sum += __low2float(acc[a]);
    sum += __high2float(acc[a]);
  }
  return sum;
}

// q * s + b in T, one fused rounding per element: what MLX's build makes of its __hmul then
// __hadd on sm_90 (on the H200, the two-rounding form gave 0 of 16 rows equal, this one 16).
template <typename T2>
__device__ __forceinline__ T2 rq_dequant(T2 q, T2 s, T2 b) {
  return __hfma2(q, s, b);
}

// A lane's tile of one feature: E values (64 bits, two words), dequantized in pairs.
template <int BITS, typename T, typename T2, int P>
__device__ __forceinline__ void rq_dequant_tile(uint2 q, T s, T b, T2 (&wd)[P]) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  T2 s2, b2;
  s2.x = s; s2.y = s; b2.x = b; b2.y = b;
#pragma unroll
  for (int p = 0; p < P; p++) {
    const int i = 2 * p;  // PER_WORD is even: a pair never straddles the two words
    const unsigned word = i < PER_WORD ? q.x : q.y;
    T2 qv;
    rq_uint_pair<BITS>((word >> ((i % PER_WORD) * BITS)) & MASK, (word >> (((i + 1) % PER_WORD) * BITS)) & MASK, qv);
    wd[p] = rq_dequant(qv, s2, b2);
  }
}
"""

# Inputs: x [M, K] (T), w [N, K*BITS/32] (uint32, MLX's packing: value j of a word at bits
# j*BITS), scales/biases [N, K/GS] (T). Template: T, M, MB (rows per warp), R (features per warp),
# BITS, GS. A warp dequantizes a tile of R features once for its MB rows and loads each x
# tile once for its R features; every (feature, row) keeps qmv's own chain of operations.
_SOURCE = """
  constexpr int E = BITS == 4 ? 16 : 8;  // qmv's elems_per_thread for a 16-bit T
  constexpr int P = E / 2;
  constexpr int PER_WORD = 32 / BITS;
  using T2 = typename rq_pair<T>::type;
  // 4-bit: E accumulators in T (as pairs); 8-bit: E floats
  using Acc = typename rq_if<(BITS >= 8), float, T2>::type;
  constexpr int NA = BITS >= 8 ? E : P;
  const int K = x_shape[1];
  const int N = scales_shape[0];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f0 = (blockIdx.x * (blockDim.x >> 5) + warp) * R;
  const int m0 = blockIdx.y * MB;
  if (f0 >= N) return;
  const uint32_t* wrow[R];
  const T* srow[R];
  const T* brow[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const size_t fr = f0 + r < N ? f0 + r : N - 1;  // a tail warp reads the last feature again
    wrow[r] = w + fr * (K / PER_WORD);
    srow[r] = scales + fr * (K / GS);
    brow[r] = biases + fr * (K / GS);
  }
  Acc acc[R][MB][NA];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int mm = 0; mm < MB; mm++)
#pragma unroll
      for (int a = 0; a < NA; a++) rq_zero(acc[r][mm][a]);
  for (int idx = lane * E; idx < K; idx += 32 * E) {
    T2 wd[R][P];
#pragma unroll
    for (int r = 0; r < R; r++) {
      // E values = 64 bits for both widths
      const uint2 q = *reinterpret_cast<const uint2*>(wrow[r] + idx / PER_WORD);
      rq_dequant_tile<BITS>(q, srow[r][idx / GS], brow[r][idx / GS], wd[r]);
    }
#pragma unroll
    for (int mm = 0; mm < MB; mm++) {
      if (m0 + mm >= M) break;
      alignas(16) T2 xv[P];
      const uint4* xp = reinterpret_cast<const uint4*>(x + (size_t)(m0 + mm) * K + idx);
#pragma unroll
      for (int v = 0; v < P / 4; v++) reinterpret_cast<uint4*>(xv)[v] = xp[v];
#pragma unroll
      for (int r = 0; r < R; r++) rq_fma_tile<P>(acc[r][mm], xv, wd[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int mm = 0; mm < MB; mm++) {
      if (m0 + mm >= M) break;
      const float sum = dflash_warp_sum(rq_lane_sum<NA>(acc[r][mm]));
      if (lane == 0 && f0 + r < N) out[(size_t)(m0 + mm) * N + f0 + r] = T(sum);
    }
"""

_kernel = None


def replays_qmv(x: mx.array, wq: mx.array, scales: mx.array, biases: mx.array | None, group_size: int,
                bits: int) -> bool:
    """Whether MLX CUDA's one-row call for these arguments is the qmv replayed here (and the
    kernel takes them): affine 4/8-bit, groups of 32/64 smaller than K, bf16/fp16, 2-D packed
    weights, up to 16 rows."""
    k = x.shape[-1]
    return (bits in BITS and group_size in GROUP_SIZES and biases is not None
            and x.dtype in (mx.bfloat16, mx.float16) and scales.dtype == x.dtype and biases.dtype == x.dtype
            and wq.dtype == mx.uint32 and wq.ndim == 2 and scales.ndim == 2 and biases.shape == scales.shape
            and k % group_size == 0 and k > group_size and wq.shape[1] * 32 // bits == k
            and scales.shape == (wq.shape[0], k // group_size) and 1 <= x.size // k <= MAX_ROWS)


def rowwise_quantized_matmul(x: mx.array, wq: mx.array, scales: mx.array, biases: mx.array | None,
                             group_size: int = 64, bits: int = 4, *, rows_per_warp: int = 0,
                             features_per_warp: int = 0) -> mx.array | None:
    """`x @ dequantize(wq).T` with every row equal to MLX CUDA's one-row call (its qmv) bit for
    bit. Elsewhere than MLX CUDA, MLX's own `quantized_matmul`. On MLX CUDA, None where the
    one-row call is not the replayed qmv (see `replays_qmv`): the caller keeps its own path."""
    k, n = x.shape[-1], wq.shape[0]
    rows = x.size // k
    if not on_cuda() or rows == 1:  # one row: MLX's own call is the reference itself
        return mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group_size, bits=bits)
    if not replays_qmv(x, wq, scales, biases, group_size, bits):
        return None
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(name="dflash_rowwise_qmv", input_names=["x", "w", "scales", "biases"],
                                      output_names=["out"], source=_SOURCE, header=_RQ_HEADER,
                                      ensure_row_contiguous=True)
    mb = min(rows_per_warp or ROWS_PER_WARP, rows)
    r = features_per_warp or FEATURES_PER_WARP
    out = _kernel(inputs=[x.reshape(rows, k), wq, scales, biases],
                  template=[("T", x.dtype), ("M", rows), ("MB", mb), ("R", r), ("BITS", bits), ("GS", group_size)],
                  grid=(-(-n // (WARPS * r)) * 32 * WARPS, -(-rows // mb), 1), threadgroup=(32 * WARPS, 1, 1),
                  output_shapes=[(rows, n)], output_dtypes=[x.dtype])[0]
    return out.reshape(*x.shape[:-1], n)
