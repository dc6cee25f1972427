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

The layout keeps that order for every (feature, row): qmv's E accumulators of a lane are
independent chains, so a thread takes 8 of them (an octet) for F features and MB rows, and the
4 feature groups of a warp read the same x values (one broadcast load); several weights of one
input go in one launch (`rowwise_quantized_matmuls`). Equal to MLX's qmv on the device (the
CUDA-only tests) and to a NumPy replay of qmv on the CPU (the source run by
tests/cuda_emulate.py); measured against other layouts in docs/batch-invariance.md.
"""

from __future__ import annotations

import mlx.core as mx

from dflash_tui.engine.cuda_base import keep_plan, kept_plan
from dflash_tui.engine.cuda_kernels import _HEADER, on_cuda

MAX_ROWS = 16
GROUP_SIZES = (32, 64)
BITS = (4, 8)
# bits -> (F features a thread, MB rows a block): at 4-bit the fastest of five on an H100 (and
# faster than a warp a feature); at 8-bit chosen by registers (ptxas, sm_90: 123 a thread).
GEOMETRY = {4: (2, 8), 8: (2, 4)}

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
// qmv's `float sum = 0; sum += sums[i]` for i = 0..E-1 in order, from `sum` (0, or where a qmv
// lane's positions are split over two threads, the first one's partial: every addition is qmv's)
template <int NA>
__device__ __forceinline__ float rq_lane_sum_from(float sum, const float* acc) {
#pragma unroll
  for (int a = 0; a < NA; a++) sum += acc[a];
  return sum;
}
template <int NA, typename T2>
__device__ __forceinline__ float rq_lane_sum_from(float sum, const T2* acc) {
#pragma unroll
  for (int a = 0; a < NA; a++) {
    sum += __low2float(acc[a]);
    sum += __high2float(acc[a]);
  }
  return sum;
}

// One level of the warp butterfly (out += shfl_xor(out, O)) for the lanes below O, which lane 0's
// sum is made of (the lanes above O hold the same sums, added the other way round)
template <int O>
__device__ __forceinline__ void rq_tree_level(float (&v)[32]) {
#pragma unroll
  for (int l = 0; l < O; l++) v[l] = v[l] + v[l + O];
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
# j*BITS), scales/biases [N, K/GS] (T). Template: T, M, MB (rows a block), F (features a
# thread), BITS, GS; the prologue (`_octet_source`) names K, N, bx (the block's feature block),
# w, scales, biases, out. A thread holds one octet of a qmv lane's chains for F features and MB
# rows, dequantizing each weight once for its MB rows. The end goes through shared memory in
# qmv's order: a lane's second octet goes on from the first's partial sum, and one thread per
# output adds the 32 lane sums in the butterfly's tree.
_OCTET_BODY = """
  constexpr int E = BITS == 4 ? 16 : 8;      // qmv's elems_per_thread for a 16-bit T
  constexpr int H = E / 8;                   // octets (threads) per qmv lane
  constexpr int STEP = 32 * E;               // columns of one qmv tile step
  constexpr int PER_WORD = 32 / BITS;
  constexpr int FB = 4 * F;                  // features per block
  constexpr int NO = 4 * F * MB;             // outputs per block
  using T2 = typename rq_pair<T>::type;
  using Acc = typename rq_if<(BITS >= 8), float, T2>::type;
  constexpr int NA = BITS >= 8 ? 8 : 4;      // accumulators per octet (floats, or pairs of T)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int o = warp * 8 + (lane & 7);       // the octet: columns 8o .. 8o+7 of every step
  const int ql = o / H, h = o % H;           // qmv's lane, and which of its octets
  const int fg = lane >> 3;
  const int fbase = bx * FB + fg * F;
  const int m0 = blockIdx.y * MB;
  const int mlast = M - 1;              // rows past M read the last row (not written)
  Acc acc[F][MB][NA];
#pragma unroll
  for (int r = 0; r < F; r++)
#pragma unroll
    for (int mm = 0; mm < MB; mm++)
