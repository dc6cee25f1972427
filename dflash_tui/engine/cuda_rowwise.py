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
- thread c of a gemv warp is one chain of sums; here the 32 chains of a feature are spread over
  4 warps (8 chains a warp, 4 feature groups of F features each), so the lanes that read one
  input value from shared memory are a broadcast and each input value serves F features;
- the weights and the block's MB input rows go to shared memory by cp.async, one step (32*NPT
  columns) a tile, four tiles in flight; each thread converts its own copies of the inputs to
  float, and reads its weights from shared memory, each serving MB rows;
- the chains are added in gemv's butterfly: offsets 16 and 8 across warps through shared
  memory, then 4, 2, 1 inside a warp by a transposing butterfly (a lane keeps half of its sums
  and adds its partner's copy of them: the same two operands at every node, fewer shuffles).

`rowwise_matmuls(x, ws)` computes several products of one input in one launch (a verify's q, k, v
and gate, up), each block exactly as in the one-weight kernel. How a launch spreads the work
(`geometry`) changes its speed, never its bits; `python -m dflash_tui.bench.rowwise` checks the
rows and times it. Off CUDA (and where the kernel does not apply) the result is MLX's own `x @ w.T`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from dflash_tui.engine.cuda_base import keep_plan, kept_plan
from dflash_tui.engine.cuda_kernels import _HEADER, on_cuda

MAX_ROWS = 16

# Helpers of the row-wise kernel (after cuda_kernels' _HEADER).
_ROWWISE_HEADER = """
template <typename T, int N>
struct alignas(sizeof(T) * N) dflash_vec { T v[N]; };

__device__ __forceinline__ void dflash_cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void dflash_cp_async_commit() { asm volatile("cp.async.commit_group;\\n" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void dflash_cp_async_wait_pending() { asm volatile("cp.async.wait_group %0;\\n" :: "n"(N) : "memory"); }

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

# Template constants: T, M (rows), NPT (MLX gemv's n_per_thread for K), F (features per thread:
# 1, 2 or 4), FS (feature sets per block; a block is 4 * FS warps), S (steps per tile), NST (tiles
# in flight: a ring of NST shared-memory stages filled by cp.async), MB (rows per block; the
# grid's y splits the M rows in blocks of MB). The prologue before it names N, K, bx (the block's
# feature block), w and out.
_ROWWISE_BODY = """
  constexpr int STEP = 32 * NPT;               // columns per step of one gemv warp
  constexpr int TK = STEP * S;                 // columns per tile
  constexpr int XV = 16 / sizeof(T);           // elements per 16-byte copy
  constexpr int NTH = 128 * FS;                // threads per block
  constexpr int FB = 4 * F * FS;               // features per block
  constexpr int WP = TK + (64 / F) / sizeof(T);  // weight row pitch: the 4 feature groups of a warp on different banks
  constexpr int WC = FB * TK / XV, XC = MB * TK / XV;  // 16-byte copies of a tile's weights and x
  constexpr int WPER = (WC + NTH - 1) / NTH, XPER = (XC + NTH - 1) / NTH;
  constexpr int V = F * MB;                    // sums per thread
  constexpr int P = V <= 1 ? 1 : V <= 2 ? 2 : V <= 4 ? 4 : V <= 8 ? 8 : V <= 16 ? 16 : V <= 32 ? 32 : V <= 64 ? 64 : 128;
  static_assert((F == 1 || F == 2 || F == 4) && NST >= 2 && V <= 128, "rowwise geometry");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // A gemv warp's 32 lanes are 32 independent chains: chain c here is gemv's lane c. Warp w holds
  // chains 8*(w%4) .. +7 for 4 groups of F features (lane / 8), so the lanes that read one x value
  // from shared memory are a broadcast, and the 4 warps of a feature set hold all 32 chains.
  const int g = warp & 3, fset = warp >> 2;
  const int c = 8 * g + (lane & 7);
  const int frow = (fset * 4 + (lane >> 3)) * F;          // the thread's first feature in the block
  const int fb0 = bx * FB, f0 = fb0 + frow;
  const int m0 = blockIdx.y * MB;
  const T* xb = x + (size_t)m0 * K;
  auto xrow = [&](int m) { return min(m0 + m, M - 1) - m0; };  // rows past M repeat the last (not written)
  const int NS = (K + STEP - 1) / STEP;
  float acc[P];
#pragma unroll
  for (int i = 0; i < P; i++) acc[i] = 0.f;

  extern __shared__ __align__(16) float dflash_smem[];
  const uintptr_t wp = reinterpret_cast<uintptr_t>(w), xp = reinterpret_cast<uintptr_t>(x);
  // MLX's one-row gemv reads NPT values a lane where K allows and both pointers are aligned to NPT
  // elements (a decode step's input is a fresh array: aligned).
  const int npt_mlx = (K % 128 == 0 && wp % (4 * sizeof(T)) == 0) ? 4 : (K % 64 == 0 && wp % (2 * sizeof(T)) == 0) ? 2 : 1;
  if (npt_mlx != NPT || xp % (NPT * sizeof(T)) != 0) {
    // A weight view at an odd offset (MLX's gemv then reads fewer values a lane), or an input
    // view this kernel cannot read a step at a time: replay that order plainly (slow, rare).
    for (int col = npt_mlx * c; col < K; col += 32 * npt_mlx)
      for (int j = 0; j < npt_mlx; j++) {
#pragma unroll
        for (int m = 0; m < MB; m++) {
          const float xv = dflash_f(xb[(size_t)xrow(m) * K + col + j]);
#pragma unroll
          for (int r = 0; r < F; r++)
            acc[r * MB + m] = fmaf(dflash_f(w[(size_t)min(f0 + r, N - 1) * K + col + j]), xv, acc[r * MB + m]);
        }
      }
  } else {
    T* wraw = reinterpret_cast<T*>(dflash_smem);             // [NST][FB][WP]
    T* xraw = wraw + NST * FB * WP;                          // [NST][MB][TK]
    float* xf = reinterpret_cast<float*>(xraw + NST * MB * TK);  // [2][MB][TK] float
    const bool w_vec = K % XV == 0 && wp % 16 == 0;
    const bool x_vec = K % XV == 0 && xp % 16 == 0;
    const int NT = (NS + S - 1) / S;

    // Tile t into stage t % NST: 16-byte cp.async copies (plain loads where a row is not aligned).
    auto issue = [&](int t) {
      if (t < NT) {
        T* ws = wraw + (t % NST) * FB * WP;
        T* xs = xraw + (t % NST) * MB * TK;
#pragma unroll
        for (int p = 0; p < WPER; p++) {
          const int v = threadIdx.x + p * NTH;
          if (WC % NTH == 0 || v < WC) {
            const int row = v / (TK / XV), cc = (v % (TK / XV)) * XV, col = t * TK + cc;
            const T* src = w + (size_t)min(fb0 + row, N - 1) * K + col;
            if (w_vec) {
              if (col < K) dflash_cp_async16(ws + row * WP + cc, src);
            } else {
#pragma unroll
              for (int e = 0; e < XV; e++) ws[row * WP + cc + e] = col + e < K ? src[e] : T(0.f);
            }
          }
        }
        if (x_vec) {
#pragma unroll
          for (int p = 0; p < XPER; p++) {
            const int v = threadIdx.x + p * NTH;
            if (XC % NTH == 0 || v < XC) {
              const int m = v / (TK / XV), cc = (v % (TK / XV)) * XV, col = t * TK + cc;
              if (col < K) dflash_cp_async16(xs + m * TK + cc, xb + (size_t)xrow(m) * K + col);
            }
          }
        }
      }
      dflash_cp_async_commit();  // one group per tile, empty past the end, so the counting stays uniform
    };
    // This thread's own x copies of tile t, as float (the cp.async wait covers only its own copies).
    auto convert = [&](int t) {
      const T* xs = xraw + (t % NST) * MB * TK;
      float* dst = xf + (t & 1) * MB * TK;
#pragma unroll
      for (int p = 0; p < XPER; p++) {
        const int v = threadIdx.x + p * NTH;
        if (XC % NTH == 0 || v < XC) {
          const int m = v / (TK / XV), cc = (v % (TK / XV)) * XV, col = t * TK + cc;
          float f[XV];
          if (x_vec && col < K) {
            const dflash_vec<T, XV> h = *reinterpret_cast<const dflash_vec<T, XV>*>(xs + m * TK + cc);
#pragma unroll
            for (int e = 0; e < XV; e++) f[e] = dflash_f(h.v[e]);
          } else {
#pragma unroll
            for (int e = 0; e < XV; e++) f[e] = col + e < K ? dflash_f(xb[(size_t)xrow(m) * K + col + e]) : 0.f;
          }
#pragma unroll
          for (int e = 0; e < XV; e += 4)
            *reinterpret_cast<float4*>(dst + m * TK + cc + e) = make_float4(f[e], f[e + 1], f[e + 2], f[e + 3]);
        }
      }
    };

#pragma unroll
    for (int s = 0; s < NST - 1; s++) issue(s);
    dflash_cp_async_wait_pending<NST - 2>();
    convert(0);
    __syncthreads();
    for (int t = 0; t < NT; t++) {
      issue(t + NST - 1);  // into the stage of tile t - 1, which every thread is done with
      const T* wt = wraw + (t % NST) * FB * WP + frow * WP + NPT * c;
      const float* xt = xf + (t & 1) * MB * TK + NPT * c;
#pragma unroll
      for (int s = 0; s < S; s++) {
        const int gs = t * S + s;
        if (gs < NS) {
          const bool live = NPT > 1 || gs * STEP + c < K;  // only NPT 1 has a partial last step
          float wf[F][NPT];
#pragma unroll
          for (int r = 0; r < F; r++) {
            const dflash_vec<T, NPT> h = *reinterpret_cast<const dflash_vec<T, NPT>*>(wt + r * WP + s * STEP);
#pragma unroll
            for (int j = 0; j < NPT; j++) wf[r][j] = live ? dflash_f(h.v[j]) : 0.f;
          }
#pragma unroll
          for (int m = 0; m < MB; m++) {
            const dflash_vec<float, NPT> xv = *reinterpret_cast<const dflash_vec<float, NPT>*>(xt + m * TK + s * STEP);
#pragma unroll
            for (int j = 0; j < NPT; j++)
#pragma unroll
              for (int r = 0; r < F; r++) acc[r * MB + m] = fmaf(wf[r][j], xv.v[j], acc[r * MB + m]);
          }
        }
      }
      if (t + 1 < NT) {
        dflash_cp_async_wait_pending<NST - 2>();  // this thread's copies of tile t + 1 have landed
        convert(t + 1);
      }
      __syncthreads();
    }
  }

  // gemv's butterfly over the 32 chains: offsets 16 and 8 pair chains of different warps (through
  // shared memory), 4, 2, 1 lanes of one warp. Each node adds the same two partial sums.
  float* red = dflash_smem;                    // [3][V][FS * 32]
  const int slot = fset * 32 + lane;
  if (g != 0) {
#pragma unroll
    for (int i = 0; i < V; i++) red[((g - 1) * V + i) * (FS * 32) + slot] = acc[i];
  }
  __syncthreads();
  if (g == 0) {
#pragma unroll
    for (int i = 0; i < V; i++) {
      const float c8 = red[i * (FS * 32) + slot];              // chain + 8
      const float c16 = red[(V + i) * (FS * 32) + slot];       // chain + 16
      const float c24 = red[(2 * V + i) * (FS * 32) + slot];   // chain + 24
      acc[i] = (acc[i] + c16) + (c8 + c24);
    }
    int base = 0;
    dflash_fold<P, P, 4>(acc, lane, base);
    constexpr int CF = P >= 8 ? P / 8 : 1;           // sums this lane holds
    constexpr int SPARE = P >= 8 ? 0 : 8 / P - 1;    // lane bits the fold did not split on
    if ((lane & SPARE) == 0) {
#pragma unroll
      for (int j = 0; j < CF; j++) {
        const int idx = base + j, r = idx / MB, m = m0 + idx % MB;
        if (idx < V && m < M && f0 + r < N) out[(size_t)m * N + f0 + r] = T(acc[j]);
      }
    }
  }
"""

def _source(count: int) -> str:
    """The kernel for inputs x, w0 .. w{count-1} (one K) and outputs out0 ..: the grid's blocks go to
    w0's features first, then w1's, and so on; each block computes what it would for its weight alone."""
    lines = ["  const int K = w0_shape[1];", "  int bx = blockIdx.x, N = w0_shape[0];",
             "  const T* w = w0;", "  T* out = out0;", "  constexpr int FBW = 4 * F * FS;"]
    for i in range(1, count):
        lines.append(f"  if (bx >= (N + FBW - 1) / FBW) {{ bx -= (N + FBW - 1) / FBW; N = w{i}_shape[0]; w = w{i}; out = out{i}; }}")
    return "\n".join(lines) + "\n" + _ROWWISE_BODY


@dataclass(frozen=True)
class Geometry:
    """How the kernel spreads the work; every geometry computes the same bits."""

    features: int  # F: output features per thread (1, 2 or 4)
    feature_sets: int  # FS: a block is 4 * FS warps and computes 4 * F * FS features
    rows: int  # MB: input rows per block (the grid's y splits the M rows)

    def features_per_block(self) -> int:
        return 4 * self.features * self.feature_sets

    def name(self) -> str:
        return f"f{self.features}fs{self.feature_sets}mb{self.rows}"


# One tile is one step (32*NPT columns); four tiles are in flight. Measured beside them (H100, the
# chain of a Qwen3-4B verify's matmuls, docs/batch-invariance.md): two-step tiles with three in
# flight 8.8 ms, six one-step tiles in flight 8.7 ms, against 8.05 ms.
STEPS, STAGES = 1, 4
# Each kernel's own device time (Nsight Compute, H100, the products of a Qwen3-4B verify,
# docs/batch-invariance.md): two feature sets a block (32 features, so each input tile a block
# copies serves twice the features) are 11-13% under one on o, gate/up and down and 7% on the
# head, though they make half the blocks; the launch of three weights (q, k, v) is the exception,
# 26.9 us with one feature set against 30.2 with two. Also measured on q/k/v, o and gate/up, and
# slower there than these: MB 8 and 4, F 2 and 1.
THREE_WEIGHTS = Geometry(4, 1, 16)
FEWER_WEIGHTS = Geometry(4, 2, 16)


def geometry(weights: int) -> Geometry:
    """The geometry of a launch that computes `weights` products of one input."""
    return THREE_WEIGHTS if weights >= 3 else FEWER_WEIGHTS


def n_per_thread(k: int) -> int:
    """MLX gemv's n_per_thread for K (aligned pointers)."""
    return 4 if k % 128 == 0 else 2 if k % 64 == 0 else 1


def block_rows(m: int, geo: Geometry) -> int:
    """Input rows per block for M rows: the geometry's, or M where that is fewer."""
    return min(geo.rows, m)


def shared_bytes(m: int, k: int, itemsize: int, geo: Geometry) -> int:
    """Dynamic shared memory: the ring of weight and input tiles and two float input tiles, or
    the cross-warp reduction, whichever is larger."""
    tk = 32 * n_per_thread(k) * STEPS
    mb = block_rows(m, geo)
    pitch = tk + (64 // geo.features) // itemsize
    ring = STAGES * (geo.features_per_block() * pitch + mb * tk) * itemsize + 2 * mb * tk * 4
    return max(ring, 3 * geo.features * mb * geo.feature_sets * 32 * 4)


_DTYPES = (mx.bfloat16, mx.float16, mx.float32)


def applies(x: mx.array, ws: list[mx.array]) -> bool:
    """Whether the kernel computes these products (else rowwise_matmuls gives MLX's own x @ w.T)."""
    rows = x.size // x.shape[-1] if x.ndim else 0
    dtype = x.dtype
    return (1 < rows <= MAX_ROWS and dtype in _DTYPES and all(w.dtype == dtype for w in ws)
            and on_cuda())


_kernels: dict[tuple[str, int, int], object] = {}


def _kernel(name: str, smem: int, weights: int):
    key = (name, smem, weights)
    if key not in _kernels:
        _kernels[key] = mx.fast.cuda_kernel(name=f"dflash_rowwise{weights}_{name}",
                                            input_names=["x"] + [f"w{i}" for i in range(weights)],
                                            output_names=[f"out{i}" for i in range(weights)], source=_source(weights),
                                            header=_HEADER + _ROWWISE_HEADER,
                                            ensure_row_contiguous=True, shared_memory=smem)
    return _kernels[key]


def rowwise_matmul(x: mx.array, w: mx.array) -> mx.array:
    """`x @ w.T` for x [..., K] and w [N, K], each of x's 2..16 rows computed as MLX CUDA
    computes a one-row product (its gemv), bit for bit. `w` must be row-contiguous (as loaded
    weights are): that is the layout for which MLX's one-row product is a gemv."""
    return rowwise_matmuls(x, [w])[0]


def rowwise_matmuls(x: mx.array, ws: list[mx.array]) -> list[mx.array]:
    """`[x @ w.T for w in ws]` as `rowwise_matmul` computes each, in one launch: products that share
    an input (q, k, v; gate, up) fill the GPU together where each alone would leave it idle."""
    key = (x.shape, x.dtype, on_cuda(), *map(id, ws))
    seen = kept_plan(_calls, key, ws)
    if seen is None:
        for w in ws:
            if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
                raise ValueError(f"rowwise_matmul: x {tuple(x.shape)} and w {tuple(w.shape)} are not [..., K] and [N, K]")
        if not ws or not applies(x, ws):
            return [x @ w.T for w in ws]
        k = x.shape[-1]
        ns = tuple(w.shape[0] for w in ws)
        seen = keep_plan(_calls, key, ws, (x.size // k, k, ns, *_launch(x.size // k, k, ns, x.dtype)))
    m, k, ns, kernel, launch = seen[1]
    outs = kernel(inputs=[x.reshape(m, k), *ws], **launch)
    return [out.reshape(*x.shape[:-1], n) for out, n in zip(outs, ns)]


# (x's shape and dtype, whether on CUDA, id of each weight) -> (weak references to the weights,
# (rows, K, features of each, the kernel, its launch)). A verify makes 145 of these calls on the same
# weights and shapes, and their checks cost a few us of Python each, on the cycle's path; an
# entry goes when one of its weights is freed (its id may come back for another array).
_calls: dict[tuple, tuple] = {}


_launches: dict[tuple, tuple] = {}


def _launch(m: int, k: int, ns: tuple[int, ...], dtype: mx.Dtype) -> tuple[object, dict]:
    """The kernel and its launch arguments for one call's shapes (cached: a verify makes
    hundreds of these calls, and the Python time is on the cycle's path)."""
    key = (m, k, ns, dtype)
    if key not in _launches:
        _launches[key] = _launch_arguments(m, k, ns, dtype)
    return _launches[key]


def _launch_arguments(m: int, k: int, ns: tuple[int, ...], dtype: mx.Dtype) -> tuple[object, dict]:
    """(the kernel where MLX runs on CUDA, else None; its launch arguments)."""
    v = geometry(len(ns))
    mb = block_rows(m, v)
    threads = 128 * v.feature_sets
    blocks = sum(-(-n // v.features_per_block()) for n in ns)
    launch = dict(
        template=[("T", dtype), ("M", m), ("NPT", n_per_thread(k)), ("F", v.features), ("FS", v.feature_sets),
                  ("S", STEPS), ("NST", STAGES), ("MB", mb)],
        grid=(blocks * threads, -(-m // mb), 1), threadgroup=(threads, 1, 1),
        output_shapes=[(m, n) for n in ns], output_dtypes=[dtype] * len(ns))
    return (_kernel(v.name(), shared_bytes(m, k, dtype.size, v), len(ns)) if on_cuda() else None), launch
