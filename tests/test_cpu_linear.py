"""Matmuls on numpy's BLAS (engine/cpu_linear.py): the same numbers as MLX's own ops, rows
that do not depend on how many rows a forward has, greedy DFlash output equal to
`mlx_lm.stream_generate` on the swapped model, and a swap that stays on its own instances."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from conftest import _build_pair, oracle_proposer, reference_tokens
from dflash_tui.engine import cpu_linear
from dflash_tui.engine.cpu_draft import HostKVCache
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block
from dflash_tui.engine.loading import load_pair

PROMPT = "Write a function that adds two numbers and explain it. " * 4


def _tied_dirs(root):
    from dflash_tui import random_pair as rp

    cfg = rp.build_target(root / "target", kind="qwen3", seed=5, tie=True)
    rp.build_draft(root / "draft", rp.draft_config_for(cfg, rp.mask_token_id(root / "target"), layers=2), seed=6)
    return {"target": root / "target", "draft": root / "draft"}


@pytest.fixture(scope="module")
def numpy_pair(qwen3_dirs):
    """The shared qwen3 fixture (untied head), numpy path forced on."""
    return load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]), cpu_matmul="numpy")


@pytest.fixture(scope="module")
def tied_pair(tmp_path_factory):
    dirs = _tied_dirs(tmp_path_factory.mktemp("qwen3_tied"))
    return load_pair(str(dirs["target"]), str(dirs["draft"]), cpu_matmul="numpy")


@pytest.fixture(scope="module")
def hybrid_pair(tmp_path_factory):
    dirs = _build_pair(tmp_path_factory.mktemp("qwen3_5_np"), "qwen3_5", seed=2, linear_head_dim=32)
    return load_pair(str(dirs["target"]), str(dirs["draft"]), cpu_matmul="numpy")


def _linear(k: int, n: int, bias: bool, dtype=mx.float32, seed: int = 0) -> nn.Linear:
    mx.random.seed(seed)
    layer = nn.Linear(k, n, bias=bias)
    layer.set_dtype(dtype)
    mx.eval(layer.parameters())
    return layer


# -- the products ------------------------------------------------------------------------

@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_swapped_linear_equals_mlx_in_fp32(exact, bias):
    ref = _linear(96, 200, bias)
    ours = _linear(96, 200, bias)
    assert cpu_linear.use_numpy(ours, exact=exact) == 1 and type(ours) is cpu_linear.NumpyLinear
    for rows in (1, 3, 7, 16):
        x = mx.random.normal((1, rows, 96))
        assert mx.allclose(ours(x), ref(x), atol=1e-5, rtol=1e-5).item(), rows


def test_swapped_linear_keeps_the_dtype_and_rounds_like_one_bf16_product():
    ref = _linear(64, 128, False, dtype=mx.bfloat16)
    ours = _linear(64, 128, False, dtype=mx.bfloat16)
    cpu_linear.use_numpy(ours)
    x = mx.random.normal((2, 5, 64)).astype(mx.bfloat16)
    got, want = ours(x), ref(x)
    assert got.dtype == mx.bfloat16 and got.shape == want.shape
    # fp32 accumulation rounded once to bf16: within a bf16 step of MLX's own product
    assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), rtol=1e-2, atol=1e-2).item()


def test_exact_rows_do_not_depend_on_the_row_count():
    layer = _linear(384, 1024, True)
    head = nn.Embedding(3000, 384)  # 1536 KB slabs of 1024 rows: this head is cut in three
    mx.eval(head.parameters())
    cpu_linear.use_numpy(layer)
    cpu_linear.use_numpy(head)
    assert len(cpu_linear._weight(head).slabs) == 3
    x = mx.random.normal((1, 16, 384))
    for fn in (layer, head.as_linear):
        block = np.array(fn(x))
        for i in range(16):
            assert np.array_equal(np.array(fn(x[:, i : i + 1]))[0, 0], block[0, i]), i


def test_a_converted_weight_gives_way_to_transposed_slabs_whose_rows_do_not_depend_on_the_row_count():
    layer = _linear(384, 3000, False, dtype=mx.bfloat16)  # 1536 KB slabs of 1024 output columns: three
    cpu_linear.use_numpy(layer)
    cpu_linear.prepare(layer)
    w = cpu_linear._weight(layer)
    assert w.transposed and w._w is None  # one fp32 copy, in the exact flavour's layout
    assert [s.shape for s in w.slabs] == [(384, 1024), (384, 1024), (384, 952)]
    x = mx.random.normal((1, 16, 384)).astype(mx.bfloat16)
    block = np.array(layer(x).astype(mx.float32))
    for i in range(16):
        assert np.array_equal(np.array(layer(x[:, i : i + 1]).astype(mx.float32))[0, 0], block[0, i]), i
    want = (x.astype(mx.float32) @ layer.weight.astype(mx.float32).T).astype(mx.bfloat16)
    assert mx.allclose(layer(x).astype(mx.float32), want.astype(mx.float32), rtol=1e-2, atol=1e-2).item()
    assert np.array_equal(w.w, np.array(layer.weight.astype(mx.float32)))  # rebuilt from the slabs
    assert w._w is None  # ... and not kept


def test_a_head_the_draft_reads_out_through_keeps_a_copy_in_each_layout():
    tied = nn.Embedding(3000, 384)
    tied.weight = tied.weight.astype(mx.bfloat16)
    assert cpu_linear.extra_bytes(tied) == 2 * 3000 * 384 * 4  # counted before the swap, both copies
    cpu_linear.use_numpy(tied)
    cpu_linear.prepare(tied)
    cpu_linear.prepare_read_out(tied)
    w = cpu_linear._weight(tied)
    want = np.array(tied.weight.astype(mx.float32))
    assert w.transposed and w._w is None and w.stack.shape[1] == 384
    n = w.stack.shape[2]
    assert n * 384 * cpu_linear.FAST_ROWS < cpu_linear.SMALL_PRODUCT and w.stack.shape[0] * n >= 3000
    ids = [0, 5, 1023, 1024, 2999]
    assert np.array_equal(w.rows(ids), want[ids])  # the lookup reads the fast layout back exactly
    x = np.random.default_rng(0).standard_normal((5, 384)).astype(np.float32)
    assert np.allclose(w.fast(x), w.exact(x), atol=1e-4) and w.fast(x).shape == (5, 3000)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_equals_the_fused_kernel(causal):
    mx.random.seed(1)
    q, k, v = mx.random.normal((1, 8, 6, 16)), mx.random.normal((1, 2, 40, 16)), mx.random.normal((1, 2, 40, 16))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal" if causal else None)
    for exact in (True, False):
        got = cpu_linear.attention(q, k, v, 0.25, causal=causal, exact=exact)
        assert mx.allclose(got, want, atol=1e-5).item(), exact


def test_exact_attention_rows_equal_lone_queries():
    """Query i of a causal block over S keys is, bit for bit, one query over the first S-L+i+1."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 7, 32)).astype(np.float32)
    k = rng.standard_normal((1, 2, 50, 32)).astype(np.float32)
    v = rng.standard_normal((1, 2, 50, 32)).astype(np.float32)
    block = cpu_linear.attend(q, k, v, 0.2, causal=True, exact=True)
    for i in range(7):
        n = 50 - 7 + i + 1
        lone = cpu_linear.attend(q[:, :, i : i + 1], k[:, :, :n], v[:, :, :n], 0.2, causal=True, exact=True)
        assert np.array_equal(lone[:, :, 0], block[:, :, i]), i


