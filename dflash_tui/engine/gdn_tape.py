"""Gated DeltaNet layers whose state can be rolled back after a partial accept.

A verify forward feeds B tokens through each linear-attention layer; after the
accept only the first `keep` of them may stay in the recurrent state and the
conv state. Neither state can be trimmed, so while a cache is *armed* the layer
records what its own forward computes, and `restore` rebuilds the state after
`keep` steps from that record without re-running the target:

- conv state: the conv input of the verify pass is `[old conv state ; qkv]`, so
  the state after `keep` tokens is one slice of it;
- recurrent state, "states" mode (mlx-lm's per-step ops path: CPU and CUDA):
  the verify pass runs mlx-lm's own single-step function once per token, as
  mlx-lm's `gated_delta_ops` does, and keeps every step's state; the rollback
  picks one (no compute). A one-time bitwise check against mlx-lm's
  `gated_delta_update` guards this against mlx-lm changing its loop;
- recurrent state, "replay" mode (Metal, where mlx-lm runs all steps in its
  `mx.fast.metal_kernel`, or whenever the check fails): the verify pass runs
  mlx-lm's `gated_delta_update` unchanged and records its inputs; the rollback
  re-runs the same function on the first `keep` steps from the recorded start
  state. Its per-step arithmetic does not depend on the step count, so the
  result is the verify pass's own state after `keep` steps, on every backend.

Interception is per layer instance and routes through mlx-lm's own code: the
instance's class is swapped for a subclass (as target.py does for capture), and
on an armed call the subclass runs the base class's `__call__` code object with
a private globals mapping in which only `gated_delta_update` is replaced by a
recorder. The layer's projections, conv, `normalize_qk` and recurrence all stay
mlx-lm's. Unarmed calls (prefill, plain mlx-lm generation) run the base class's
`__call__` itself. Nothing in mlx-lm is modified, and the record lives on the
cache object, so two engines (or two caches on one model) never share one.
"""

from __future__ import annotations

import inspect
import threading
import types
import warnings
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gated_delta as _gd

from dflash_tui.engine import step_rows
from dflash_tui.engine.cuda_gated_delta import gated_delta_fits, gated_delta_steps
from dflash_tui.engine.cuda_kernels import kernels_wanted

_RECORD_ATTR = "_dflash_gdn_record"
MODES = ("auto", "replay")
_UPDATE_ARGS = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state", "mask")
_TIME_SLICED = ("q", "k", "v", "a", "b", "mask")  # [B, T, ...] inputs of gated_delta_update

_active = threading.local()  # the record of the armed layer call running on this thread
_recording_classes: dict[type, type] = {}
_conv_classes: dict[type, type] = {}
_stepwise_verdict: dict[tuple, bool] = {}  # per input signature: does the stepwise loop equal mlx-lm bitwise?


class Record:
    """What one armed verify forward of one layer left behind."""

    __slots__ = ("steps", "conv_input", "states", "replay", "mode")

    def __init__(self, mode: str = "auto"):
        self.mode = mode  # "auto": states where mlx-lm loops per step, else replay; "replay": always replay
        self.steps = 0
        self.conv_input: Optional[mx.array] = None
        self.states: Optional[Any] = None  # state after step 1..T, indexable by step (states mode)
        self.replay: Optional[dict[str, Any]] = None  # gated_delta_update's arguments (replay mode)


# -- which layers can be intercepted ------------------------------------------

def supports(layer: nn.Module) -> bool:
    """True for mlx-lm Gated DeltaNet layers whose forward this module can record."""
    if type(layer) in _recording_classes.values():
        return True
    fn = getattr(type(layer), "__call__", None)
    code = getattr(fn, "__code__", None)
    if code is None or "gated_delta_update" not in code.co_names:
        return False
    if fn.__globals__.get("gated_delta_update") is not _gd.gated_delta_update:
        return False  # the replay and the stepwise loop assume mlx-lm's own recurrence
    if not isinstance(getattr(layer, "conv1d", None), nn.Conv1d):
        return False
    params = list(inspect.signature(fn).parameters)
    return params[:4] == ["self", "inputs", "mask", "cache"] and len(params) == 4


def _recorded_update(*args: Any, **kwargs: Any):
    """Stands in for `gated_delta_update` inside an intercepted layer's forward."""
    rec = getattr(_active, "record", None)
    if rec is None:  # not armed: exactly mlx-lm
        return _gd.gated_delta_update(*args, **kwargs)
    return _record_update(rec, args, kwargs)


