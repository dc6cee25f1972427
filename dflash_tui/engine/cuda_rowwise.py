"""A batch-invariant few-row matmul for MLX CUDA: `x[M, K] @ w[N, K].T`, 2 <= M <= 16, whose
every output row equals, bit for bit, MLX's own one-row product `x[i:i+1] @ w.T`.

MLX CUDA sends a one-row product (no bias, `w` row-contiguous so that `w.T` is a transposed
operand) to its gemv kernel (mlx/backend/cuda/gemms/gemv.cu and matmul.cpp at commit
846d17622, `can_use_gemv`: M == 1 and b transposed; an `addmm` with a bias goes to cuBLAS
instead). `gemv_impl` gives each output feature one warp; lane l reads `n_per_thread` (NPT)
consecutive values at columns NPT*l + 32*NPT*i, i = 0, 1, ..., and accumulates them into one
float with a fused multiply-add per element (for bf16/fp16 the product is exact in float, so
multiply-then-add and FMA agree); NPT is 4 if K % 128 == 0, else 2 if K % 64 == 0, else 1
(and smaller where the pointers are not aligned to NPT elements). The 32 lane sums are then
added by cooperative_groups' reduce: a butterfly with offsets 16, 8, 4, 2, 1
(`coalesced_reduce`), and the float is rounded to the output type.

The kernel below keeps exactly that per-(row, feature) order and makes M rows cheap:
- the M input rows are staged in shared memory as float, one tile of S steps (32*NPT*S
  columns) at a time, double-buffered (cp.async into a staging copy, converted by the
  thread that fetched it), so a tile boundary never splits a lane's sequence;
- each warp computes R output features for MG = ceil(M / G) rows (G warps share the features
  and split the rows), so each weight value loaded serves MG rows and each input value R
  features; the weights of the next tile are loaded while this one is computed;
- the R*MG lane sums are reduced by a transposing butterfly: at offset o a lane keeps half
  of its sums and adds its partner's copy of them, which is the butterfly's own tree (the
  same two operands at every node) with ~10x fewer shuffles.

`variant` names (R, G, warps per block, S); `python -m dflash_tui.bench.rowwise` measures
them. Off CUDA (and where the kernel does not apply) the result is MLX's own `x @ w.T`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from dflash_tui.engine.cuda_kernels import _HEADER, on_cuda

MAX_ROWS = 16

# Helpers of the row-wise kernel (after cuda_kernels' _HEADER).
_ROWWISE_HEADER = """
template <typename T, int N>
struct alignas(sizeof(T) * N) dflash_vec { T v[N]; };

// One N-element vector load through the read-only path (8, 4 or 2 bytes, or 16 for float x4).
template <int N, typename T>
__device__ __forceinline__ dflash_vec<T, N> dflash_ldg(const T* p) {
  dflash_vec<T, N> out;
  constexpr int B = sizeof(T) * N;
  if constexpr (B == 16) *reinterpret_cast<uint4*>(&out) = __ldg(reinterpret_cast<const uint4*>(p));
  else if constexpr (B == 8) *reinterpret_cast<uint2*>(&out) = __ldg(reinterpret_cast<const uint2*>(p));
  else if constexpr (B == 4) *reinterpret_cast<unsigned*>(&out) = __ldg(reinterpret_cast<const unsigned*>(p));
  else *reinterpret_cast<unsigned short*>(&out) = __ldg(reinterpret_cast<const unsigned short*>(p));
  return out;
}

__device__ __forceinline__ void dflash_cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void dflash_cp_async_wait() {
  asm volatile("cp.async.commit_group;\\ncp.async.wait_group 0;\\n" ::: "memory");
}

