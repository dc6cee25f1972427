"""The Gated DeltaNet verify in one launch on MLX CUDA (`gated_delta_steps`), with the pure-MLX
reference that runs wherever the kernel cannot; see cuda_kernels.py for the why."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from dflash_tui.engine.cuda_kernels import _kernel, on_cuda

# One warp per (batch, value head, value row): the row of the state lives in the lanes'
# registers for all T steps; after every step it is written out (the rollback's record).
_GATED_DELTA_SOURCE = """
  constexpr int PER = DK / 32;
  const int B = q_shape[0], T = q_shape[1], Hk = q_shape[2], Hv = v_shape[2], Dv = v_shape[3];
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= B * Hv * Dv) return;
  const int dv = warp % Dv, hv = (warp / Dv) % Hv, b = warp / (Dv * Hv);
  const int hk = hv / (Hv / Hk);
  const size_t row = (((size_t)b * Hv + hv) * Dv + dv) * DK;
  float s[PER];
#pragma unroll
  for (int i = 0; i < PER; i++) s[i] = state[row + lane + 32 * i];
  for (int t = 0; t < T; t++) {
    const size_t qk = (((size_t)b * T + t) * Hk + hk) * DK;
    const size_t gh = ((size_t)b * T + t) * Hv + hv;
    float kk[PER], qq[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) { kk[i] = dflash_f(k[qk + lane + 32 * i]); qq[i] = dflash_f(q[qk + lane + 32 * i]); }
    const float decay = dflash_f(g[gh]);
    float kv = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) { s[i] *= decay; kv += s[i] * kk[i]; }
    kv = dflash_warp_sum(kv);
    const float delta = (dflash_f(v[gh * Dv + dv]) - kv) * dflash_f(beta[gh]);
    float yv = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) { s[i] += kk[i] * delta; yv += s[i] * qq[i]; }
    yv = dflash_warp_sum(yv);
    if (lane == 0) y[gh * Dv + dv] = YT(yv);
    const size_t out_row = ((((size_t)t * B + b) * Hv + hv) * Dv + dv) * DK;
#pragma unroll
    for (int i = 0; i < PER; i++) states[out_row + lane + 32 * i] = s[i];
  }
"""


def gated_delta_fits(q: mx.array, v: mx.array, g: mx.array, state: Optional[mx.array], mask) -> bool:
    Dk = q.shape[-1]
    return (mask is None and g.ndim == 3 and Dk % 32 == 0 and Dk <= 256 and state is not None
            and state.dtype == mx.float32 and q.ndim == 4 and v.ndim == 4)


def gated_delta_steps(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                      state: mx.array) -> tuple[mx.array, "mx.array | list[mx.array]"]:
    """The gated delta rule over T steps (q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta
    [B, T, Hv]; state [B, Hv, Dv, Dk] float32) -> (y [B, T, Hv, Dv] in q's dtype, as mlx-lm's
    loop gives it, and the states after
    steps 1..T, indexable by step: one [T, B, Hv, Dv, Dk] array from the kernel, so that no
    op per step is built)."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if not on_cuda():
        return _gated_delta_reference(q, k, v, g, beta, state)
    y, states = _kernel("dflash_gated_delta", ["q", "k", "v", "g", "beta", "state"], ["y", "states"],
                        _GATED_DELTA_SOURCE)(
        inputs=[q, k, v, g, beta, state],
        template=[("DK", Dk), ("YT", q.dtype)],
        grid=(B * Hv * Dv * 32, 1, 1),
        threadgroup=(128, 1, 1),
        output_shapes=[(B, T, Hv, Dv), (T, B, Hv, Dv, Dk)],
        output_dtypes=[q.dtype, mx.float32],
    )
    return y, states


def _gated_delta_reference(q, k, v, g, beta, state):
    Hk, Hv, out_dtype = q.shape[2], v.shape[2], q.dtype
    if Hv > Hk:
        q = mx.repeat(q, Hv // Hk, -2)
        k = mx.repeat(k, Hv // Hk, -2)
    ys, states = [], []
    for t in range(q.shape[1]):
        kt, qt = k[:, t].astype(mx.float32), q[:, t].astype(mx.float32)
        state = state * g[:, t, :, None, None].astype(mx.float32)
        kv = (state * kt[..., None, :]).sum(-1)
        delta = (v[:, t].astype(mx.float32) - kv) * beta[:, t, :, None].astype(mx.float32)
        state = state + kt[..., None, :] * delta[..., None]
        ys.append((state * qt[..., None, :]).sum(-1).astype(out_dtype))
        states.append(state)
    return mx.stack(ys, axis=1), states

