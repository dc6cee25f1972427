"""Gated DeltaNet rollback: the state after keeping m of B verified steps equals
the state after running those m steps one at a time, bit for bit, for every m."""

from __future__ import annotations

import warnings

import mlx.core as mx
import pytest
from mlx_lm.models import gated_delta as gd
from mlx_lm.models.cache import ArraysCache

from dflash_tui import random_pair as rp
from dflash_tui.engine import gdn_tape

HK, HV, DK, DV = 2, 4, 32, 16  # key heads differ from value heads, as in Qwen3.5


def _inputs(T: int, seed: int = 0):
    mx.random.seed(seed)
    q = mx.random.normal((1, T, HK, DK))
    k = mx.random.normal((1, T, HK, DK))
    q, k = gd.normalize_qk(q, k, inv_scale=DK**-0.5, eps=1e-6)
    v = mx.random.normal((1, T, HV, DV))
    a = mx.random.normal((1, T, HV))
    b = mx.random.normal((1, T, HV))
    A_log = mx.log(mx.random.uniform(low=0, high=16, shape=(HV,)))
    dt_bias = mx.ones(HV)
    state = mx.random.normal((1, HV, DV, DK))
    return q, k, v, a, b, A_log, dt_bias, state


def _one_at_a_time(q, k, v, a, b, A_log, dt_bias, state, m: int) -> mx.array:
    for t in range(m):
        sl = slice(t, t + 1)
        _, state = gd.gated_delta_update(q[:, sl], k[:, sl], v[:, sl], a[:, sl], b[:, sl], A_log, dt_bias, state)
    return state


def test_stepwise_update_is_mlx_lm_bit_for_bit():
    args = _inputs(16)
    y, states = gdn_tape.stepwise_update(*args)
    y_ref, s_ref = gd.gated_delta_update(*args)
    assert y.dtype == y_ref.dtype and states[-1].dtype == s_ref.dtype == mx.float32
    assert mx.array_equal(y, y_ref).item()
    assert mx.array_equal(states[-1], s_ref).item()


@pytest.mark.parametrize("block", [4, 16])
def test_every_kept_prefix_equals_single_steps(block):
    args = _inputs(block, seed=block)
    _, states = gdn_tape.stepwise_update(*args)
    for m in range(1, block + 1):
        want = _one_at_a_time(*args, m)
        assert mx.array_equal(states[m - 1], want).item(), m
        # the replay path (what Metal uses) lands on the same state
        rec = gdn_tape.Record("replay")
        rec.steps = block
        rec.replay = dict(zip(gdn_tape._UPDATE_ARGS, list(args) + [None]), _opts={})
        assert mx.array_equal(gdn_tape.recurrent_state(rec, m), want).item(), m


@pytest.fixture(scope="module")
def tiny_model():
    cfg = rp.qwen3_5_config(300, tie=False, linear_head_dim=32)
    model = rp.build_model(cfg, seed=0, scale=4.0)
    return model


def _gdn(model, i: int = 0):
    return model.language_model.model.layers[i].linear_attn


def _primed_cache(layer, x) -> tuple[mx.array, mx.array]:
    c = ArraysCache(2)
    layer(x, None, c)
    mx.eval(c.state)
    return c[0], c[1]


def _cache(state) -> ArraysCache:
    c = ArraysCache(2)
    c[0], c[1] = state
    return c


@pytest.mark.parametrize("mode", ["auto", "replay"])
def test_layer_rollback_every_m(tiny_model, mode):
    """Whole layer (projections, conv, recurrence): keep m of 8 == m single-token calls."""
    layer = _gdn(tiny_model)
    gdn_tape.attach(layer)
    mx.random.seed(3)
    x = mx.random.normal((1, 13, tiny_model.language_model.args.hidden_size))
    start = _primed_cache(layer, x[:, :5])
    block = 8
    for m in range(0, block + 1):
        c = _cache(start)
        gdn_tape.arm(c, mode)
        layer(x[:, 5:], None, c)
        gdn_tape.restore(c, m)
        assert not gdn_tape.is_armed(c)
        ref = _cache(start)
        for t in range(m):
            layer(x[:, 5 + t : 6 + t], None, ref)
        assert c[0].dtype == ref[0].dtype and c[1].dtype == ref[1].dtype == mx.float32
        assert c[0].shape == ref[0].shape
        assert mx.array_equal(c[0], ref[0]).item(), ("conv", m)
        assert mx.array_equal(c[1], ref[1]).item(), ("state", m)
        # and decoding on from the restored state is the same too
        out = layer(x[:, 5 + m : 6 + m] if m < block else x[:, 12:13], None, c)
        want = layer(x[:, 5 + m : 6 + m] if m < block else x[:, 12:13], None, ref)
        assert mx.array_equal(out, want).item()


