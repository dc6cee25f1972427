"""A verify computed row by row as decode steps (engine/step_rows.py), wired into the target.

On MLX CUDA `Target.use_step_rows(True)` runs a verify's linears and attention through
kernels that compute each row as the one-row (decode step) kernel does (the benchmarks turn
it on; the engine's default stays the batched verify until it is exact at the issue's price);
their bit-equality with MLX's one-row kernels is checked on a CUDA GPU
(test_cuda_rowwise*.py, test_cuda_step_attention.py and `bench/exactness`). Here, on the CPU,
the same wiring is forced on (the kernels then give MLX's own per-row results): it must take
exactly the verify's forwards, every plain and quantized linear, the tied head and the
attention, and leave the output mlx-lm's. And a prefill chunk short enough for the verify's
attention kernel is mlx-lm's own attention.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import pytest

from conftest import oracle_run
from dflash_tui import random_pair as rp
from dflash_tui.engine import step_rows
from dflash_tui.engine import target as target_module
from dflash_tui.engine.loading import load_pair

N_TOKENS = 64
PROMPT = "Tell me about rivers and the sea, " * 2
DIMS = {"hidden": 128, "intermediate": 256, "heads": 4, "kv_heads": 2, "head_dim": 32, "layers": 3}


def _build(root, variant: str) -> dict:
    cfg = rp.build_target(root / "target", kind="qwen3", seed=7, dtype="bfloat16", tie=variant == "tied", **DIMS)
    if variant == "4bit":
        import mlx_lm
        from mlx_lm.utils import quantize_model, save_config, save_model

        model, _ = mlx_lm.load(str(root / "target"))
        model, qcfg = quantize_model(model, dict(cfg), group_size=64, bits=4)
        save_model(root / "target", model)
        save_config(qcfg, config_path=root / "target" / "config.json")
    dcfg = rp.draft_config_for(cfg, rp.mask_token_id(root / "target"), layers=2, block_size=16)
    rp.build_draft(root / "draft", dcfg, seed=8, dtype=mx.bfloat16)
    return {"target": root / "target", "draft": root / "draft"}


@pytest.fixture(scope="module", params=["untied", "tied", "4bit"])
def forced(request, tmp_path_factory):
    """(pair loaded with the step-rows wiring forced on, a separate vanilla mlx-lm load, variant)."""
    import mlx_lm

    dirs = _build(tmp_path_factory.mktemp(f"step_rows_{request.param}"), request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_rows, "wanted", lambda: True)
        pair = load_pair(str(dirs["target"]), str(dirs["draft"]))
        assert not pair.target.step_rows  # the engine's default: a batched verify
        assert pair.target.use_step_rows(True)
    model, tokenizer = mlx_lm.load(str(dirs["target"]))
    return pair, SimpleNamespace(target=SimpleNamespace(model=model, tokenizer=tokenizer)), request.param


@pytest.fixture
def calls(monkeypatch):
    """How many row-wise calls of each kind ran, and with how many rows each."""
    seen: Counter = Counter()

    def spy(name, fn, rows_of):
        def wrapped(*args, **kwargs):
            seen[name] += 1
            seen[f"{name} rows"] = max(seen[f"{name} rows"], rows_of(*args))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(step_rows, "matmul_rows", spy("matmul", step_rows.matmul_rows, lambda x, w: x.shape[-2]))
    monkeypatch.setattr(step_rows, "matmuls_rows", spy("several", step_rows.matmuls_rows, lambda x, ws: x.shape[-2]))
    monkeypatch.setattr(step_rows, "addmm_rows", spy("addmm", step_rows.addmm_rows, lambda b, x, w: x.shape[-2]))
    monkeypatch.setattr(step_rows, "quantized_rows", spy("quantized", step_rows.quantized_rows,
                                                         lambda x, *a: x.shape[-2]))
    monkeypatch.setattr(step_rows, "quantized_several_rows", spy("several quantized", step_rows.quantized_several_rows,
                                                                 lambda x, *a: x.shape[-2]))
    monkeypatch.setattr(target_module, "step_attention", spy("attention", target_module.step_attention,
                                                             lambda q, *a: q.shape[2]))
    return seen


def linears(model: nn.Module) -> Counter:
    return Counter(type(m).__name__ for _, m in model.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear)))


def test_every_plain_linear_of_the_target_is_swapped_and_the_draft_is_not(forced):
    pair, _, variant = forced
    kinds = linears(pair.target.lm)
    want = "StepRowsQuantizedLinear" if variant == "4bit" else "StepRowsLinear"
    layers = DIMS["layers"]
    # 7 projections a layer, and an untied head
    assert kinds == Counter({want: 7 * layers + (variant != "tied")}), kinds
    assert linears(pair.draft) and not any(name.startswith("StepRows") for name in linears(pair.draft)), linears(pair.draft)


def test_only_a_verify_forward_runs_rows_as_steps(forced, calls):
    pair, _, variant = forced
    target = pair.target
    cache = target.make_cache()
    prompt = mx.array([[5, 9, 14, 3, 22, 7, 8, 30]])
    mx.eval(target.forward(prompt, cache)[0])  # a prefill chunk: mlx-lm's own code
    target.begin_verify(cache)
    mx.eval(target.forward(prompt[:, :1], cache)[0])  # a one-token forward is a decode step already
    assert sum(calls.values()) == 0, calls
    target.begin_verify(cache)
    mx.eval(target.forward(prompt[:, :5], cache)[0])
    kind = "quantized" if variant == "4bit" else "matmul"
    layers = DIMS["layers"]
    # every linear of every layer, the head (tied: the embedding as a linear), every attention;
    # linears that read one input go together (q, k, v; gate, up)
    several = "several quantized" if variant == "4bit" else "several"
    assert calls[kind] == 2 * layers + 1 and calls[f"{kind} rows"] == 5, calls
    assert calls[several] == 2 * layers and calls[f"{several} rows"] == 5, calls
    assert calls["several quantized" if several == "several" else "several"] == 0, calls
    assert calls["attention"] == layers and calls["attention rows"] == 5, calls
    calls.clear()
    mx.eval(target.forward(prompt[:, :5], cache)[0])  # no begin_verify: not a verify
    assert sum(calls.values()) == 0, calls


@pytest.mark.parametrize("block_size", [4, 16])
def test_greedy_with_rows_as_steps_equals_stream_generate(forced, calls, block_size):
    pair, vanilla, _ = forced
    ref, blocks, done = oracle_run(pair, vanilla, PROMPT, N_TOKENS, block_size, seed=block_size)
    assert done.tokens == ref
    accepted = {b.accepted for b in blocks if b.drafted}
    assert 0 in accepted and len(accepted) >= 2, accepted
    assert calls["attention"] > 0


def test_linears_that_read_one_input_go_together_only_for_that_input(calls):
    attention = nn.Module()
    attention.q_proj, attention.k_proj, attention.v_proj = nn.Linear(32, 24, bias=False), nn.Linear(32, 8, bias=False), \
        nn.Linear(32, 8, bias=False)
    assert step_rows.install(attention) == 3
    x, y = mx.random.normal((1, 6, 32)), mx.random.normal((1, 6, 32))
    with step_rows.verifying():
        q, k, v = attention.q_proj(x), attention.k_proj(y), attention.v_proj(x)  # k from another input
    assert calls["several"] == 1 and calls["matmul"] == 1, calls  # q with k and v, then k again for y
    for got, layer, inp in ((q, attention.q_proj, x), (k, attention.k_proj, y), (v, attention.v_proj, x)):
        assert mx.array_equal(got, inp @ layer.weight.T).item()
    assert "_rows_siblings" not in attention.q_proj.parameters()  # not a parameter of the model
    calls.clear()
    attention.q_proj(x), attention.k_proj(x)  # outside a verify: MLX's own products
    assert sum(calls.values()) == 0, calls


def test_quantized_linears_that_read_one_input_go_together_and_keep_their_biases(calls):
    """Qwen2's q/k/v, quantized: one launch for the three products, each adding its own bias."""
    attention = nn.Module()
    attention.q_proj, attention.k_proj, attention.v_proj = (nn.QuantizedLinear(128, n, bias=True, group_size=64, bits=4)
                                                            for n in (64, 32, 32))
    for layer in (attention.q_proj, attention.k_proj, attention.v_proj):
        layer.bias = mx.random.normal(layer.bias.shape)
    attention.o_proj = nn.QuantizedLinear(128, 64, bias=False, group_size=32, bits=8)  # not in a group
    assert step_rows.install(attention) == 4
    x = mx.random.normal((1, 6, 128))
    want = [nn.QuantizedLinear.__call__(m, x) for m in (attention.q_proj, attention.k_proj, attention.v_proj)]
    with step_rows.verifying():
        got = [attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)]
        attention.o_proj(x)
    assert calls["several quantized"] == 1 and calls["quantized"] == 1, calls  # the group, then o alone
    assert all(mx.array_equal(g, w).item() for g, w in zip(got, want))
    # a group of another width or group size is not linked
    other = nn.Module()
    other.gate_proj = nn.QuantizedLinear(128, 64, group_size=64, bits=4)
    other.up_proj = nn.QuantizedLinear(128, 64, group_size=64, bits=8)
    step_rows.install(other)
    assert "_rows_siblings" not in other.gate_proj.__dict__