#pragma unroll
      for (int a = 0; a < NA; a++) rq_zero(acc[r][mm][a]);
  // qmv's lane takes a tile only where it starts below K (K is a multiple of the group): an
  // octet likewise
  for (int col = 8 * o; col < K; col += STEP) {
    T2 wd[F][4];
#pragma unroll
    for (int r = 0; r < F; r++) {
      const int fr = min(fbase + r, N - 1);  // past N: the last feature again (not written)
      uint2 q;
      if constexpr (BITS == 4) {
        q.x = w[fr * (K / PER_WORD) + col / PER_WORD];
        q.y = 0u;
      } else {
        q = *reinterpret_cast<const uint2*>(w + fr * (K / PER_WORD) + col / PER_WORD);
      }
      rq_dequant_tile<BITS>(q, scales[fr * (K / GS) + col / GS], biases[fr * (K / GS) + col / GS], wd[r]);
    }
#pragma unroll
    for (int mm = 0; mm < MB; mm++) {
      alignas(16) T2 xv[4];
      *reinterpret_cast<uint4*>(xv) = *reinterpret_cast<const uint4*>(x + min(m0 + mm, mlast) * K + col);
#pragma unroll
      for (int r = 0; r < F; r++) rq_fma_tile<4>(acc[r][mm], xv, wd[r]);
    }
  }
  // a lane's sum: its first octet's partial, continued by the second (the next thread)
  __shared__ float red[NO][33];
#pragma unroll
  for (int r = 0; r < F; r++)
#pragma unroll
    for (int mm = 0; mm < MB; mm++) {
      float sum = rq_lane_sum_from<NA>(0.f, acc[r][mm]);
      if constexpr (H == 2) {
        const float first = __shfl_xor_sync(0xffffffffu, sum, 1);
        sum = rq_lane_sum_from<NA>(first, acc[r][mm]);
      }
      if (h == H - 1) red[(fg * F + r) * MB + mm][ql] = sum;
    }
  __syncthreads();
  // the butterfly (offsets 16, 8, 4, 2, 1) as lane 0 sees it: each node adds the same two sums
  if (threadIdx.x < NO) {
    const int j = threadIdx.x;
    float v[32];
#pragma unroll
    for (int l = 0; l < 32; l++) v[l] = red[j][l];
    rq_tree_level<16>(v);
    rq_tree_level<8>(v);
    rq_tree_level<4>(v);
    rq_tree_level<2>(v);
    rq_tree_level<1>(v);
    const int f = bx * FB + j / MB, m = m0 + j % MB;
    if (f < N && m < M) out[(size_t)m * N + f] = T(v[0]);
  }
