"""Custom CUDA kernels for the few-token forwards of a cycle (MLX's CUDA backend only).

A DFlash cycle runs forwards of 2-16 tokens (the draft's block, the target's
verify). MLX CUDA runs single-token decoding on fused kernels, but attention
with several queries goes to a fused kernel built anew for every cache length,
or to a few generic matmuls, and the Gated DeltaNet recurrence runs as about a
dozen small kernels per token per layer. These kernels do the same work in one
launch each (measured with `python -m dflash_tui.bench.block_kernels`):

- `block_attention`: L <= 16 queries over a KV cache buffer (causal or not,
  GQA), softmax in float32 with the usual running maximum; long caches are cut
  into key ranges merged by a second launch (`cuda_split_attention`,
  `cuda_allq_attention`), the choice made by `attention_kernel`;
- `gated_delta_steps`: T steps of the gated delta rule in one launch, with the
  recurrent state after every step (what the hybrid rollback keeps).

Each has a pure-MLX reference with the same signature and meaning, which runs
wherever the kernels cannot (and lets the CPU tests check the wiring).
Results equal MLX's own ops up to float32 summation order.
"""

from __future__ import annotations

import os

import mlx.core as mx

from dflash_tui.engine import cuda_allq_attention as allq
from dflash_tui.engine import cuda_split_attention as split
from dflash_tui.engine.cuda_base import _HEADER, _float_bits, _kernel, _kernels, on_cuda  # noqa: F401 (re-exported)
from dflash_tui.engine.cuda_split_attention import (  # noqa: F401
    _ATTENTION_COMBINE_SOURCE,
    _ATTENTION_SPLIT_SOURCE,
)

MAX_ROWS = 16  # queries block_attention takes; longer forwards (prefill) use MLX's own attention

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


# The all-queries kernel (`cuda_allq_attention.allq_attention`: one block per KV head and
# range of ALLQ_CHUNK keys for every query and head, so each key is read once per call, not
# once per query) from ALLQ_FROM_KEYS keys where a KV head has at least ALLQ_MIN_ROWS query
# rows (L x G). Set from `bench.block_kernels --parts attention` on an H200 (docs/gpu-cycle.md):
# the (tensor-core) kernel beat split-K and one block per query from 1024 keys at both head
# widths (4096 keys, 16 queries, D=128: 53 against 179 µs split-K), not below.
ALLQ_FROM_KEYS = 1024
ALLQ_MIN_ROWS = 16
ALLQ_CHUNK = 512
ALLQ_TILE = 32  # keys per shared-memory tile; 16 where 32 does not fit (256-wide heads)


def allq_tile(rows: int, head_dim: int) -> int:
    """Tile the all-queries kernel reads `rows` query rows of `head_dim` with (0: none fits)."""
    for tile in (ALLQ_TILE, 16):
        if allq.allq_fits(rows, head_dim, tile, ALLQ_CHUNK):
            return tile
    return 0


def attention_kernel(keys: int, head_dim: int, L: int, G: int) -> str:
    """Which kernel block_attention runs for L queries of G heads per KV head over `keys` keys:
    "allq" (all queries per key range), "split" (split-K, one block per query and range) or
    "one_block" (one block per KV head and query)."""
    if keys >= ALLQ_FROM_KEYS and L * G >= ALLQ_MIN_ROWS and allq_tile(L * G, head_dim):
        return "allq"
    return "split" if attention_splits(keys, head_dim) > 1 else "one_block"


def block_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool) -> mx.array:
    """q [1, H, L, D] over keys/values [1, Hkv, S, D] (GQA; views of a cache's buffers are read
    in place, their rows must be contiguous); with `causal`, the L queries are the last L
    of the S keys. -> [1, H, L, D]."""
    _, H, L, D = q.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    kind = attention_kernel(S, D, L, H // Hkv)
    if kind == "allq":
        tile = allq_tile(L * H // Hkv, D)
        if not on_cuda():
            return _allq_attention_reference(q, keys, values, scale, causal, ALLQ_CHUNK, tile)
        return allq.allq_attention(q, keys, values, scale, causal, ALLQ_CHUNK, tile)
    if kind == "split":
        splits = attention_splits(S, D)
        if not on_cuda():
            return _split_attention_reference(q, keys, values, scale, causal, splits)
        return split.split_attention(q, keys, values, scale, causal, splits, SPLIT_CHUNK, SPLIT_WARPS)
    if not on_cuda():
        return _attention_reference(q, keys, values, scale, causal)
    return _one_block_attention(q, keys, values, scale, causal)


def _one_block_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool) -> mx.array:
    _, H, L, D = q.shape
    Hkv = keys.shape[1]
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
    """The split kernels' arithmetic in MLX ops, with SPLIT_CHUNK keys a range."""
    return split.split_attention_reference(q, k, v, scale, causal, splits, SPLIT_CHUNK)


_allq_attention_reference = allq.allq_attention_reference
