"""The DFlash draft's forward in numpy, for MLX's CPU backend (see `cpu_linear`).

The whole forward stays on the host, its K/V caches included (`HostKVCache`:
fp32 numpy arrays), so a draft forward crosses into MLX only to read the
target's new features and the block's embeddings and to hand back the block's
hidden states. With MLX's caches every layer also converted its whole cache to
fp32 numpy and waited on MLX's scheduler, several times a cycle.
Products run in the fast flavour (one gemm each): the draft's rounding only
changes what it proposes, never the output.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from dflash_tui.engine.cpu_linear import NumpyEmbedding, NumpyLinear, _Weight, _host, _mlp_host, _rows, _stacked, _weight, attend, mark_draft_read_out


class HostKVCache:
    """One draft layer's K/V as fp32 host arrays [B, Hkv, capacity, D] that grow in steps.

    Keeps mlx-lm's cache contract where the engine uses a draft cache (`offset`,
    `trim`); it has no MLX arrays to evaluate."""

    step = 256

    def __init__(self) -> None:
        self.host_keys: Optional[np.ndarray] = None
        self.host_values: Optional[np.ndarray] = None
        self.offset = 0

    def append(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write keys/values [B, Hkv, n, D] after the offset; returns views of all the cached ones."""
        end = self.offset + keys.shape[2]
        if self.host_keys is None or end > self.host_keys.shape[2]:
            size = -(-end // self.step) * self.step
            grown = []
            for old, new in ((self.host_keys, keys), (self.host_values, values)):
                buf = np.empty((*new.shape[:2], size, new.shape[3]), np.float32)
                if old is not None:
                    buf[:, :, : self.offset] = old[:, :, : self.offset]
                grown.append(buf)
            self.host_keys, self.host_values = grown
        self.host_keys[:, :, self.offset : end] = keys
        self.host_values[:, :, self.offset : end] = values
        self.offset = end
        return self.host_keys[:, :, :end], self.host_values[:, :, :end]

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n


# -- pieces ---------------------------------------------------------------------

def _vector(module: nn.Module) -> np.ndarray:
    """A norm's weight as fp32, kept on the module (copied again if the weight is replaced)."""
    cache = module.__dict__.get("_dflash_np")
    if cache is None or cache[0] is not module.weight:
        cache = (module.weight, np.array(module.weight.astype(mx.float32)))
        object.__setattr__(module, "_dflash_np", cache)
    return cache[1]


def _rms_norm(x: np.ndarray, norm: nn.Module) -> np.ndarray:
    ms = np.einsum("...i,...i->...", x, x)[..., None]
    ms *= np.float32(1.0 / x.shape[-1])
    ms += np.float32(norm.eps)
    return x * (1.0 / np.sqrt(ms)) * _vector(norm)


def _rope(x: np.ndarray, rope: nn.Module, offset: int) -> np.ndarray:
    """nn.RoPE (rotate-half form) on x [B, H, L, D], positions offset..offset+L-1."""
    half = rope.dims // 2
    inv = np.power(np.float32(rope.base), -np.arange(0, rope.dims, 2, dtype=np.float32) / np.float32(rope.dims))
    theta = ((offset + np.arange(x.shape[2], dtype=np.float32)) * np.float32(rope.scale))[:, None] * inv
    cos, sin = np.cos(theta), np.sin(theta)
    x1, x2 = x[..., :half], x[..., half : rope.dims]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half : rope.dims] = x1 * sin + x2 * cos
    return out


def _heads(y: np.ndarray, n: int) -> np.ndarray:
    """[B, L, n*D] -> [B, n, L, D]."""
    B, L, _ = y.shape
    return y.reshape(B, L, n, -1).transpose(0, 2, 1, 3)


def host_forward_fits(draft: nn.Module) -> bool:
    """Whether the numpy forward covers the draft: all its parts are the plain kinds it
    implements and its attention runs MLX's fused kernel (another mode is one chosen on purpose)."""
    for layer in draft.layers:
        a = layer.self_attn
        if getattr(a, "mode", "fused") != "fused":
            return False
        parts = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        if not all(type(m) is NumpyLinear and "bias" not in m for m in parts) or type(a.rope) is not nn.RoPE \
                or a.rope.traditional or not all(type(n) is nn.RMSNorm for n in (a.q_norm, a.k_norm, layer.input_layernorm,
                                                                                  layer.post_attention_layernorm)):
            return False
    return type(draft.fc) is NumpyLinear and type(draft.norm) is nn.RMSNorm and type(draft.hidden_norm) is nn.RMSNorm