def test_whole_forward_equals_mlx(qwen3_dirs, numpy_pair):
    plain = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]), cpu_matmul="mlx")
    assert not cpu_linear.is_numpy(plain.target.model)
    ids = mx.array([[5, 6, 7, 8, 9, 10, 11, 12]])
    want, _ = plain.target.forward(ids, plain.target.make_cache())
    got, _ = numpy_pair.target.forward(ids, numpy_pair.target.make_cache())
    assert mx.allclose(got, want, atol=1e-3, rtol=1e-3).item()


@pytest.mark.parametrize("which", ["untied", "tied", "hybrid"])
def test_verify_rows_equal_the_single_steps(which, request):
    """After a context longer than numpy's pairwise-sum block (128), a 9-token forward's logits
    and features are, bit for bit, those of 9 single-token steps."""
    pair = request.getfixturevalue({"untied": "numpy_pair", "tied": "tied_pair", "hybrid": "hybrid_pair"}[which])
    target = pair.target
    context = mx.array([[(7 * i) % (target.vocab_size - 1) + 1 for i in range(150)]])
    block = mx.array([[3, 14, 15, 92, 65, 35, 89, 79, 32]])
    caches = []
    for _ in range(2):
        cache = target.make_cache()
        mx.eval(target.forward(context, cache)[0])
        caches.append(cache)
    # the draft reads out through the same head right before a verify: that read-out may be
    # approximate, the verify's may not
    hidden = pair.draft(target.embed(block), None, pair.draft.make_cache())
    mx.eval(target.head(hidden[:, 1:]))
    logits, feats = target.forward(block, caches[0])
    for i in range(block.shape[1]):
        step, step_feats = target.forward(block[:, i : i + 1], caches[1])
        assert np.array_equal(np.array(step[0, 0]), np.array(logits[0, i])), i
        assert np.array_equal(np.array(step_feats[0, 0]), np.array(feats[0, i])), i


