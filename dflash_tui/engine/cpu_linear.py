"""Matrix products through numpy's BLAS on MLX's CPU backend.

The mlx[cpu] wheel for Linux links the netlib *reference* BLAS: its matmuls run
at ~2 GFLOP/s, so a forward's cost grows with the tokens in it and a 16-token
verify costs several single-token steps. numpy ships OpenBLAS, 20-50x faster
here. `use_numpy` swaps, per instance (the way `engine/target.py` swaps layer
classes), a model's `nn.Linear` layers, its tied head (`Embedding.as_linear`),
its SwiGLU MLPs (one trip to numpy each) and its attention for subclasses that
compute in numpy on fp32 copies of the weights and hand back an `mx.array`; the
DFlash draft gets a whole numpy forward (`cpu_draft`). Quantized
layers are left alone.

Two flavours:

- exact (the target): every row of a product is computed by the same BLAS
  calls whatever the number of rows in the forward (one gemv per row, over
  cache-sized slabs of the weight), and each query attends over exactly its
  visible keys. A verify's row is then, bit for bit, the single step that
  would have produced it, so greedy DFlash equals the target alone. (A gemm
  over 16 rows and a gemv over one round differently; in bf16 that flipped
  tokens in 2 of 8 demo replies.) The price: each extra row re-reads the
  weights from L2, ~1.5 ms per verify row for the demo target.
- fast (the draft): small products over narrow slabs of the weight, all rows
  at once, and batched attention; the draft's rounding only changes what it
  proposes, never the output. A head the draft reads out through keeps a copy
  in each layout.

Swapping the model object itself means `mlx_lm.stream_generate` on it (the
bench's baseline) runs exactly the same kernels as the engine. The products
carry no gradients: training keeps MLX's own (see loading.load_target).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import types
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

ENV = "DFLASH_TUI_CPU_MATMUL"
MODES = ("auto", "numpy", "mlx")
# bytes of one weight slab: a row's gemv over it leaves it in L2 for the next row
SLAB_BYTES = 1536 * 1024
# auto mode keeps the fp32 copies under this share of the memory available at load
MEMORY_SHARE = 0.25


# -- when ---------------------------------------------------------------------

def on_cpu_backend() -> bool:
    """MLX runs on its CPU backend with the reference BLAS (Linux wheels; macOS has Accelerate)."""
    return mx.default_device() == mx.cpu and sys.platform != "darwin"


def resolve_mode(mode: Optional[str] = None) -> str:
    """`mode`, else $DFLASH_TUI_CPU_MATMUL, else "auto"; one of MODES (raises ValueError)."""
    value = (mode or os.environ.get(ENV, "") or "auto").strip().lower()
    value = {"on": "numpy", "1": "numpy", "off": "mlx", "0": "mlx"}.get(value, value)
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def extra_bytes(*modules: nn.Module) -> int:
    """Memory the fp32 copies would add (fp32 weights are used in place); a head counts twice,
    since the draft reads out through it in the other flavour's layout."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for name, m in module.named_modules():
            if type(m) in (nn.Linear, nn.Embedding) and id(m) not in seen and m.weight.dtype != mx.float32:
                seen.add(id(m))
                head = isinstance(m, nn.Embedding) or name.endswith("lm_head")
                total += m.weight.size * 4 * (2 if head else 1)
    return total


def wanted(mode: Optional[str], *modules: nn.Module) -> bool:
    """Whether to swap `modules` under `mode` (see resolve_mode): never off MLX's CPU backend;
    in auto mode only while their fp32 copies fit in MEMORY_SHARE of the available memory."""
    mode = resolve_mode(mode)
    if mode == "mlx" or not on_cpu_backend():
        return False
    if mode == "numpy":
        return True
    import psutil

    return extra_bytes(*modules) <= MEMORY_SHARE * psutil.virtual_memory().available