"""


def _octet_source(count: int) -> str:
    """The octet kernel for inputs x, then w, scales, biases of each of `count` weights (one K) and
    outputs out0 ..: the grid's blocks go to the first weight's features, then the second's, and so
    on; each block computes what it would for its weight alone."""
    lines = ["  const int K = x_shape[1];", "  int bx = blockIdx.x, N = scales0_shape[0];",
             "  const uint32_t* w = w0;", "  const T* scales = scales0;", "  const T* biases = biases0;",
             "  T* out = out0;", "  constexpr int FBW = 4 * F;"]
    for i in range(1, count):
        lines.append(f"  if (bx >= (N + FBW - 1) / FBW) {{ bx -= (N + FBW - 1) / FBW; N = scales{i}_shape[0]; "
                     f"w = w{i}; scales = scales{i}; biases = biases{i}; out = out{i}; }}")
    return "\n".join(lines) + "\n" + _OCTET_BODY


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
                             group_size: int = 64, bits: int = 4) -> mx.array | None:
    """`x @ dequantize(wq).T` with every row equal to MLX CUDA's one-row call (its qmv) bit for
    bit. Elsewhere than MLX CUDA, MLX's own `quantized_matmul`. On MLX CUDA, None where the
    one-row call is not the replayed qmv (see `replays_qmv`): the caller keeps its own path."""
    outs = rowwise_quantized_matmuls(x, [(wq, scales, biases)], group_size, bits)
    return None if outs is None else outs[0]


def rowwise_quantized_matmuls(x: mx.array, parts: list[tuple[mx.array, mx.array, mx.array | None]],
                              group_size: int = 64, bits: int = 4) -> list[mx.array] | None:
    """`[x @ dequantize(wq).T for (wq, scales, biases) in parts]` (one group size and width), each
    row as `rowwise_quantized_matmul` computes it, in one launch: products that
    share an input (q, k, v; gate, up) fill the GPU together. Off MLX CUDA, MLX's own calls; None
    where some part's one-row call is not the replayed qmv."""
    k = x.shape[-1]
    rows = x.size // k
    if not on_cuda() or rows == 1:
        return [mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=group_size, bits=bits)
                for wq, s, b in parts]
    arrays = [a for part in parts for a in part]
    key = (x.shape, x.dtype, group_size, bits, *map(id, arrays))
    seen = kept_plan(_calls, key, arrays)
    if seen is None:
        plan = None
        if parts and all(replays_qmv(x, wq, s, b, group_size, bits) for wq, s, b in parts):
            ns = tuple(wq.shape[0] for wq, _, _ in parts)
            plan = (ns, *_octet_launch(rows, ns, x.dtype, bits, group_size))
        seen = keep_plan(_calls, key, arrays, plan)
    if seen[1] is None:
        return None
    ns, kernel, launch = seen[1]
    outs = kernel(inputs=[x.reshape(rows, k), *arrays], **launch)
    return [out.reshape(*x.shape[:-1], n) for out, n in zip(outs, ns)]


# (x's shape and dtype, group size, bits, id of every weight array) -> (weak references to those
# arrays, (features of each weight, the kernel, its launch), or None where the kernel does not take
# them). A verify makes 145 of these calls on the same weights and shapes, each checking up to
# three weights; an entry goes when one of its arrays is freed (its id may come back).
_calls: dict[tuple, tuple] = {}


def octet_geometry(rows: int, ns: tuple[int, ...], bits: int) -> tuple[int, int, int, int]:
    """(features per thread, rows per block, threads per block, blocks along the features) of the
    octet layout for `rows` rows and weights of `ns` features."""
    f, mb = GEOMETRY[bits]
    threads = 16 * (16 if bits == 4 else 8)  # 4 feature groups x (32 E / 8) octets
    return f, min(mb, rows), threads, sum(-(-n // (4 * f)) for n in ns)


_octet_kernels: dict[int, object] = {}
_octet_launches: dict[tuple, tuple] = {}


def _octet_launch(rows: int, ns: tuple[int, ...], dtype: mx.Dtype, bits: int,
                  group_size: int) -> tuple[object, dict]:
    """The octet kernel for len(ns) weights and its launch arguments for one call's shapes (cached:
    a verify makes hundreds of these calls, and the Python time is on the cycle's path)."""
    key = (rows, ns, dtype, bits, group_size)
    if key not in _octet_launches:
        count = len(ns)
        if count not in _octet_kernels:
            names = ["x"] + [f"{a}{i}" for i in range(count) for a in ("w", "scales", "biases")]
            _octet_kernels[count] = mx.fast.cuda_kernel(
                name=f"dflash_rowwise_qmv_octet{count}", input_names=names,
                output_names=[f"out{i}" for i in range(count)], source=_octet_source(count), header=_RQ_HEADER,
                ensure_row_contiguous=True)
        f, mb, threads, blocks = octet_geometry(rows, ns, bits)
        launch = dict(template=[("T", dtype), ("M", rows), ("MB", mb), ("F", f), ("BITS", bits), ("GS", group_size)],
                      grid=(blocks * threads, -(-rows // mb), 1), threadgroup=(threads, 1, 1),
                      output_shapes=[(rows, n) for n in ns], output_dtypes=[dtype] * count)
        _octet_launches[key] = (_octet_kernels[count], launch)
    return _octet_launches[key]