def test_recording_does_not_change_the_layer_output(tiny_model):
    layer = _gdn(tiny_model, 1)
    mx.random.seed(4)
    x = mx.random.normal((1, 9, tiny_model.language_model.args.hidden_size))
    base = type(layer).__mro__[1] if type(layer).__name__.startswith("Recording") else type(layer)
    start = _primed_cache(layer, x[:, :3])
    plain_cache = _cache(start)
    plain = base.__call__(layer, x[:, 3:], None, plain_cache)
    gdn_tape.attach(layer)
    for mode in gdn_tape.MODES:
        c = _cache(start)
        gdn_tape.arm(c, mode)
        out = layer(x[:, 3:], None, c)
        assert mx.array_equal(out, plain).item(), mode
        assert mx.array_equal(c[1], plain_cache[1]).item() and mx.array_equal(c[0], plain_cache[0]).item()
        gdn_tape.restore(c, 6)  # full accept leaves the forward's own state
        assert c[1] is not None and mx.array_equal(c[1], plain_cache[1]).item()


def test_first_forward_on_an_empty_cache_rolls_back():
    cfg = rp.qwen3_5_config(300, tie=False)
    layer = _gdn(rp.build_model(cfg, seed=5, scale=4.0))
    gdn_tape.attach(layer)
    mx.random.seed(5)
    x = mx.random.normal((1, 6, 64))
    c = ArraysCache(2)
    gdn_tape.arm(c)
    layer(x, None, c)
    gdn_tape.restore(c, 2)
    ref = ArraysCache(2)
    layer(x[:, :1], None, ref)
    layer(x[:, 1:2], None, ref)
    assert mx.array_equal(c[0], ref[0]).item() and mx.array_equal(c[1], ref[1]).item()


def test_instances_and_caches_are_independent(tiny_model):
    """Attaching swaps one instance's class only; a record belongs to one cache."""
    other = rp.build_model(rp.qwen3_5_config(300, tie=False, linear_head_dim=32), seed=9, scale=4.0)
    mine, theirs = _gdn(tiny_model, 2), _gdn(other, 2)
    gdn_tape.attach(mine)
    assert type(theirs).__name__ == "GatedDeltaNet" and type(theirs.conv1d).__name__ == "Conv1d"
    mx.random.seed(6)
    x = mx.random.normal((1, 4, 64))
    armed, unarmed = ArraysCache(2), ArraysCache(2)
    gdn_tape.arm(armed)
    mine(x, None, armed)
    mine(x, None, unarmed)  # the same layer, another cache: records nothing
    assert gdn_tape.is_armed(armed) and not gdn_tape.is_armed(unarmed)
    with pytest.raises(RuntimeError):
        mine(x, None, armed)  # armed for one forward only
    gdn_tape.disarm(armed)
    gdn_tape.detach(mine)
    assert type(mine).__name__ == "GatedDeltaNet" and type(mine.conv1d).__name__ == "Conv1d"
    gdn_tape.attach(mine)


def test_a_mismatching_loop_falls_back_to_replay(tiny_model, monkeypatch):
    """If mlx-lm's loop ever stops matching the stepwise one, rollback replays instead."""
    layer = _gdn(tiny_model, 0)
    gdn_tape.attach(layer)
    real = gdn_tape.stepwise_update

    def skewed(*args, **kwargs):
        y, states = real(*args, **kwargs)
        return y + 1e-3, states

    monkeypatch.setattr(gdn_tape, "stepwise_update", skewed)
    monkeypatch.setattr(gdn_tape, "_stepwise_verdict", {})
    mx.random.seed(7)
    x = mx.random.normal((1, 10, 64))
    start = _primed_cache(layer, x[:, :2])
    c = _cache(start)
    gdn_tape.arm(c)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer(x[:, 2:], None, c)
    assert any("replay" in str(w.message) for w in caught)
    rec = c.__dict__[gdn_tape._RECORD_ATTR]
    assert rec.states is None and rec.replay is not None
    gdn_tape.restore(c, 3)
    ref = _cache(start)
    layer(x[:, 2:5], None, ref)
    assert mx.array_equal(c[1], ref[1]).item()