def test_numpy_draft_forward_equals_the_mlx_one(numpy_pair):
    target, draft = numpy_pair.target, numpy_pair.draft
    assert type(draft).__name__ == "NumpyDFlashDraft" and draft.fc.weight.dtype == mx.float32
    base = type(draft)._dflash_numpy_base
    _, feats = target.forward(mx.array([[3, 4, 5, 6, 7, 8, 9]]), target.make_cache())
    block = target.embed(mx.array([[9] + [draft.config.mask_token_id] * 7]))
    outs, caches = [], []
    for call, append, make in ((draft.__call__, draft.append_context, draft.make_cache),
                               (lambda *a: base.__call__(draft, *a), lambda *a: base.append_context(draft, *a),
                                lambda: base.make_cache(draft))):
        cache = make()
        append(feats[:, :4], cache)
        outs.append(call(block, feats[:, 4:], cache))
        caches.append(cache)
    assert all(isinstance(c, HostKVCache) for c in caches[0]) and draft.cache_arrays(caches[0]) == []
    assert mx.allclose(outs[0], outs[1], atol=1e-4).item()
    for a, b in zip(*caches):
        assert a.offset == b.offset == 4 + 3 + 8
        assert np.allclose(a.host_keys[..., : a.offset, :], np.array(b.keys[..., : b.offset, :]), atol=1e-4)
        assert np.allclose(a.host_values[..., : a.offset, :], np.array(b.values[..., : b.offset, :]), atol=1e-4)
    # a trim drops the tail; what is written next lands after the kept part
    cache = caches[0]
    kept = cache[0].host_keys[..., :5, :].copy()
    assert cache[0].trim(10) == 10 and cache[0].offset == 5
    draft.append_context(feats[:, 4:6], cache)
    assert cache[0].offset == 7 and np.array_equal(cache[0].host_keys[..., :5, :], kept)


def test_a_host_draft_step_equals_the_mlx_one(tied_pair, numpy_pair, monkeypatch):
    """With a tied head the whole draft step (lookup, forward, read-out) runs in numpy and
    gives the logits the MLX-side step gives; an untied head keeps the MLX-side step."""
    from dflash_tui.engine import cpu_draft, speculative
    from dflash_tui.engine.state import DecodeState

    assert cpu_draft.host_parts(numpy_pair.target, numpy_pair.draft, numpy_pair.draft.make_cache()) is None
    target, draft = tied_pair.target, tied_pair.draft
    results = []
    for host in (True, False):
        if not host:
            monkeypatch.setattr(cpu_draft, "host_parts", lambda *a: None)
        state = DecodeState(target, draft)
        state.prefill([5, 6, 7, 8, 9, 10])
        _, feats = target.forward(mx.array([[11, 12, 13]]), state.target_cache)
        state.tokens += [11, 12, 13]
        state.pending.append(feats)
        logits = speculative.draft_logits(state, 14, 6)
        assert isinstance(logits, np.ndarray) == host
        results.append((np.array(logits), state.draft_len, [c.offset for c in state.draft_cache]))
    (a, len_a, off_a), (b, len_b, off_b) = results
    assert a.shape == b.shape == (5, target.vocab_size)
    assert np.allclose(a, b, atol=1e-3) and np.array_equal(a.argmax(-1), b.argmax(-1))
    assert len_a == len_b == 9 and off_a == off_b == [9] * len(draft.layers)  # the block's own K/V is not kept