def blas_name() -> str:
    """numpy's BLAS, e.g. "scipy-openblas 0.3.31"."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except Exception:  # show_config's layout is not a stable API
        return "numpy blas"


def single_thread_blas() -> bool:
    """Run numpy's OpenBLAS on one thread (unless $OPENBLAS_NUM_THREADS says otherwise): these
    products are small, and a second thread waiting on a busy core stalls a call for ms.
    numpy has no API for it; returns whether the library was found."""
    if os.environ.get("OPENBLAS_NUM_THREADS") or not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and line.rstrip().endswith(".so")}
    except OSError:
        return False
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(1))
                return True
    return False


# -- host arrays --------------------------------------------------------------

_local = threading.local()


def _host(a: mx.array, remember: bool = False) -> np.ndarray:
    """An fp32 numpy view of `a` (evaluated; bf16/fp16 converted by MLX first). With `remember`,
    the last one is kept: the q/k/v projections of one input convert it once."""
    last = getattr(_local, "last", None)
    if remember and last is not None and last[0] is a:
        return last[1]
    h = np.asarray(a if a.dtype == mx.float32 else a.astype(mx.float32))
    # holds `a`, so its id cannot be reused while it is remembered
    _local.last = (a, h) if remember else None
    return h


def host_array(a: mx.array) -> np.ndarray:
    """An fp32 host copy of an evaluated array. bf16 is widened on the host (its bits are the
    top half of an fp32's), so, unlike `_host`, this runs no MLX op and never waits on MLX's stream."""
    if a.dtype == mx.bfloat16:
        view = memoryview(a)
        if view.contiguous:
            bits = np.frombuffer(view, dtype=np.uint16).reshape(a.shape)
            return (bits.astype(np.uint32) << 16).view(np.float32)
    return _host(a)


def _device(y: np.ndarray, lead: tuple, dtype: mx.Dtype) -> mx.array:
    out = mx.array(y).reshape(*lead, y.shape[-1])
    return out if dtype == mx.float32 else out.astype(dtype)


# -- products -----------------------------------------------------------------

# the fast flavour's slabs are [K, n] with n * K * FAST_ROWS under this many multiply-adds: OpenBLAS
# runs such products in its small-matrix kernels, which skip packing the weight (for a few
# rows, packing costs more than the product)
SMALL_PRODUCT = 1 << 20
FAST_ROWS = 8


class _Weight:
    """fp32 copies of a weight [N, K] for the two flavours, made on first use.

    exact: slabs of about SLAB_BYTES, so that a row's gemv over one leaves it in L2 for the
    next row; transposed ([K, n]: y = x W^T as x's combination of W^T's rows, 20-25% faster
    here than dot products with W's rows) when the weight was converted, else views of an fp32
    weight used in place. fast: one stack of narrow transposed slabs [S, K, n], one call for
    all of them (see SMALL_PRODUCT). A converted weight keeps no [N, K] copy once its slabs
    exist; `rows` reads rows back from whichever layout there is."""

    def __init__(self, w: np.ndarray, bias: Optional[np.ndarray] = None, source=None, bias_source=None,
                 copied: bool = True):
        self.source, self.bias_source = source, bias_source  # a replaced weight is copied again
        self._w: Optional[np.ndarray] = np.ascontiguousarray(w, dtype=np.float32)
        self.shape = self._w.shape
        self.bias = bias
        self.transposed = copied  # the exact slabs' layout (see the class doc)
        self._slabs: Optional[list[np.ndarray]] = None
        self._stack: Optional[np.ndarray] = None

    @classmethod
    def of(cls, w: mx.array, bias: Optional[mx.array] = None) -> "_Weight":
        host = np.asarray(w if w.dtype == mx.float32 else w.astype(mx.float32))
        return cls(host, None if bias is None else np.array(bias.astype(mx.float32)), w, bias,
                   copied=w.dtype != mx.float32)

    @property
    def w(self) -> np.ndarray:
        """[N, K] fp32 (rebuilt, not kept, where the slabs replaced it)."""
        if self._w is not None:
            return self._w
        if self._slabs is not None:
            return np.concatenate([s.T for s in self._slabs], axis=0)
        return self._stack.transpose(0, 2, 1).reshape(-1, self.shape[1])[: self.shape[0]]

    def rows(self, ids: list[int]) -> np.ndarray:
        """W[ids] [len(ids), K] (an embedding lookup on a tied head's copy)."""
        if self._w is not None:
            return self._w[ids]
        if self._stack is not None:
            n = self._stack.shape[2]
            return np.stack([self._stack[i // n, :, i % n] for i in ids])
        n = self._slabs[0].shape[1]
        return np.stack([self._slabs[i // n][:, i % n] for i in ids])

    def _drop_dense(self) -> None:
        if self.transposed:
            self._w = None  # a converted weight: the slabs hold the same numbers

    @property
    def slabs(self) -> list[np.ndarray]:
        if self._slabs is None:
            w = self.w
            n, k = w.shape
            rows = max(16, (SLAB_BYTES // (4 * k)) // 16 * 16)
            if self.transposed:
                self._slabs = [np.ascontiguousarray(w[i : i + rows].T) for i in range(0, n, rows)]
                self._drop_dense()
            else:
                self._slabs = [w[i : i + rows] for i in range(0, n, rows)]  # contiguous views
        return self._slabs

    @property
    def stack(self) -> np.ndarray:
        """The fast flavour's [S, K, n] slabs (the last one padded with zero rows of W)."""
        if self._stack is None:
            w = self.w
            n_rows, k = w.shape
            n = 128
            while n > 16 and n * k * FAST_ROWS >= SMALL_PRODUCT:
                n //= 2
            n = min(n, n_rows)
            pad = -n_rows % n
            if pad:
                w = np.concatenate([w, np.zeros((pad, k), np.float32)])
            self._stack = np.ascontiguousarray(w.reshape(-1, n, k).transpose(0, 2, 1))
            self._drop_dense()
        return self._stack

    def exact(self, x: np.ndarray) -> np.ndarray:
        """x [M, K] -> [M, N]: one gemv per row and slab, the same calls for any M."""
        y = self._gemv(np.ascontiguousarray(x))
        if self.bias is not None:
            y += self.bias
        return y

    def _gemv(self, x: np.ndarray) -> np.ndarray:
        slabs = self.slabs
        if self.transposed:
            x3 = x[:, None, :]  # [M, 1, K]: numpy runs one gemv per row
            parts = [np.matmul(x3, s)[:, 0] for s in slabs]
        else:
            x3 = x[:, :, None]  # [M, K, 1]: likewise
            parts = [np.matmul(s, x3)[:, :, 0] for s in slabs]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def fast(self, x: np.ndarray) -> np.ndarray:
        """x [M, K] -> [M, N]: one small product per slab of the stack, in one numpy call (for a
        few rows 1.2-1.5x faster than one gemm over the whole weight, in the draft measured here)."""
        m = x.shape[0]
        y = np.matmul(x, self.stack)  # [S, M, n]
        y = y.transpose(1, 0, 2).reshape(m, -1)
        if y.shape[1] != self.shape[0]:
            y = y[:, : self.shape[0]]
        return y if self.bias is None else y + self.bias

    def __call__(self, x: np.ndarray, exact: bool) -> np.ndarray:
        return self.exact(x) if exact else self.fast(x)


def _weight(module: nn.Module) -> _Weight:
    cache = module.__dict__.get("_dflash_np")
    bias = module.get("bias") if isinstance(module, nn.Linear) else None
    if cache is None or cache.source is not module.weight or cache.bias_source is not bias:
        cache = _Weight.of(module.weight, bias)
        object.__setattr__(module, "_dflash_np", cache)  # a plain attribute: stays out of parameters()
    return cache


def _stacked(owner: nn.Module, key: str, parts: tuple) -> _Weight:
    """The weights of `parts` (bias-free Linear layers with one input) stacked by rows, kept on `owner`."""
    sources = tuple(p.weight for p in parts)
    cache = owner.__dict__.get(key)
    if cache is None or any(a is not b for a, b in zip(cache[0], sources)):
        cache = (sources, _Weight(np.concatenate([_weight(p).w for p in parts], axis=0)))
        object.__setattr__(owner, key, cache)
    return cache[1]


def _rows(w: _Weight, x: np.ndarray) -> np.ndarray:
    """x [..., K] @ w.T (the fast flavour)."""
    lead = x.shape[:-1]
    return w.fast(x.reshape(-1, x.shape[-1])).reshape(*lead, -1)


def _product(module: nn.Module, x: mx.array, exact: bool) -> mx.array:
    k = x.shape[-1]
    y = _weight(module)(_host(x, remember=True).reshape(-1, k), exact)
    return _device(y, x.shape[:-1], mx.result_type(x, module.weight))


class NumpyLinear(nn.Linear):
    """nn.Linear computed by numpy's BLAS (exact or fast, per instance). An untied head
    (`lm_head`) is exact except right after the draft's forward, like NumpyEmbedding.as_linear."""

    def __call__(self, x: mx.array) -> mx.array:
        exact = self.__dict__.get("_dflash_exact", True)
        if self.__dict__.get("_dflash_head", False):
            exact = exact and not _draft_read_out()
        elif exact:
            _local.draft_head = False  # a target layer: the target's forward is running
        return _product(self, x, exact)


def mark_draft_read_out() -> None:
    """The draft's forward just ended: the next head call reads it out (see NumpyEmbedding)."""
    _local.draft_head = True


def _draft_read_out() -> bool:
    """Whether this head call reads out the draft's forward (see NumpyEmbedding); once only."""
    mine = getattr(_local, "draft_head", False)
    _local.draft_head = False
    return mine


class NumpyEmbedding(nn.Embedding):
    """nn.Embedding whose `as_linear` (a tied head) is computed by numpy's BLAS; lookups stay MLX's.

    The head is shared by the target and the draft, which reads out through it
    right after its forward: that one call needs no exact rows (the draft's forward
    sets a flag; the head call takes it; any start of a target forward drops it)."""

    def __call__(self, x: mx.array) -> mx.array:
        _local.draft_head = False  # every forward, the target's or the draft's, starts here
        return super().__call__(x)

    def as_linear(self, x: mx.array) -> mx.array:
        exact = self.__dict__.get("_dflash_exact", True) and not _draft_read_out()
        return _product(self, x, exact)


# -- SwiGLU MLPs ----------------------------------------------------------------

# the bytecode names of `down(silu(gate(x)) * up(x))` as mlx-lm's and the draft's MLPs write it
_SWIGLU_NAMES = {("down_proj", "swiglu", "gate_proj", "up_proj"), ("down_proj", "nn", "silu", "gate_proj", "up_proj")}


def _is_swiglu_mlp(cls: type) -> bool:
    code = getattr(cls.__call__, "__code__", None)
    return code is not None and code.co_names in _SWIGLU_NAMES


def _mlp_host(mlp: nn.Module, x: np.ndarray, exact: bool) -> np.ndarray:
    """down(silu(gate(x)) * up(x)) on host rows x [..., K]; the fast flavour projects gate and
    up in one gemm."""
    lead = x.shape[:-1]
    x = x.reshape(-1, x.shape[-1])
    if exact:
        g, u = _weight(mlp.gate_proj).exact(x), _weight(mlp.up_proj).exact(x)
    else:
        gu = _stacked(mlp, "_dflash_gate_up", (mlp.gate_proj, mlp.up_proj)).fast(x)
        g, u = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2 :]
    # silu(g) * u = g * u / (1 + exp(-g)), elementwise: each row's values whatever the rows
    a = np.exp(-g)
    a += 1.0
    return _weight(mlp.down_proj)(g * u / a, exact).reshape(*lead, -1)


def _mlp_call(self, x: mx.array) -> mx.array:
    """down(silu(gate(x)) * up(x)) in one trip to numpy (the MLX path rounds gate/up to the
    model's dtype in between; this keeps them in fp32)."""
    gate, up, down = self.gate_proj, self.up_proj, self.down_proj
    if not all(type(m) is NumpyLinear for m in (gate, up, down)):
        return type(self)._dflash_numpy_base.__call__(self, x)
    exact = self.__dict__.get("_dflash_exact", True)
    if exact:
        _local.draft_head = False  # a target layer: the target's forward is running
    y = _mlp_host(self, _host(x), exact)
    return _device(y.reshape(-1, y.shape[-1]), x.shape[:-1], mx.result_type(x, gate.weight, up.weight, down.weight))


# -- attention ----------------------------------------------------------------

def attend(qf: np.ndarray, kf: np.ndarray, vf: np.ndarray, scale: float, causal: bool, exact: bool) -> np.ndarray:
    """softmax(q k^T * scale) v with GQA on host arrays: q [B, H, L, D], k/v [B, Hkv, S, D] -> [B, H, L, D].

    `causal`: the L queries are the last L of the S positions. `exact`: each query
    attends over exactly its visible keys with the shapes a lone query there would
    have (the same BLAS calls and reductions), so its result does not depend on L."""
    B, H, L, D = qf.shape
    Hkv, S = kf.shape[1], kf.shape[2]
    G = H // Hkv
    qf = qf.reshape(B, Hkv, G, L, D) * np.float32(scale)
    if not exact:
        s = np.matmul(qf.reshape(B, Hkv, G * L, D), kf.swapaxes(-1, -2))
        if causal and L > 1:
            allowed = np.arange(S)[None] <= (S - L + np.arange(L))[:, None]
            s = np.where(np.tile(allowed, (G, 1)), s, np.float32(-np.inf))
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        return (np.matmul(s, vf) / s.sum(-1, keepdims=True)).reshape(B, H, L, D)
    qf = np.ascontiguousarray(qf.transpose(0, 1, 3, 2, 4))  # [B, Hkv, L, G, D]: a query's G rows contiguous
    out = np.empty((B, Hkv, L, G, D), np.float32)
    for i in range(L):
        n = S - L + i + 1 if causal else S
        s = np.matmul(qf[:, :, i], kf[:, :, :n].swapaxes(-1, -2))  # [B, Hkv, G, n]
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        out[:, :, i] = np.matmul(s, vf[:, :, :n]) / s.sum(-1, keepdims=True)
    return out.transpose(0, 1, 3, 2, 4).reshape(B, H, L, D)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, exact: bool) -> mx.array:
    """`attend` on MLX arrays (q [B, H, L, D], k/v [B, Hkv, S, D]); the result in q's dtype."""
    return mx.array(attend(_host(q), _host(k), _host(v), scale, causal, exact)).astype(q.dtype)


def _numpy_sdpa(original: Callable, exact: bool) -> Callable:
    """mlx-lm's `scaled_dot_product_attention` with the plain cases (no mask array, sinks or
    quantized cache) computed by `attention`."""

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        if exact:
            _local.draft_head = False  # a target layer: the target's forward is running
        if sinks is not None or hasattr(cache, "bits") or not (mask is None or (isinstance(mask, str) and mask == "causal")):
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return attention(queries, keys, values, scale, causal=mask == "causal", exact=exact)

    return sdpa


def _numpy_mqa(original: Callable, exact: bool) -> Callable:
    """The draft's `multi_query_attention(mode, q, keys, values, cache, scale, causal)` with the
    fused mode (MLX's own kernel) computed by `attention`; other modes, chosen on purpose, stay."""

    def mqa(mode, q, keys, values, cache, scale, causal=False):
        if mode != "fused":
            return original(mode, q, keys, values, cache, scale, causal=causal)
        return attention(q, keys, values, scale, causal=causal, exact=exact)

    return mqa


# global name an attention class's __call__ calls -> its numpy replacement
_ATTENTION_HOOKS: dict[str, Callable[[Callable, bool], Callable]] = {
    "scaled_dot_product_attention": _numpy_sdpa,
    "multi_query_attention": _numpy_mqa,
}


# -- swapping -----------------------------------------------------------------

_classes: dict[tuple[type, bool], Optional[type]] = {}


def _numpy_class(cls: type, exact: bool) -> Optional[type]:
    """The numpy subclass for a module class (SwiGLU MLP, attention or DFlash draft), or None."""
    key = (cls, exact)
    if key in _classes:
        return _classes[key]
    body: Optional[dict] = None
    if _is_swiglu_mlp(cls):
        body = {"__call__": _mlp_call}
    elif cls.__name__ == "DFlashDraft":
        from dflash_tui.engine import cpu_draft  # it builds on this module's products

        body = cpu_draft.numpy_draft_methods()
    else:
        fn = cls.__call__
        g, code = getattr(fn, "__globals__", {}), getattr(fn, "__code__", None)
        names = [n for n in _ATTENTION_HOOKS if code is not None and n in code.co_names and n in g]
        if names:
            # the class's own __call__ code, with only its attention function swapped
            patched = dict(g, **{n: _ATTENTION_HOOKS[n](g[n], exact) for n in names})
            body = {"__call__": types.FunctionType(code, patched, fn.__name__, fn.__defaults__, fn.__closure__),
                    # Target.use_attention(mode) builds its mode on this base: a mode chosen on
                    # purpose replaces the numpy attention (for both decoders: same object)
                    "_dflash_base": cls}
    if body is not None:
        body["_dflash_numpy_base"] = cls
        _classes[key] = type(f"Numpy{cls.__name__}", (cls,), body)
    else:
        _classes[key] = None
    return _classes[key]


def use_numpy(module: nn.Module, exact: bool = True) -> int:
    """Swap (per instance) every plain Linear, Embedding head, SwiGLU MLP and known attention
    inside `module` for its numpy subclass (`exact`: see the module doc); returns how many."""
    single_thread_blas()
    n = 0
    for _, m in module.named_modules():
        cls = type(m)
        if cls is nn.Linear:
            m.__class__ = NumpyLinear
        elif cls is nn.Embedding:
            m.__class__ = NumpyEmbedding
        elif cls in (NumpyLinear, NumpyEmbedding) or "_dflash_numpy_base" in cls.__dict__:
            pass
        else:
            sub = _numpy_class(cls, exact)
            if sub is None:
                continue
            m.__class__ = sub
        object.__setattr__(m, "_dflash_exact", exact)
        n += 1
    for _, m in module.named_modules():
        head = m.get("lm_head")
        if type(head) is NumpyLinear:
            object.__setattr__(head, "_dflash_head", True)
    return n


def release(module: nn.Module) -> None:
    """Undo `use_numpy` on `module` (its fp32 copies are dropped)."""
    for _, m in module.named_modules():
        m.__dict__.pop("_dflash_np", None)
        cls = type(m)
        if cls is NumpyLinear:
            m.__class__ = nn.Linear
        elif cls is NumpyEmbedding:
            m.__class__ = nn.Embedding
        elif "_dflash_numpy_base" in cls.__dict__:
            m.__class__ = cls._dflash_numpy_base
        else:
            continue
        for attr in ("_dflash_np", "_dflash_exact", "_dflash_head"):
            m.__dict__.pop(attr, None)


def is_numpy(module: nn.Module) -> bool:
    return any(type(m) in (NumpyLinear, NumpyEmbedding) for _, m in module.named_modules())


def prepare(module: nn.Module) -> None:
    """Make the fp32 copies now (at load) rather than in the first forward."""
    for _, m in module.named_modules():
        if type(m) in (NumpyLinear, NumpyEmbedding):
            w = _weight(m)
            if m.__dict__.get("_dflash_exact", True):
                w.slabs  # noqa: B018 -- the exact flavour's copies
            else:
                w.stack  # noqa: B018 -- the fast flavour's


def prepare_read_out(head: nn.Module) -> None:
    """A target head the draft reads out through gets the fast flavour's copy as well, now."""
    if type(head) in (NumpyLinear, NumpyEmbedding):
        _weight(head).stack  # noqa: B018


def describe(module: Optional[nn.Module]) -> str:
    """The matmul path a model runs: "numpy (<blas>)" or "mlx"."""
    return f"numpy ({blas_name()})" if module is not None and is_numpy(module) else "mlx"