def test_linear_with_a_bias_runs_one_addmm_a_row(calls):
    """Biased linears (Qwen2's q/k/v, gpt-oss): MLX's one-row addmm is cuBLAS's, so one call a row."""
    layer = nn.Linear(32, 24, bias=True)
    layer.__class__ = step_rows.StepRowsLinear
    x = mx.random.normal((1, 6, 32))
    with step_rows.verifying():
        got = layer(x)
    rows = mx.concatenate([nn.Linear.__call__(layer, x[:, i : i + 1]) for i in range(6)], axis=1)
    assert calls["addmm"] == 1 and calls["addmm rows"] == 6
    assert mx.array_equal(got, rows).item()


def test_by_default_and_off_cuda_the_target_is_mlx_lm_s_own(qwen3_pair):
    assert not step_rows.wanted()
    assert qwen3_pair.target.step_rows is False
    assert not any(name.startswith("StepRows") for name in linears(qwen3_pair.target.lm))
    assert qwen3_pair.target.use_step_rows(True) is False  # nothing to do off MLX CUDA


def test_a_short_prefill_chunk_is_mlx_lm_s_attention_and_a_verify_the_kernel(qwen3_dirs, monkeypatch):
    """With the block kernels on, a prefill chunk of up to 16 tokens (a short prompt, a short next
    turn) once ran the verify's attention kernel: its rounding changed the cache, and a GPU reply
    parted from mlx-lm's whatever the verify did."""
    monkeypatch.setenv("DFLASH_TUI_KERNELS", "1")
    pair = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
    target = pair.target
    assert target.attention_mode == "kernel"
    seen = []
    real = target_module.multi_query_attention
    monkeypatch.setattr(target_module, "multi_query_attention", lambda *a, **k: seen.append(1) or real(*a, **k))
    cache = target.make_cache()
    mx.eval(target.forward(mx.array([[5, 9, 14, 3, 22, 7, 8, 30, 4, 2]]), cache, last_only=True)[0])
    assert seen == []
    target.begin_verify(cache)
    mx.eval(target.forward(mx.array([[5, 9, 14, 3]]), cache)[0])
    assert len(seen) == target.num_layers


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A Qwen3.5-format hybrid pair (Gated DeltaNet + attention), loaded with the block kernels on
    (their references here) and the step-rows wiring forced on; and a vanilla mlx-lm load."""
    import mlx_lm

    root = tmp_path_factory.mktemp("step_rows_hybrid")
    cfg = rp.build_target(root / "target", kind="qwen3_5", seed=9, dtype="bfloat16", hidden=128, layers=4, heads=4,
                          kv_heads=2, head_dim=32, intermediate=256, linear_head_dim=32, full_attention_interval=2,
                          tie=False)
    dcfg = rp.draft_config_for(cfg, rp.mask_token_id(root / "target"), layers=2, block_size=16)
    rp.build_draft(root / "draft", dcfg, seed=10, dtype=mx.bfloat16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_TUI_KERNELS", "1")
        mp.setattr(step_rows, "wanted", lambda: True)
        pair = load_pair(str(root / "target"), str(root / "draft"))
    model, tokenizer = mlx_lm.load(str(root / "target"))
    return pair, SimpleNamespace(target=SimpleNamespace(model=model, tokenizer=tokenizer))


@pytest.mark.parametrize("as_steps", [True, False])
def test_a_hybrid_verify_as_steps_runs_mlx_lm_s_recurrence_and_windowed_convolutions(hybrid, monkeypatch, as_steps):
    """The Gated DeltaNet's causal conv1d gets one K-row window a call (a decode step's call) and
    the recurrence mlx-lm's per-step ops, not the engine's one-launch kernel; batched, the kernel."""
    from dflash_tui.engine import gdn_tape

    monkeypatch.setenv("DFLASH_TUI_KERNELS", "1")
    monkeypatch.setattr(step_rows, "wanted", lambda: True)
    pair, vanilla = hybrid
    assert pair.target.use_step_rows(as_steps) is as_steps
    seen: Counter = Counter()
    kernel = gdn_tape._kernel_update
    monkeypatch.setattr(gdn_tape, "_kernel_update", lambda bound: seen.update(["kernel"]) or kernel(bound))
    conv = nn.Conv1d.__call__
    monkeypatch.setattr(nn.Conv1d, "__call__", lambda self, x: seen.update([f"conv {x.shape[1]}"]) or conv(self, x))
    target = pair.target
    cache = target.make_cache()
    mx.eval(target.forward(mx.array([[5, 9, 14, 3, 22, 7, 8, 30]]), cache, last_only=True)[0])
    seen.clear()
    target.begin_verify(cache)
    mx.eval(target.forward(mx.array([[5, 9, 14, 3, 22]]), cache)[0])
    linear_layers = len(target.linear_ids)
    k = target.layers[target.linear_ids[0]].linear_attn.conv1d.weight.shape[1]
    if as_steps:  # 5 windows of K rows a layer, no kernel
        assert seen == Counter({f"conv {k}": 5 * linear_layers}), seen
    else:  # one call over the K-1 cached rows and the 5 new ones, and the kernel
        assert seen == Counter({f"conv {k - 1 + 5}": linear_layers, "kernel": linear_layers}), seen
    target.rollback(cache, 2, 5)
    target.use_step_rows(False)


def test_a_hybrid_with_rows_as_steps_equals_stream_generate(hybrid, monkeypatch):
    monkeypatch.setenv("DFLASH_TUI_KERNELS", "1")
    monkeypatch.setattr(step_rows, "wanted", lambda: True)
    pair, vanilla = hybrid
    assert pair.target.use_step_rows(True)
    try:
        ref, blocks, done = oracle_run(pair, vanilla, PROMPT, N_TOKENS, 8, seed=3)
    finally:
        pair.target.use_step_rows(False)
    assert done.tokens == ref
    accepted = {b.accepted for b in blocks if b.drafted}
    assert 0 in accepted and len(accepted) >= 2, accepted