def _rebound_call(fn: Callable) -> Callable:
    """`fn`'s own code with a private globals mapping where `gated_delta_update` records."""
    namespace = dict(fn.__globals__)
    namespace["gated_delta_update"] = _recorded_update
    new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _recording_class(cls: type) -> type:
    if cls not in _recording_classes:
        base = cls.__call__
        armed = _rebound_call(base)

        def __call__(self, inputs, mask=None, cache=None):
            rec = getattr(cache, _RECORD_ATTR, None) if cache is not None else None
            if rec is None:
                return base(self, inputs, mask, cache)
            if rec.steps:
                raise RuntimeError("a Gated DeltaNet cache was armed for one forward and got two")
            if getattr(cache, "lengths", None) is not None or getattr(cache, "left_padding", None) is not None:
                raise NotImplementedError("rollback of padded/batched Gated DeltaNet caches is not supported")
            outer = getattr(_active, "record", None)
            _active.record = rec
            try:
                out = armed(self, inputs, mask, cache)
            finally:
                _active.record = outer
            rec.steps = inputs.shape[1]
            return out

        _recording_classes[cls] = type(f"Recording{cls.__name__}", (cls,), {"__call__": __call__})
    return _recording_classes[cls]


def _conv_class(cls: type) -> type:
    if cls not in _conv_classes:
        base = cls.__call__

        def __call__(self, x):
            rec = getattr(_active, "record", None)
            if rec is not None and rec.conv_input is None:
                rec.conv_input = x  # [B, K-1+T, conv_dim]: old conv state then this block's qkv
            return base(self, x)

        _conv_classes[cls] = type(f"Recording{cls.__name__}", (cls,), {"__call__": __call__})
    return _conv_classes[cls]


def attach(layer: nn.Module) -> None:
    """Make this layer instance recordable (idempotent); other instances are untouched."""
    if type(layer) not in _recording_classes.values():
        if not supports(layer):
            raise NotImplementedError(f"cannot record {type(layer).__name__}: not an mlx-lm Gated DeltaNet layer")
        layer.__class__ = _recording_class(type(layer))
        layer.conv1d.__class__ = _conv_class(type(layer.conv1d))


def detach(layer: nn.Module) -> None:
    """Give the layer (and its conv) back their mlx-lm classes."""
    if type(layer) in _recording_classes.values():
        layer.__class__ = type(layer).__mro__[1]
        layer.conv1d.__class__ = type(layer.conv1d).__mro__[1]


# -- arming and restoring a cache ----------------------------------------------

def arm(cache: Any, mode: str = "auto") -> None:
    """Record the next forward through this layer cache (an mlx-lm ArraysCache).

    `mode`: "auto" keeps per-step states where mlx-lm loops per step and replays
    elsewhere; "replay" always replays (the Metal path, selectable anywhere).
    """
    if mode not in MODES:
        raise ValueError(f"unknown rollback mode {mode!r}")
    setattr(cache, _RECORD_ATTR, Record(mode))


def disarm(cache: Any) -> Optional[Record]:
    return cache.__dict__.pop(_RECORD_ATTR, None)


def is_armed(cache: Any) -> bool:
    return _RECORD_ATTR in cache.__dict__


def restore(cache: Any, keep: int) -> None:
    """Set the cache to its state after the first `keep` tokens of the recorded forward."""
    rec = disarm(cache)
    if rec is None or not rec.steps:
        raise RuntimeError("no recorded verify forward to roll back")
    if not 0 <= keep <= rec.steps:
        raise ValueError(f"keep={keep} outside 0..{rec.steps}")
    if keep == rec.steps:
        return  # the forward already left exactly this
    conv_input = rec.conv_input
    n_keep = conv_input.shape[1] - rec.steps
    cache[0] = mx.contiguous(conv_input[:, keep : keep + n_keep, :])
    cache[1] = recurrent_state(rec, keep)


def recurrent_state(rec: Record, keep: int) -> mx.array:
    """The recurrent state after `keep` recorded steps (lazy in replay mode)."""
    if rec.states is not None:
        return rec.states[keep - 1] if keep > 0 else rec.replay["state"]
    args = dict(rec.replay)
    if keep == 0:
        return args["state"]
    opts = args.pop("_opts")
    for name in _TIME_SLICED:
        if args[name] is not None:
            args[name] = args[name][:, :keep]
    return _gd.gated_delta_update(*(args[n] for n in _UPDATE_ARGS), **opts)[1]


# -- what the armed forward computes -------------------------------------------

def _bind(args: tuple, kwargs: dict) -> dict[str, Any]:
    """gated_delta_update's arguments by name (its keyword-only options under `_opts`)."""
    bound: dict[str, Any] = dict.fromkeys(_UPDATE_ARGS)
    bound.update(zip(_UPDATE_ARGS, args))
    opts = dict(kwargs)
    for name in _UPDATE_ARGS:
        if name in opts:
            bound[name] = opts.pop(name)
    bound["_opts"] = opts
    return bound


def _takes_ops_path(bound: dict[str, Any]) -> bool:
    """Whether mlx-lm's gated_delta_update runs its per-step ops loop for these inputs."""
    dk = bound["k"].shape[-1]
    return (
        not bound["_opts"].get("use_kernel", True)
        or mx.default_device() != mx.gpu
        or not mx.metal.is_available()
        or dk < 32
        or dk % 32 != 0
    )


