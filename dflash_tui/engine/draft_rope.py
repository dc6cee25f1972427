"""The draft's rotary embedding, as the torch reference computes it.

z-lab's torch draft (github.com/z-lab/dflash@07ebd93, dflash/model.py) takes its
RoPE from transformers' `Qwen3RotaryEmbedding`, so a draft trains with
transformers' rope maths (`modeling_rope_utils`, read in transformers 5.25):
the parameters come from `rope_scaling` (legacy) or else `rope_parameters`,
theta from that dict or else the top-level `rope_theta` or else 10000, and
YaRN reads `factor`, `attention_factor`, `mscale`/`mscale_all_dim`, `beta_fast`,
`beta_slow`, `truncate` and `original_max_position_embeddings`. mlx-lm's
`YarnRoPE` differs on `truncate: false`, an explicit `attention_factor` and a
lone `mscale`, so the frequencies are computed here and applied with
`mx.fast.rope(freqs=...)`.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn

DEFAULT_THETA = 10_000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class RopeConfigError(ValueError):
    """A rope setup the draft cannot run as the reference does."""


def standard_rope(cfg: dict[str, Any]) -> tuple[float, Optional[dict[str, Any]]]:
    """(theta, scaling dict or None for plain RoPE) from a draft's config.json, with
    transformers' precedence (`convert_rope_params_to_dict` / `standardize_rope_params`)."""
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta") or DEFAULT_THETA))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        if float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor") or 1.0)) != 1.0:
            raise RopeConfigError("draft rope partial_rotary_factor != 1 is not supported (the reference rotates whole heads)")
        return theta, None
    if kind not in ROPE_TYPES:
        raise RopeConfigError(f"draft rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    params.pop("type", None)
    params.pop("rope_theta", None)
    params["rope_type"] = kind
    if kind in ("llama3", "yarn"):
        # a top-level original_max_position_embeddings wins, else the dict's, else max_position_embeddings
        top = cfg.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = int(
            top or params.get("original_max_position_embeddings") or cfg.get("max_position_embeddings") or 32768
        )
    return theta, params


def _yarn(dims: int, base: float, p: dict[str, Any], max_pos: int) -> tuple[mx.array, float]:
    orig = p["original_max_position_embeddings"]
    factor = p["factor"]  # required; null means max_position_embeddings / original_max_position_embeddings
    factor = float(factor) if factor is not None else max_pos / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dims * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # the share of each frequency left as pretrained
    inv = 1.0 / (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims))
    return inv / factor * (1 - extrapolate) + inv * extrapolate, float(attention_factor)


def _llama3(dims: int, base: float, p: dict[str, Any]) -> mx.array:
    factor, low_f, high_f = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old = p["original_max_position_embeddings"]
    inv = 1.0 / (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims))
    wavelen = 2 * math.pi / inv
    scaled = mx.where(wavelen > old / low_f, inv / factor, inv)
    smooth = (old / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high_f) & (wavelen <= old / low_f)
    return mx.where(medium, smoothed, scaled)


class DraftRoPE(nn.Module):
    """RoPE over whole heads (non-interleaved), offsets as int or per-batch array."""

    def __init__(self, dims: int, theta: float, scaling: Optional[dict[str, Any]], max_position_embeddings: int):
        super().__init__()
        self.dims, self.base, self.position_scale, self.attention_factor = dims, theta, 1.0, 1.0
        self._inv_freq: Optional[mx.array] = None
        kind = (scaling or {}).get("rope_type", "default")
        try:
            if kind == "linear":
                self.position_scale = 1.0 / float(scaling["factor"])
            elif kind == "llama3":
                self._inv_freq = _llama3(dims, theta, scaling)
            elif kind == "yarn":
                self._inv_freq, self.attention_factor = _yarn(dims, theta, scaling, max_position_embeddings)
        except (KeyError, TypeError, ValueError) as exc:
            raise RopeConfigError(f"draft rope {kind} parameters are incomplete or bad: {exc}") from None
        self.freeze()

    def __call__(self, x: mx.array, offset: "int | mx.array" = 0) -> mx.array:
        if self._inv_freq is None:
            out = mx.fast.rope(x, self.dims, traditional=False, base=self.base, scale=self.position_scale, offset=offset)
        else:
            out = mx.fast.rope(x, self.dims, traditional=False, base=None, scale=1.0, offset=offset,
                               freqs=1.0 / self._inv_freq)
        # transformers scales cos and sin by the attention factor: the rotated vector, q and k alike
        return out * self.attention_factor if self.attention_factor != 1.0 else out
