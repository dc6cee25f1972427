"""Target adapter: an mlx-lm model seen as backbone + head, with layer-output capture.

mlx-lm models return logits only. To read the outputs of chosen layers we swap
the class of those layer *instances* for a subclass that records its output, so
mlx-lm's own forward (masks, caches, hybrid layers) runs unchanged and no class
is patched globally: another engine, or plain mlx-lm, in the same process sees
untouched layers.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from dflash_tui.engine import decode_layout, step_rows
from dflash_tui.engine.cuda_step_attention import MAX_ROWS as STEP_ATTENTION_ROWS
from dflash_tui.engine.cuda_step_attention import step_attention
from dflash_tui.engine.draft import ATTENTION_MODES, default_attention_mode, multi_query_attention
from dflash_tui.engine.window_cache import WindowKVCache

_capturing_classes: dict[type, type] = {}
PIPELINE_TOKENS = 16  # forwards this short (cycles, not prefill) are evaluated layer group by layer group


def finish_stream_generate() -> None:
    """Wait for the step `mlx_lm.stream_generate` leaves in flight when its reader stops (it starts
    the next token's forward before yielding this one): left running, it is timed with whatever
    comes next, and on sharded ranks its collectives pair up with the next forward's (the sums mix)."""
    from mlx_lm.generate import generation_stream

    mx.synchronize(generation_stream)


def pipelining_wanted() -> bool:
    """On where the device runs apart from Python (a GPU): there the first layers run while
    Python still builds the rest."""
    return mx.default_device() == mx.gpu


def default_flush_every(num_layers: int) -> int:
    """Layers per pipelined group: two groups per forward (more measured slower on MLX CUDA,
    where each evaluation launches its own graph)."""
    return -(-num_layers // 2) if pipelining_wanted() and num_layers >= 8 else 0


_sdpa_classes: dict[tuple[type, str], Optional[type]] = {}


def _verify_sdpa(original, mode: str):
    """mlx-lm's `scaled_dot_product_attention`, with a verify's multi-query causal calls run in
    `mode`, or as decode steps (step_rows.py); every other call is mlx-lm's own."""

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, WindowKVCache) and cache.step_rows is not None:  # a verify over a sliding window
            return cache.step_rows_attention(
                lambda q, k, v, **kw: original(q, k, v, cache=cache, **kw), queries, scale, sinks)
        if not step_rows.in_verify() or queries.shape[2] == 1 or sinks is not None or hasattr(cache, "bits") \
                or not (mask is None or mask == "causal"):
            # prefill chunks and steps are mlx-lm's own: a kernel's rounding there would change the cache
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        if step_rows.active() and queries.shape[2] <= STEP_ATTENTION_ROWS and queries.shape[0] == 1:
            return step_attention(queries, keys, values, scale)  # each row as the decode step at its position
        out = multi_query_attention(mode, queries, keys, values, scale, causal=mask == "causal")
        if out is None:
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return out

    return sdpa


def _sdpa_class(cls: type, mode: str) -> Optional[type]:
    """A subclass of an attention class whose __call__ runs mlx-lm's own code with only
    `scaled_dot_product_attention` swapped, or None if the class does not call it."""
    key = (cls, mode)
    if key not in _sdpa_classes:
        fn = cls.__call__
        g = getattr(fn, "__globals__", {})
        if "scaled_dot_product_attention" not in g or "scaled_dot_product_attention" not in fn.__code__.co_names:
            _sdpa_classes[key] = None
        else:
            import types

            patched = dict(g, scaled_dot_product_attention=_verify_sdpa(g["scaled_dot_product_attention"], mode))
            call = types.FunctionType(fn.__code__, patched, fn.__name__, fn.__defaults__, fn.__closure__)
            _sdpa_classes[key] = type(f"{mode.title()}SDPA{cls.__name__}", (cls,), {"__call__": call, "_dflash_base": cls})
    return _sdpa_classes[key]


def _capturing_class(cls: type) -> type:
    """A subclass of `cls` whose instances append their output to `self._dflash_sink` and,
    when `self._dflash_flush` is set, start evaluating it (see `Target.flush_every`)."""
    if cls not in _capturing_classes:

        def __call__(self, *args, **kwargs):
            out = cls.__call__(self, *args, **kwargs)
            h = out[0] if isinstance(out, tuple) else out  # Gemma 4 layers also return their K/V
            sink = self._dflash_sink
            if sink is not None:  # armed only inside Target.forward: plain mlx-lm calls capture nothing
                sink.append(h)
            if self._dflash_flush:
                mx.async_eval(h)
            return out

        _capturing_classes[cls] = type(f"Capturing{cls.__name__}", (cls,), {"__call__": __call__})
    return _capturing_classes[cls]


class Target:
    """An mlx-lm model plus what the engine needs from it."""

    def __init__(self, model: nn.Module, tokenizer: Any, name: str = "target"):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.lm = model.language_model if hasattr(model, "language_model") else model
        self.backbone = self.lm.model
        self.args = self.lm.args
        # under mlx-lm's pipeline parallel a rank holds layers [start_idx, end_idx) only: `layers` and
        # the caches are this stage's; layer ids the draft reads stay global (`layer_offset`)
        self.pipelined = getattr(self.backbone, "pipeline_size", 1) > 1
        self.layers = list(self.backbone.pipeline_layers if self.pipelined else self.backbone.layers)
        self.layer_offset = int(self.backbone.start_idx) if self.pipelined else 0
        self.capture_ids: list[int] = []
        self.hooked_ids: list[int] = []
        # Forwards of up to PIPELINE_TOKENS tokens start evaluating every `flush_every` layers, so
        # the device runs the first layers while Python still builds the rest (0 = never).
        self.flush_every = default_flush_every(len(self.layers))
        self.attention_mode = "fused"
        # sliding-window layers (gpt-oss, Gemma 4): a verify's rows attend as one-token steps (window_cache.py)
        self.windowed = any(WindowKVCache.replaces(c) for c in make_prompt_cache(model))
        # a verify's rows computed as decode steps (step_rows.py): off until it makes a GPU run exact
        # at the price; bench/exactness and bench/cycle_cost turn it on to measure it
        self.step_rows = False
        self._verify_next = False  # the next forward is a verify (begin_verify)
        mode = default_attention_mode()
        if mode != "fused" or self.windowed:
            self.use_attention(mode)

    def use_step_rows(self, on: bool) -> bool:
        """Compute each verify's rows as the decode steps at their positions compute them, where
        they would differ otherwise (MLX CUDA, step_rows.py); returns whether they now are."""
        self.step_rows = on and step_rows.wanted() and step_rows.install(self.lm) > 0
        if self.step_rows:
            self.use_attention(self.attention_mode)  # the attention modules must see the verify too
        return self.step_rows

    def use_attention(self, mode: str) -> int:
        """Run this model's multi-query attention in `mode` (one of ATTENTION_MODES; per
        instance, single-token steps keep the fused kernel); returns how many attention
        modules now run it. Caches made before keep working."""
        if mode not in ATTENTION_MODES:
            raise ValueError(f"unknown attention mode {mode!r}")
        n = 0
        for layer in self.layers:
            attn = getattr(layer, "self_attn", None)
            if attn is None:
                continue
            base = getattr(type(attn), "_dflash_base", type(attn))
            cls = base if mode == "fused" and not (self.windowed or self.step_rows) else _sdpa_class(base, mode)
            if cls is not None:
                attn.__class__ = cls
                n += cls is not base
        self.attention_mode = mode
        return n

    # -- shape facts -------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """The model's layers, all stages together."""
        return int(self.args.num_hidden_layers) if self.pipelined else len(self.layers)

    def _local(self, layer_id: int) -> Optional[int]:
        """This stage's index of a global layer id, or None where another rank holds it."""
        i = layer_id - self.layer_offset
        return i if 0 <= i < len(self.layers) else None

    @property
    def hidden_size(self) -> int:
        return int(self.args.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.backbone.embed_tokens.weight.shape[0])

    @property
    def is_hybrid(self) -> bool:
        return any(getattr(layer, "is_linear", False) for layer in self.layers)

    @property
    def dtype(self) -> mx.Dtype:
        return self.backbone.embed_tokens.weight.dtype if not hasattr(self.backbone.embed_tokens, "scales") else mx.bfloat16

    # -- capture -----------------------------------------------------------
    def set_capture(self, layer_ids: list[int]) -> None:
        """Record the outputs of these layers on every forward from now on."""
        self.release_capture()
        self.capture_ids = sorted(layer_ids)
        held = [i for i in map(self._local, self.capture_ids) if i is not None]
        self.hooked_ids = sorted(set(held) | set(self._flush_ids()))
        for i in self.hooked_ids:
            layer = self.layers[i]
            layer.__class__ = _capturing_class(type(layer))
            # plain attributes, not nn.Module children, so they stay out of parameters()
            object.__setattr__(layer, "_dflash_sink", None)
            object.__setattr__(layer, "_dflash_flush", False)

    def release_capture(self) -> None:
        capturing = set(_capturing_classes.values())
        for layer in self.layers:
            if type(layer) in capturing:
                layer.__class__ = type(layer).__mro__[1]
                object.__delattr__(layer, "_dflash_sink")
                object.__delattr__(layer, "_dflash_flush")
        self.capture_ids = []
        self.hooked_ids = []

    def _flush_ids(self) -> list[int]:
        k = self.flush_every
        return list(range(k - 1, len(self.layers) - 1, k)) if k > 0 else []

    def _arm(self, sink: Optional[list], flush: bool = False) -> None:
        for i in map(self._local, self.capture_ids):
            if i is not None:
                object.__setattr__(self.layers[i], "_dflash_sink", sink)
        for i in self._flush_ids():
            if i in self.hooked_ids:
                object.__setattr__(self.layers[i], "_dflash_flush", flush)

    # -- forward -----------------------------------------------------------
    def embed(self, tokens: mx.array) -> mx.array:
        return self.backbone.embed_tokens(tokens)

    def head(self, h: mx.array) -> mx.array:
        """Logits as the model's own `__call__` reads them out: its `lm_head` where it has one
        (mlx-lm builds it only for an untied head; gpt-oss always), else the tied embedding,
        gathered over the ranks where mlx-lm's `shard()` split it over the vocabulary, then the final logit soft-capping where the model has it (Gemma)."""
        lm_head = getattr(self.lm, "lm_head", None)
        logits = lm_head(h) if lm_head is not None else step_rows.as_linear(self.backbone.embed_tokens, h)
        group = getattr(self.lm, "sharding_group", None)
        if lm_head is not None and group is not None:  # mlx-lm's tensor parallel splits the head over the vocab
            from mlx_lm.models.base import gather_last_axis

            logits = gather_last_axis(logits, group)
        cap = getattr(self.lm, "final_logit_softcapping", None)
        if cap is None:
            cap = getattr(self.args, "final_logit_softcapping", None)
        if cap:
            softcap = getattr(sys.modules.get(type(self.lm).__module__), "logit_softcap", None)  # the model's own op
            logits = softcap(cap, logits) if softcap is not None else mx.tanh(logits / cap) * cap
        return logits

    def forward(self, tokens: mx.array, cache: list[Any], last_only: bool = False) -> tuple[mx.array, Optional[mx.array]]:
        """Logits ([1, L, V], or [1, 1, V] with last_only) and captured features [1, L, k*H]."""
        sink: list[mx.array] = []
        verify, self._verify_next = self._verify_next, False
        if tokens.shape[1] == 1 and cache is not None and decode_layout.wanted():
            decode_layout.align_for_step(cache)  # the buffers mlx-lm's own step would read
        self._arm(sink, flush=tokens.shape[1] <= PIPELINE_TOKENS)
        with step_rows.verifying(verify, as_steps=self.step_rows):
            try:
                h = self.backbone(tokens, cache)
            finally:
                self._arm(None)
            if self.pipelined and self.capture_ids:
                feats = self._gather_stages(sink, h)
            else:
                feats = mx.concatenate(sink, axis=-1) if sink else None
            if last_only:
                h = h[:, -1:]
            return self.head(h), feats

    def _gather_stages(self, sink: list[mx.array], h: mx.array) -> mx.array:
        """Every captured layer on every rank: each rank puts the layers it holds and zeros for the
        others, one all_sum adds them up (x + 0 is exact). Made to depend on the backbone's output,
        so it runs after the stage's send/recv and all_gather on every rank, never paired with them."""
        held = iter(sink)
        parts = [next(held) if self._local(g) is not None else mx.zeros(h.shape, h.dtype) for g in self.capture_ids]
        feats = mx.depends(mx.concatenate(parts, axis=-1), h)
        return mx.distributed.all_sum(feats)

    def make_cache(self) -> list[Any]:
        # sliding-window layers get a cache that rolls back exactly (window_cache.py)
        return [WindowKVCache(c.max_size) if WindowKVCache.replaces(c) else c for c in make_prompt_cache(self.model)]

    # -- rollback ----------------------------------------------------------
    def begin_verify(self, cache: list[Any]) -> None:
        """Called before a verify forward; hybrid targets start recording here, sliding windows
        compute its rows as one-token steps, and so does the whole forward on MLX CUDA (step_rows)."""
        self._verify_next = True
        for c in cache:
            if isinstance(c, WindowKVCache):
                c.rows_as_steps = True

    def start_generation(self, cache: list[Any], prompt_len: int) -> None:
        """A generation from a `prompt_len`-token prompt begins (sliding windows order their keys as
        mlx-lm's ring does for it)."""
        for c in cache:
            if isinstance(c, WindowKVCache):
                c.start_generation(prompt_len)

    def rollback(self, cache: list[Any], keep: int, block_len: int) -> None:
        """After verifying `block_len` tokens, keep only the first `keep` of them."""
        drop = block_len - keep
        if drop > 0:
            for c in cache:
                c.trim(drop)

    def truncate(self, cache: list[Any], length: int, keep: int) -> int:
        """Roll a cache holding `length` tokens back to its first `keep`; returns what was kept."""
        if keep >= length:
            return length
        if not all(_can_trim(c, length - keep) for c in cache):
            return -1  # caller must start from an empty cache
        for c in cache:
            c.trim(length - keep)
        return keep


def _can_trim(cache: Any, n: int) -> bool:
    """Whether this layer cache can drop its last `n` tokens exactly."""
    can = getattr(cache, "can_trim", None)
    return can(n) if can is not None else cache.is_trimmable()