// The butterfly sum over a warp (offsets 16, 8, 4, 2, 1: cooperative_groups' reduce) of P
// values per lane at once. At offset O a lane keeps C/2 of its C values (the upper half where
// its bit O is set) and adds its partner's copies of them: each node adds the same two
// partial sums as the plain butterfly. Afterwards the lane holds values base .. base + C - 1.
template <int P, int C, int O>
__device__ __forceinline__ void dflash_fold(float (&v)[P], int lane, int& base) {
  if constexpr (O > 0) {
    if constexpr (C > 1) {
      constexpr int H = C / 2;
      const bool up = (lane & O) != 0;
#pragma unroll
      for (int i = 0; i < H; i++) {
        const float send = up ? v[i] : v[i + H];
        const float keep = up ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      if (up) base += H;
      dflash_fold<P, H, O / 2>(v, lane, base);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      dflash_fold<P, 1, O / 2>(v, lane, base);
    }
  }
}
"""

# Template constants: T, M (rows), NPT (MLX gemv's n_per_thread for K), R (features per warp),
# G (warps sharing the features, splitting the rows), W (warps per block), S (steps per tile).
_ROWWISE_SOURCE = """
  constexpr int MG = (M + G - 1) / G;          // rows per warp
  constexpr int FG = W / G;                    // feature groups per block
  constexpr int STEP = 32 * NPT;               // columns per step of a warp
  constexpr int TK = STEP * S;                 // columns per tile
  constexpr int XV = 16 / sizeof(T);           // x elements per 16-byte copy
  constexpr int TV = M * TK / XV;              // 16-byte copies per tile
  constexpr int PER = (TV + 32 * W - 1) / (32 * W);
  constexpr int V = R * MG;                    // sums per lane
  constexpr int P = V <= 1 ? 1 : V <= 2 ? 2 : V <= 4 ? 4 : V <= 8 ? 8 : V <= 16 ? 16 : V <= 32 ? 32 : V <= 64 ? 64 : 128;
  static_assert(W % G == 0 && V <= 128, "rowwise variant");
  const int N = w_shape[0], K = w_shape[1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f0 = (blockIdx.x * FG + warp / G) * R;
  const int m0 = (warp % G) * MG;
  const int NS = (K + STEP - 1) / STEP;
  float acc[P];
#pragma unroll
  for (int i = 0; i < P; i++) acc[i] = 0.f;
  const T* wrow = w + (size_t)min(f0, N - 1) * K;
  int roff[R];  // feature r's row, past N clamped to the last
#pragma unroll
  for (int r = 0; r < R; r++) roff[r] = (min(f0 + r, N - 1) - min(f0, N - 1)) * K;

  // MLX's own n_per_thread for this weight pointer (x of a decode step is a fresh, aligned array)
  const uintptr_t wp = reinterpret_cast<uintptr_t>(w);
  const int npt_mlx = (K % 128 == 0 && wp % (4 * sizeof(T)) == 0) ? 4 : (K % 64 == 0 && wp % (2 * sizeof(T)) == 0) ? 2 : 1;
  if (npt_mlx != NPT) {
    // A weight view at an odd offset: MLX's gemv then reads fewer values per lane. Replay that
    // order plainly (slow, rare; no shared memory).
    for (int col = npt_mlx * lane; col < K; col += 32 * npt_mlx)
      for (int j = 0; j < npt_mlx; j++) {
        float wv[R];
#pragma unroll
        for (int r = 0; r < R; r++) wv[r] = dflash_f(wrow[roff[r] + col + j]);
#pragma unroll
        for (int mm = 0; mm < MG; mm++) {
          const int m = m0 + mm;
          if (M % G == 0 || m < M) {
            const float xv = dflash_f(x[(size_t)m * K + col + j]);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r * MG + mm] = fmaf(wv[r], xv, acc[r * MG + mm]);
          }
        }
      }
  } else {
    extern __shared__ __align__(16) float dflash_smem[];
    float* xs = dflash_smem;                                         // [2][M][TK] float
    T* stage = reinterpret_cast<T*>(dflash_smem + 2 * M * TK);       // [M][TK] raw copy of the next tile
    const bool x_vec = K % XV == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int NT = (NS + S - 1) / S;

    // Tile t of x: 16-byte cp.async copies into `stage` (or plain loads where x is not aligned),
    // then each thread converts the copies it made into the float buffer.
    auto fetch = [&](int t) {
      if (!x_vec) return;
#pragma unroll
      for (int p = 0; p < PER; p++) {
        const int v = threadIdx.x + p * 32 * W;
        if (TV % (32 * W) == 0 || v < TV) {
          const int m = v / (TK / XV), c = (v % (TK / XV)) * XV, col = t * TK + c;
          if (col < K) dflash_cp_async16(stage + m * TK + c, x + (size_t)m * K + col);
        }
      }
    };
    auto convert = [&](int t, float* dst) {
      if (x_vec) dflash_cp_async_wait();
#pragma unroll
      for (int p = 0; p < PER; p++) {
        const int v = threadIdx.x + p * 32 * W;
        if (TV % (32 * W) == 0 || v < TV) {
          const int m = v / (TK / XV), c = (v % (TK / XV)) * XV, col = t * TK + c;
          float f[XV];
          if (x_vec && col < K) {
            const dflash_vec<T, XV> h = *reinterpret_cast<const dflash_vec<T, XV>*>(stage + m * TK + c);
#pragma unroll
            for (int e = 0; e < XV; e++) f[e] = dflash_f(h.v[e]);
          } else {
#pragma unroll
            for (int e = 0; e < XV; e++) f[e] = col + e < K ? dflash_f(x[(size_t)m * K + col + e]) : 0.f;
          }
#pragma unroll
          for (int e = 0; e < XV; e += 4)
            *reinterpret_cast<float4*>(dst + m * TK + c + e) = make_float4(f[e], f[e + 1], f[e + 2], f[e + 3]);
        }
      }
    };

    dflash_vec<T, NPT> wb[S][R];  // the weights of one tile, loaded a tile ahead
    auto load_w = [&](int gs, dflash_vec<T, NPT> (&slot)[R]) {
      const int col = gs * STEP + NPT * lane;
      if (gs < NS && (NPT > 1 || col < K)) {
#pragma unroll
        for (int r = 0; r < R; r++) slot[r] = dflash_ldg<NPT>(wrow + roff[r] + col);
      }
    };

    fetch(0);
#pragma unroll
    for (int s = 0; s < S; s++) load_w(s, wb[s]);
    convert(0, xs);
    __syncthreads();
    for (int t = 0; t < NT; t++) {
      const float* xt = xs + (t & 1) * M * TK + NPT * lane;
      if (t + 1 < NT) fetch(t + 1);
#pragma unroll
      for (int s = 0; s < S; s++) {
        const int gs = t * S + s;
        if (gs < NS) {
          const bool live = NPT > 1 || gs * STEP + lane < K;  // only NPT 1 has a partial last step
          dflash_vec<float, NPT> xv[MG];
#pragma unroll
          for (int mm = 0; mm < MG; mm++)
            if (M % G == 0 || m0 + mm < M) xv[mm] = *reinterpret_cast<const dflash_vec<float, NPT>*>(xt + (m0 + mm) * TK + s * STEP);
#pragma unroll
          for (int j = 0; j < NPT; j++) {
            float wf[R];
#pragma unroll
            for (int r = 0; r < R; r++) wf[r] = dflash_f(wb[s][r].v[j]);
#pragma unroll
            for (int mm = 0; mm < MG; mm++)
              if ((M % G == 0 || m0 + mm < M) && live)
#pragma unroll
                for (int r = 0; r < R; r++) acc[r * MG + mm] = fmaf(wf[r], xv[mm].v[j], acc[r * MG + mm]);
          }
          load_w(gs + S, wb[s]);
        }
      }
      if (t + 1 < NT) convert(t + 1, xs + ((t + 1) & 1) * M * TK);
      __syncthreads();
    }
  }

  int base = 0;
  dflash_fold<P, P, 16>(acc, lane, base);
  constexpr int CF = P >= 32 ? P / 32 : 1;           // sums this lane holds
  constexpr int SPARE = P >= 32 ? 0 : 32 / P - 1;    // lane bits the fold did not split on
  if ((lane & SPARE) == 0) {
#pragma unroll
    for (int j = 0; j < CF; j++) {
      const int idx = base + j, r = idx / MG, m = m0 + idx % MG;
      if (idx < V && m < M && f0 + r < N) out[(size_t)m * N + f0 + r] = T(acc[j]);
    }
  }
"""


@dataclass(frozen=True)
class Variant:
    """How the kernel spreads the work; every variant computes the same bits."""

    features: int  # R: output features per warp
    row_groups: int  # G: warps that share R features, each taking ceil(M / G) rows
    warps: int  # warps per block (a multiple of row_groups)
    steps: int  # S: steps of 32*NPT columns per shared-memory tile (and weight prefetch distance)


# Shared memory serves 128 bytes a clock per SM, as many as its 128 float lanes' FMAs: an input
# value (4 bytes) serves R FMAs and a weight value (2 bytes, through L1) ceil(M/G) of them, so
# R >= 4 is needed to keep the FMA lanes busy; R*ceil(M/G) sums per lane cost registers. Each
# block stages all M input rows from L2: M / (R*W/G) of its weight bytes again. W <= 8 keeps
# any register count (at most 255) launchable.
# The chain of a Qwen3-4B verify's matmuls on the H200 (bench/rowwise; docs/batch-invariance.md),
# ms in bf16 / fp16: r8g2w4s2 12.0 / 11.7, r8g2w8s2 12.0 / 12.1, r4w4s2 13.5 / 9.2; MLX's gemm
# 6.9 / 6.2. Five others measured 12.9-24.4 / 10.9-18.1 were deleted.
VARIANTS: dict[str, Variant] = {
    "r4w4s2": Variant(4, 1, 4, 2),
    "r8g2w8s2": Variant(8, 2, 8, 2),
    "r8g2w4s2": Variant(8, 2, 4, 2),
}
DEFAULT_VARIANT = "r8g2w4s2"  # the bf16 chain's fastest


def n_per_thread(k: int) -> int:
    """MLX gemv's n_per_thread for K (aligned pointers)."""
    return 4 if k % 128 == 0 else 2 if k % 64 == 0 else 1


def shared_bytes(m: int, k: int, itemsize: int, variant: Variant) -> int:
    """Dynamic shared memory: two float tiles of M rows and one raw staging copy."""
    tk = 32 * n_per_thread(k) * variant.steps
    return m * tk * (8 + itemsize)


def applies(x: mx.array, w: mx.array) -> bool:
    """Whether the kernel computes this product (else rowwise_matmul gives MLX's own x @ w.T)."""
    rows = x.size // x.shape[-1] if x.ndim else 0
    return (on_cuda() and 1 < rows <= MAX_ROWS and x.dtype == w.dtype
            and x.dtype in (mx.bfloat16, mx.float16, mx.float32))


_kernels: dict[tuple[str, int], object] = {}


def _kernel(name: str, smem: int):
    key = (name, smem)
    if key not in _kernels:
        _kernels[key] = mx.fast.cuda_kernel(name=f"dflash_rowwise_{name}", input_names=["x", "w"], output_names=["out"],
                                            source=_ROWWISE_SOURCE, header=_HEADER + _ROWWISE_HEADER,
                                            ensure_row_contiguous=True, shared_memory=smem)
    return _kernels[key]


def rowwise_matmul(x: mx.array, w: mx.array, variant: str | None = None) -> mx.array:
    """`x @ w.T` for x [..., K] and w [N, K], each of x's 2..16 rows computed as MLX CUDA
    computes a one-row product (its gemv), bit for bit. `w` must be row-contiguous (as loaded
    weights are): that is the layout for which MLX's one-row product is a gemv."""
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"rowwise_matmul: x {tuple(x.shape)} and w {tuple(w.shape)} are not [..., K] and [N, K]")
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"rowwise_matmul: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    if not applies(x, w):
        return x @ w.T
    n, k = w.shape
    m = x.size // k
    name = variant or DEFAULT_VARIANT
    v = VARIANTS[name]
    fg = v.warps // v.row_groups
    smem = shared_bytes(m, k, x.dtype.size, v)
    out = _kernel(name, smem)(
        inputs=[x.reshape(m, k), w],
        template=[("T", x.dtype), ("M", m), ("NPT", n_per_thread(k)), ("R", v.features), ("G", v.row_groups),
                  ("W", v.warps), ("S", v.steps)],
        grid=(-(-n // (fg * v.features)) * 32 * v.warps, 1, 1), threadgroup=(32 * v.warps, 1, 1),
        output_shapes=[(m, n)], output_dtypes=[x.dtype])[0]
    return out.reshape(*x.shape[:-1], n)