def stepwise_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel: bool = True,
                    lower_bound: Optional[float] = None, allow_neg_eigval: bool = False) -> tuple[mx.array, list[mx.array]]:
    """mlx-lm's gated_delta_update on its ops path, keeping the state after every step.

    Returns (y [B, T, Hv, Dv], [state after step 1, ..., state after step T]).
    """
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = _gd.compute_g(A_log, a, dt_bias)
    else:
        g = _gd.compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    if (repeat := Hv // Hk) > 1:
        q = mx.repeat(q, repeat, -2)
        k = mx.repeat(k, repeat, -2)
    step = _gd._gated_delta_step_ops  # the very step mlx-lm's loop calls
    ys, states = [], []
    for t in range(T):
        y, state = step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, None if mask is None else mask[:, t])
        ys.append(y)
        states.append(state)
    return mx.stack(ys, axis=1), states


def _signature(bound: dict[str, Any]) -> tuple:
    q, v, state = bound["q"], bound["v"], bound["state"]
    return (
        str(mx.default_device()), q.dtype, bound["k"].dtype, v.dtype, bound["a"].dtype, bound["b"].dtype,
        None if state is None else state.dtype, q.shape[0], tuple(q.shape[2:]), tuple(v.shape[2:]),
        bound["mask"] is None, tuple(sorted(bound["_opts"].items())),
    )


def _stepwise_matches(bound: dict[str, Any]) -> bool:
    """Once per input signature: is the stepwise loop bitwise equal to mlx-lm's update?"""
    key = _signature(bound)
    if key not in _stepwise_verdict:
        args = [bound[n] for n in _UPDATE_ARGS]
        opts = bound["_opts"]
        y_ref, s_ref = _gd.gated_delta_update(*args, **opts)
        y, states = stepwise_update(*args, **opts)
        same = bool(mx.array_equal(y, y_ref).item()) and bool(mx.array_equal(states[-1], s_ref).item())
        same = same and y.dtype == y_ref.dtype and states[-1].dtype == s_ref.dtype
        if not same:
            warnings.warn("mlx-lm's Gated DeltaNet loop differs from the recorded one; rolling back by replay",
                          RuntimeWarning, stacklevel=2)
        _stepwise_verdict[key] = same
    return _stepwise_verdict[key]


def _gates(bound: dict[str, Any]) -> tuple[mx.array, mx.array]:
    """(g, beta) as mlx-lm's gated_delta_update computes them."""
    opts = bound["_opts"]
    beta = mx.sigmoid(bound["b"])
    if opts.get("allow_neg_eigval", False):
        beta = beta * 2.0
    if opts.get("lower_bound") is None:
        g = _gd.compute_g(bound["A_log"], bound["a"], bound["dt_bias"])
    else:
        g = _gd.compute_lower_bound_g(bound["A_log"], bound["a"], bound["dt_bias"], opts["lower_bound"])
    return g, beta


def _kernel_fits(bound: dict[str, Any]) -> bool:
    known = set(bound["_opts"]) <= {"use_kernel", "lower_bound", "allow_neg_eigval"}
    g_ndim = bound["a"].ndim  # g has a's shape: [B, T, Hv] for scalar gates
    return known and g_ndim == 3 and gated_delta_fits(bound["q"], bound["v"], bound["a"], bound["state"], bound["mask"])


def _kernel_update(bound: dict[str, Any]) -> tuple[mx.array, Any]:
    """All the verify's steps in one kernel launch (MLX CUDA), every step's state kept.
    Equal to mlx-lm's per-step loop up to float32 summation order, not bitwise."""
    g, beta = _gates(bound)
    return gated_delta_steps(bound["q"], bound["k"], bound["v"], g, beta, bound["state"])


def _record_update(rec: Record, args: tuple, kwargs: dict):
    bound = _bind(args, kwargs)
    if bound["state"] is None:  # the layer's first tokens: start from the zeros mlx-lm would use
        B, _, _, Dk = bound["q"].shape
        Hv, Dv = bound["v"].shape[-2:]
        bound["state"] = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    rec.replay = bound
    # the engine's one-launch kernel, unless the verify's rows must be computed as steps (step_rows.py)
    if rec.mode == "auto" and _takes_ops_path(bound) and kernels_wanted() and not step_rows.active() \
            and _kernel_fits(bound):
        y, states = _kernel_update(bound)
        rec.states = states
        rec.replay = {"state": bound["state"]}
        return y, states[-1]
    if rec.mode == "auto" and _takes_ops_path(bound) and _stepwise_matches(bound):
        y, states = stepwise_update(*(bound[n] for n in _UPDATE_ARGS), **bound["_opts"])
        rec.states = states
        rec.replay = {"state": bound["state"]}  # only the start state is needed in states mode
        return y, states[-1]
    return _gd.gated_delta_update(*(bound[n] for n in _UPDATE_ARGS), **bound["_opts"])