def test_host_array_widens_bf16_on_the_host_exactly():
    a = mx.random.normal((1, 7, 48)).astype(mx.bfloat16)
    mx.eval(a)
    h = cpu_linear.host_array(a)
    assert h.dtype == np.float32 and h.shape == (1, 7, 48)
    assert np.array_equal(h, np.array(a.astype(mx.float32)))
    f = mx.random.normal((2, 3))
    assert np.array_equal(cpu_linear.host_array(f), np.array(f))


def test_a_host_draft_takes_the_verify_features_as_host_rows(tied_pair):
    """The loop hands a host-side draft its features as host rows (sliced on the host); a
    rollback to a shared prefix cuts them like MLX's."""
    from dflash_tui.engine.speculative import dflash_cycles
    from dflash_tui.engine.state import DecodeState

    state = DecodeState(tied_pair.target, tied_pair.draft)
    logits, _ = state.prefill([5, 6, 7, 8, 9, 10, 11, 12])
    first = int(np.array(logits).argmax())
    cycles = dflash_cycles(state, first, 4, lambda: 64)
    next(cycles)
    assert state.pending and all(isinstance(p, np.ndarray) for p in state.pending)
    held = len(state.tokens)
    next(cycles)  # the second cycle's draft step took the first cycle's rows
    assert state.draft_len == held
    cycles.close()
    state.pending.append(tied_pair.target.forward(mx.array([[3, 4]]), state.target_cache)[1])  # an MLX piece too
    state.tokens += [3, 4]
    n_pending = sum(p.shape[1] for p in state.pending)
    assert len(state.tokens) == state.draft_len + n_pending
    want = len(state.tokens) - 1
    assert state.truncate(want) == want == len(state.tokens)  # one row off the mixed pieces
    assert len(state.pending) == 1 and isinstance(state.pending[0], np.ndarray)
    assert state.pending[0].shape[1] == n_pending - 1


def test_host_kv_cache_grows_and_keeps_what_it_holds():
    cache = HostKVCache()
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((1, 2, n, 4)).astype(np.float32) for n in (3, 250, 9)]
    for i, p in enumerate(parts):
        keys, values = cache.append(p, -p)
        assert keys.shape[2] == cache.offset == sum(q.shape[2] for q in parts[: i + 1])
    whole = np.concatenate(parts, axis=2)
    assert cache.host_keys.shape[2] == 2 * HostKVCache.step  # grew once, in a step
    assert np.array_equal(keys, whole) and np.array_equal(values, -whole)


# -- the whole loop ------------------------------------------------------------------------

def _oracle_run(pair, block_size, seed, n=120):
    conv = Conversation(pair)
    conv.messages.append({"role": "user", "content": PROMPT})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(pair, ids, n)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.15, seed=seed, vocab=pair.target.vocab_size)
    events = list(conv.generate(PROMPT, GenerationSettings(max_tokens=n, block_size=block_size, prefill_chunk=64)))
    return ref, [e for e in events if isinstance(e, Block)], events[-1]


@pytest.mark.parametrize("which", ["untied", "tied", "hybrid"])
@pytest.mark.parametrize("block_size", [2, 5, 16])
def test_greedy_dflash_equals_stream_generate(which, block_size, request):
    pair = request.getfixturevalue({"untied": "numpy_pair", "tied": "tied_pair", "hybrid": "hybrid_pair"}[which])
    assert cpu_linear.is_numpy(pair.target.model) and cpu_linear.is_numpy(pair.draft)
    ref, blocks, done = _oracle_run(pair, block_size, seed=block_size)
    assert done.type == "done" and done.tokens == ref
    if block_size > 2:  # partial accepts of several depths went through the exact verify
        assert len({b.accepted for b in blocks if b.drafted}) >= 3