def _attention(a: nn.Module, ctx: Optional[np.ndarray], x: Optional[np.ndarray], cache: HostKVCache) -> Optional[np.ndarray]:
    """DraftAttention on host rows: the context's K/V (if any) and the block's are appended to
    `cache` in one write (the block's positions follow the context's); returns the block's
    attention output after o_proj [B, L, H] (None without a block). One gemm projects q, k and v of all rows."""
    rows = x if ctx is None else (ctx if x is None else np.concatenate([ctx, x], axis=1))
    T = 0 if ctx is None else ctx.shape[1]
    qd, kd = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    if x is None:
        kv = _rows(_stacked(a, "_dflash_kv", (a.k_proj, a.v_proj)), rows)
        k, v = kv[..., :kd], kv[..., kd:]
    else:
        qkv = _rows(_stacked(a, "_dflash_qkv", (a.q_proj, a.k_proj, a.v_proj)), rows)
        q, k, v = qkv[:, T:, :qd], qkv[..., qd : qd + kd], qkv[..., qd + kd :]
    start = cache.offset
    keys, values = cache.append(_rope(_rms_norm(_heads(k, a.n_kv_heads), a.k_norm), a.rope, start),
                                _heads(v, a.n_kv_heads))
    if x is None:
        return None
    L = x.shape[1]
    q = _rope(_rms_norm(_heads(q, a.n_heads), a.q_norm), a.rope, start + T)
    if a.window is not None and keys.shape[2] > a.window + L:
        keys, values = keys[:, :, -(a.window + L) :], values[:, :, -(a.window + L) :]
    o = attend(q, keys, values, a.scale, causal=False, exact=False)
    return _rows(_weight(a.o_proj), o.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1))


def _fused(draft: nn.Module, features: "Optional[mx.array | np.ndarray]") -> Optional[np.ndarray]:
    """hidden_norm(fc(features)) on host: the draft's context for new target features (MLX's,
    or already on the host: see DecodeState.pending)."""
    if features is None or features.shape[1] == 0:
        return None
    rows = features if isinstance(features, np.ndarray) else _host(features)
    return _rms_norm(_rows(_weight(draft.fc), rows), draft.hidden_norm)


def _on_host(cache: Any) -> bool:
    return bool(cache) and all(isinstance(c, HostKVCache) for c in cache)


# -- the methods the numpy draft class gets ---------------------------------------

def _make_cache(self) -> list:
    """Host caches when the numpy forward covers this draft (decided once, for the caches'
    life: a mode chosen later applies to caches made after it), else MLX's."""
    if host_forward_fits(self):
        return [HostKVCache() for _ in self.layers]
    return type(self)._dflash_numpy_base.make_cache(self)


def _forward(self, h: np.ndarray, features: Optional[mx.array], cache: list) -> np.ndarray:
    """The draft's layers on host rows h [B, L, H] (fp32, updated in place) -> norm(h)."""
    ctx = _fused(self, features)
    for layer, c in zip(self.layers, cache):
        h += _attention(layer.self_attn, ctx, _rms_norm(h, layer.input_layernorm), c)
        h += _mlp_host(layer.mlp, _rms_norm(h, layer.post_attention_layernorm), exact=False)
    return _rms_norm(h, self.norm)


def _call(self, block_embeds: mx.array, features: Optional[mx.array], cache: list) -> mx.array:
    """DFlashDraft.__call__ in numpy; its read-out through the target's head comes next and
    needs no exact rows."""
    if not _on_host(cache):
        out = type(self)._dflash_numpy_base.__call__(self, block_embeds, features, cache)
    else:
        out = mx.array(_forward(self, np.array(_host(block_embeds)), features, cache)).astype(self.fc.weight.dtype)
    mark_draft_read_out()
    return out


def host_parts(target: Any, draft: nn.Module, cache: Any) -> Optional[tuple[_Weight, _Weight]]:
    """(embedding rows, head) as fp32 host weights when a whole draft step can stay on the host:
    the numpy forward with host caches, and a tied head already copied for numpy (its rows are
    the embedding table, so the lookup needs no MLX call); else None."""
    embed = target.backbone.embed_tokens
    if not _on_host(cache) or not hasattr(draft, "_dflash_numpy_base") or not target.args.tie_word_embeddings \
            or type(embed) is not NumpyEmbedding:
        return None
    w = _weight(embed)
    return w, w


def block_logits(draft: nn.Module, parts: tuple[_Weight, _Weight], token: int, b: int,
                 features: Optional[mx.array], cache: list) -> np.ndarray:
    """One draft step on the host: the forward over [token, MASK x (b-1)], then the read-out
    of the b-1 proposals through the target's head (the fast flavour) -> logits [b-1, V].
    The embedding rows are the fp32 copy of the table MLX would look them up in: the same values."""
    table, head = parts
    ids = [token] + [draft.config.mask_token_id] * (b - 1)
    hidden = _forward(draft, table.rows(ids)[None], features, cache)
    for c in cache:
        c.trim(b)  # the block's own K/V is never kept
    return head.fast(np.ascontiguousarray(hidden[0, 1:]))


def _append_context(self, features: mx.array, cache: list) -> None:
    if not _on_host(cache):
        return type(self)._dflash_numpy_base.append_context(self, features, cache)
    ctx = _fused(self, features)
    if ctx is not None:
        for layer, c in zip(self.layers, cache):
            _attention(layer.self_attn, ctx, None, c)


def numpy_draft_methods() -> dict[str, Callable]:
    """The body of the numpy subclass of DFlashDraft (see cpu_linear.use_numpy)."""
    return {"__call__": _call, "append_context": _append_context, "make_cache": _make_cache}