@pytest.mark.parametrize("block_size", [4, "auto"])
def test_real_draft_equals_stream_generate(tied_pair, block_size):
    conv = Conversation(tied_pair)
    done = list(conv.generate("def add(a, b):", GenerationSettings(max_tokens=80, block_size=block_size)))[-1]
    assert done.tokens == reference_tokens(tied_pair, conv.prompt_tokens(conv.messages[:-1]), 80)


# -- the swap --------------------------------------------------------------------------------

def test_the_swap_is_per_instance(qwen3_dirs, numpy_pair):
    import mlx_lm

    fresh, tokenizer = mlx_lm.load(str(qwen3_dirs["target"]))
    assert nn.Linear.__call__ is not cpu_linear.NumpyLinear.__call__
    assert all(type(m) is not cpu_linear.NumpyLinear for _, m in fresh.named_modules())
    attn = fresh.model.layers[0].self_attn
    assert type(attn).__name__ == "Attention" and type(numpy_pair.target.layers[0].self_attn).__name__ == "NumpyAttention"
    ids = [1, 2, 3, 4]
    want = [r.token for r in mlx_lm.stream_generate(fresh, tokenizer, ids, max_tokens=24)]
    got = [r.token for r in mlx_lm.stream_generate(numpy_pair.target.model, tokenizer, ids, max_tokens=24)]
    assert got == want  # the same model, on other kernels
    assert all(type(m) is not cpu_linear.NumpyLinear for _, m in fresh.named_modules())


def test_release_restores_the_classes():
    model = nn.Sequential(_linear(8, 8, False), _linear(8, 4, True))
    x = mx.random.normal((3, 8))
    want = model(x)
    assert cpu_linear.use_numpy(model) == 2
    cpu_linear.release(model)
    assert all(type(m) is nn.Linear and "_dflash_np" not in m.__dict__ for m in model.layers)
    assert mx.array_equal(model(x), want).item()


def test_a_mode_chosen_on_purpose_replaces_the_numpy_attention(qwen3_dirs):
    pair = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]), cpu_matmul="numpy")
    assert pair.target.use_attention("plain") == pair.target.num_layers
    assert type(pair.target.layers[0].self_attn).__name__ == "PlainSDPAAttention"
    pair.target.use_attention("fused")
    assert type(pair.target.layers[0].self_attn).__name__ == "Attention"


def test_modes_and_the_memory_gate(qwen3_dirs, monkeypatch):
    layer = _linear(16, 16, False, dtype=mx.bfloat16)
    assert cpu_linear.extra_bytes(layer) == 16 * 16 * 4
    assert cpu_linear.extra_bytes(_linear(16, 16, False)) == 0  # fp32 weights are used in place
    assert cpu_linear.resolve_mode("off") == "mlx" and cpu_linear.resolve_mode("on") == "numpy"
    monkeypatch.setenv(cpu_linear.ENV, "mlx")
    assert cpu_linear.resolve_mode() == "mlx" and not cpu_linear.wanted(None, layer)
    monkeypatch.setenv(cpu_linear.ENV, "sometimes")
    with pytest.raises(ValueError, match=cpu_linear.ENV):
        cpu_linear.resolve_mode()
    monkeypatch.delenv(cpu_linear.ENV)
    if cpu_linear.on_cpu_backend():
        assert cpu_linear.wanted("auto", layer) and cpu_linear.wanted("numpy", layer)
        monkeypatch.setattr(cpu_linear, "MEMORY_SHARE", 0.0)  # nothing fits: auto stays on MLX
        assert not cpu_linear.wanted("auto", layer) and cpu_linear.wanted("numpy", layer)
        pair = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
        assert pair.target.model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
        assert cpu_linear.describe(pair.target.model) == "numpy (%s)" % cpu_linear.blas_name()  # fp32: no copies


def test_bench_records_the_matmul_path(numpy_pair):
    from dflash_tui.bench.compare import bench, format_table

    prompt = list(numpy_pair.target.tokenizer.encode("def f(x):"))
    report = bench(numpy_pair, [prompt], max_tokens=12, runs=1, cooldown=0.0, block_size=4)
    assert report["matmul"]["target"].startswith("numpy") and report["matmul"]["draft"].startswith("numpy")
    assert "matmuls: target numpy" in format_table(report)
    assert report["summary"]["all_identical"]
