"""The block kernels' wiring and the pipelined cycle, on this machine's CPU.

The CUDA kernels themselves run only on MLX's CUDA backend (checked there by
`python -m dflash_tui.bench.block_kernels`). Here their pure-MLX references
stand in (DFLASH_TUI_KERNELS=1 forces the "kernel" attention mode and the
one-launch Gated DeltaNet path; the GPU's pipelining is forced on by patching the
engine's device checks), so these tests check what the engine does
with them: the same arithmetic as MLX's own ops, the engine routing its few-token
forwards through them (and plain mlx-lm calls not), and greedy output still equal
to `mlx_lm.stream_generate` with pipelining forced on. The kernel sources are
compiled with nvcc where it exists.
"""

from __future__ import annotations


import mlx.core as mx
import pytest
import cuda_compile as cc
from conftest import _build_pair, oracle_run, reference_tokens
from cuda_compile import needs_nvcc
from mlx_lm.models import gated_delta as mlx_gd

from dflash_tui.engine import cuda_allq_attention as cqa
from dflash_tui.engine import cuda_gated_delta as gd
from dflash_tui.engine import cuda_kernels as ck
from dflash_tui.engine import draft as draft_mod
from dflash_tui.engine import gdn_tape
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block
from dflash_tui.engine.loading import load_pair

PROMPT = "def push(self, item): self.items.append(item) " * 8


@pytest.fixture()
def forced(monkeypatch):
    """Kernels (their references), in-forward pipelining and the lazy draft hand-off, all on."""
    from dflash_tui.engine import speculative, target

    monkeypatch.setenv("DFLASH_TUI_KERNELS", "1")
    monkeypatch.setattr(target, "pipelining_wanted", lambda: True)  # what a GPU gets
    monkeypatch.setattr(speculative, "lazy_draft_wanted", lambda: True)
    calls = {"attention": 0, "gated_delta": 0}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(draft_mod, "block_attention", counting("attention", draft_mod.block_attention))
    monkeypatch.setattr(gdn_tape, "gated_delta_steps", counting("gated_delta", gdn_tape.gated_delta_steps))
    return calls


@pytest.fixture(scope="module")
def attention_dirs(tmp_path_factory):
    # head_dim 32: the kernel's width multiple; 8 layers: two pipelined groups of 4
    return _build_pair(tmp_path_factory.mktemp("qwen3_hd32"), "qwen3", seed=3, head_dim=32, layers=8)


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    return _build_pair(tmp_path_factory.mktemp("qwen3_5_hd32"), "qwen3_5", seed=4, head_dim=32, linear_head_dim=32)


# -- the references equal MLX's own ops ----------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [1, 5, 16])
def test_block_attention_equals_the_fused_kernel_on_cache_views(causal, L):
    H, Hkv, D, S, cap = 8, 2, 32, 40, 64
    mx.random.seed(L)
    q = mx.random.normal((1, H, L, D))
    buf_k, buf_v = mx.random.normal((1, Hkv, cap, D)), mx.random.normal((1, Hkv, cap, D))
    k, v = buf_k[:, :, :S], buf_v[:, :, :S]  # what a KVCache hands out: views of a longer buffer
    assert ck.block_attention_fits(q, k, v)
    ours = ck.block_attention(q, k, v, 0.3, causal)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal" if causal else None)
    assert mx.allclose(ours, ref, atol=1e-5).item()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("S", [33, 64, 70])
def test_split_attention_equals_the_fused_kernel(monkeypatch, causal, S):
    # key ranges of 16: the last range partly filled (S = 70), or past every query's last key
    # under the causal mask (the tail ranges of queries early in the block)
    monkeypatch.setattr(ck, "SPLIT_FROM_KEYS", 32)
    monkeypatch.setattr(ck, "SPLIT_CHUNK", 16)
    H, Hkv, D, L = 8, 2, 32, 16
    mx.random.seed(S)
    q = mx.random.normal((1, H, L, D)) * 2
    k, v = mx.random.normal((1, Hkv, 80, D))[:, :, :S], mx.random.normal((1, Hkv, 80, D))[:, :, :S]
    assert ck.attention_splits(S, D) == -(-S // 16) > 1
    ours = ck.block_attention(q, k, v, 0.3, causal)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal" if causal else None)
    assert mx.allclose(ours, ref, atol=1e-5).item()
    assert mx.allclose(ours, ck._attention_reference(q, k, v, 0.3, causal), atol=1e-5).item()


def test_short_caches_and_wide_heads_are_not_split():
    assert ck.attention_splits(ck.SPLIT_FROM_KEYS - 1, 128) == 1
    assert ck.attention_splits(ck.SPLIT_FROM_KEYS, 128) == -(-ck.SPLIT_FROM_KEYS // ck.SPLIT_CHUNK) > 1
    assert ck.attention_splits(16384, 256) == 1  # measured no faster for 256-wide heads


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("S,chunk,tile", [(33, 16, 16), (70, 32, 16), (100, 64, 32), (16, 64, 32)])
def test_allq_attention_reference_equals_the_fused_kernel(causal, S, chunk, tile):
    # key ranges and tiles partly filled, ranges past some queries' last key (causal), a cache
    # no longer than the block (S = L)
    H, Hkv, D, L = 8, 2, 64, 16
    mx.random.seed(S + chunk)
    q = mx.random.normal((1, H, L, D)) * 2
    k, v = mx.random.normal((1, Hkv, 128, D))[:, :, :S], mx.random.normal((1, Hkv, 128, D))[:, :, :S]
    ours = cqa.allq_attention_reference(q, k, v, 0.3, causal, chunk, tile)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal" if causal else None)
    assert ours.shape == ref.shape
    assert mx.allclose(ours, ref, atol=1e-5).item()
    # in bf16 the weights are rounded to 16 bits for the tensor cores: within bf16 rounding of the
    # float32 result
    qb, kb, vb = q.astype(mx.bfloat16), k.astype(mx.bfloat16), v.astype(mx.bfloat16)
    rounded = cqa.allq_attention_reference(qb, kb, vb, 0.3, causal, chunk, tile)
    assert rounded.dtype == mx.bfloat16
    exact = mx.fast.scaled_dot_product_attention(qb.astype(mx.float32), kb.astype(mx.float32), vb.astype(mx.float32),
                                                 scale=0.3, mask="causal" if causal else None)
    assert mx.allclose(rounded.astype(mx.float32), exact, atol=2e-2, rtol=2e-2).item()


def test_allq_path_is_chosen_by_keys_rows_and_fit(monkeypatch):
    monkeypatch.setattr(ck, "ALLQ_FROM_KEYS", 2048)
    assert ck.attention_kernel(4096, 128, 16, 4) == "allq"
    assert ck.attention_kernel(4096, 256, 16, 4) == "allq" and ck.allq_tile(64, 256) == 16  # 32 keys do not fit
    assert ck.attention_kernel(2047, 128, 16, 4) == "split"  # below the threshold: the split kernel
    assert ck.attention_kernel(4096, 128, 2, 4) == "split"  # too few query rows to share a key
    assert ck.attention_kernel(4096, 256, 16, 8) == "one_block"  # 128 rows of 256 do not fit a block
    assert ck.attention_kernel(512, 128, 16, 4) == "one_block"
    assert not cqa.allq_fits(64, 96, 16, 256)  # head widths 64, 128, 256 only
    assert not cqa.allq_fits(64, 128, 32, 80)  # ranges of whole tiles
    assert cqa.allq_shared_bytes(64, 128, 32) <= cqa.SHARED_LIMIT


@pytest.mark.parametrize("causal", [True, False])
def test_block_attention_takes_the_allq_path(monkeypatch, causal):
    monkeypatch.setattr(ck, "ALLQ_FROM_KEYS", 32)
    monkeypatch.setattr(ck, "ALLQ_CHUNK", 32)
    seen = []
    monkeypatch.setattr(ck, "_allq_attention_reference",
                        lambda *a, _ref=ck._allq_attention_reference: seen.append(a[-2:]) or _ref(*a))
    H, Hkv, D, L, S = 8, 2, 64, 8, 90
    mx.random.seed(7)
    q = mx.random.normal((1, H, L, D))
    k, v = mx.random.normal((1, Hkv, 96, D))[:, :, :S], mx.random.normal((1, Hkv, 96, D))[:, :, :S]
    ours = ck.block_attention(q, k, v, 0.125, causal)
    assert seen == [(32, ck.ALLQ_TILE)]
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal" if causal else None)
    assert mx.allclose(ours, ref, atol=1e-5).item()  # float32 q: the weights' rounding changes nothing


def test_block_attention_refuses_what_it_cannot_take():
    q = mx.zeros((1, 8, 4, 32))
    k = mx.zeros((1, 2, 40, 32))
    assert not ck.block_attention_fits(mx.zeros((1, 8, 17, 32)), k, k)  # more queries than a block
    assert not ck.block_attention_fits(mx.zeros((1, 8, 4, 16)), mx.zeros((1, 2, 40, 16)), mx.zeros((1, 2, 40, 16)))
    assert not ck.block_attention_fits(mx.zeros((2, 8, 4, 32)), mx.zeros((2, 2, 40, 32)), mx.zeros((2, 2, 40, 32)))
    assert not ck.block_attention_fits(q, k.astype(mx.float16), k)
    assert not ck.block_attention_fits(mx.zeros((1, 6, 4, 32)), mx.zeros((1, 4, 40, 32)), mx.zeros((1, 4, 40, 32)))
    assert ck.block_attention_fits(q, k, k)


def test_gated_delta_steps_equal_mlx_lm_step_by_step():
    B, T, Hk, Hv, D = 1, 6, 2, 4, 32
    mx.random.seed(0)
    q, k = mx.random.normal((B, T, Hk, D)) * 0.2, mx.random.normal((B, T, Hk, D)) * 0.2
    v = mx.random.normal((B, T, Hv, D))
    a, b = mx.random.normal((B, T, Hv)), mx.random.normal((B, T, Hv))
    A_log, dt_bias = mx.random.normal((Hv,)), mx.random.normal((Hv,))
    state = mx.random.normal((B, Hv, D, D)) * 0.1
    y_ref, s_ref = mlx_gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, use_kernel=False)
    g, beta = mlx_gd.compute_g(A_log, a, dt_bias), mx.sigmoid(b)
    assert gd.gated_delta_fits(q, v, g, state, None)
    y, states = gd.gated_delta_steps(q, k, v, g, beta, state)
    assert y.dtype == y_ref.dtype
    assert mx.allclose(y, y_ref, atol=1e-5).item()
    assert mx.allclose(states[-1], s_ref, atol=1e-5).item()
    for t in (1, 3):  # the state after t steps is what mlx-lm leaves after the first t tokens
        _, s_t = mlx_gd.gated_delta_update(q[:, :t], k[:, :t], v[:, :t], a[:, :t], b[:, :t], A_log, dt_bias, state,
                                           use_kernel=False)
        assert mx.allclose(states[t - 1], s_t, atol=1e-5).item()
    assert not gd.gated_delta_fits(q, v, g, state, mx.ones((B, T), mx.bool_))  # masks go to mlx-lm's loop


# -- the engine routes its cycles through them, and stays exact ------------------------

def oracle_generate(pair, block_size: int, max_tokens: int, seed: int):
    return oracle_run(pair, pair, PROMPT, max_tokens, block_size, seed, error_rate=0.2)


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_kernel_mode_and_pipelining_match_stream_generate(attention_dirs, forced, block_size):
    pair = load_pair(str(attention_dirs["target"]), str(attention_dirs["draft"]))
    target = pair.target
    assert target.attention_mode == "kernel" and pair.draft.attention_mode == "kernel"
    assert target.flush_every > 0 and target.hooked_ids  # layers that start evaluation mid-forward
    ref, blocks, done = oracle_generate(pair, block_size, 120, seed=block_size)
    assert len(ref) == 120 and done.tokens == ref
    assert forced["attention"] > len(blocks)  # every verify and draft forward attended through it
    if block_size > 2:
        assert {b.accepted for b in blocks if b.drafted} >= {0}
        assert any(0 < b.accepted < len(b.drafted) for b in blocks)


def test_plain_mlx_lm_calls_stay_on_mlx_ops(attention_dirs, forced):
    pair = load_pair(str(attention_dirs["target"]), str(attention_dirs["draft"]))
    list(Conversation(pair).generate("hello", GenerationSettings(max_tokens=8, block_size=4)))
    before = dict(forced)
    reference_tokens(pair, list(range(3, 40)), 20)  # mlx-lm's own generation on the same model
    assert forced == before
    assert not any(getattr(layer, "_dflash_flush", False) for layer in pair.target.layers)


def test_split_attention_path_matches_stream_generate(attention_dirs, forced, monkeypatch):
    # every verify and draft forward past 64 cached keys goes through the split-K arithmetic
    monkeypatch.setattr(ck, "SPLIT_FROM_KEYS", 64)
    monkeypatch.setattr(ck, "SPLIT_CHUNK", 24)
    splits = []
    monkeypatch.setattr(ck, "_split_attention_reference",
                        lambda *a, _ref=ck._split_attention_reference: splits.append(a[-1]) or _ref(*a))
    pair = load_pair(str(attention_dirs["target"]), str(attention_dirs["draft"]))
    ref, blocks, done = oracle_generate(pair, 8, 80, seed=5)
    assert done.tokens == ref
    assert splits and max(splits) >= 4


@pytest.fixture(scope="module")
def attention64_dirs(tmp_path_factory):
    # head_dim 64: the narrowest the all-queries kernel takes
    return _build_pair(tmp_path_factory.mktemp("qwen3_hd64"), "qwen3", seed=3, head_dim=64, layers=8)


def test_allq_attention_path_matches_stream_generate(attention64_dirs, forced, monkeypatch):
    # every verify and draft forward past 48 cached keys goes through the all-queries arithmetic
    monkeypatch.setattr(ck, "ALLQ_FROM_KEYS", 48)
    monkeypatch.setattr(ck, "ALLQ_MIN_ROWS", 1)
    monkeypatch.setattr(ck, "ALLQ_CHUNK", 32)
    monkeypatch.setattr(ck, "ALLQ_TILE", 16)
    calls = []
    monkeypatch.setattr(ck, "_allq_attention_reference",
                        lambda *a, _ref=ck._allq_attention_reference: calls.append(a[0].shape) or _ref(*a))
    pair = load_pair(str(attention64_dirs["target"]), str(attention64_dirs["draft"]))
    ref, blocks, done = oracle_generate(pair, 8, 80, seed=6)
    assert done.tokens == ref
    assert calls and max(shape[2] for shape in calls) == 8  # the verify's 8 queries


@pytest.mark.parametrize("block_size", [4, 16])
def test_hybrid_kernel_path_matches_stream_generate(hybrid_dirs, forced, block_size):
    pair = load_pair(str(hybrid_dirs["target"]), str(hybrid_dirs["draft"]))
    ref, blocks, done = oracle_generate(pair, block_size, 100, seed=10 + block_size)
    assert done.tokens == ref
    assert any(0 < b.accepted < len(b.drafted) for b in blocks)  # rollbacks to states inside the block
    cycles = [b for b in blocks if b.verify_ms > 0]  # the first Block is the prefill's own token
    assert forced["gated_delta"] >= len(cycles) * len(pair.target.linear_ids)


def test_lazy_draft_keeps_the_phase_times_adding_up(attention_dirs, forced):
    pair = load_pair(str(attention_dirs["target"]), str(attention_dirs["draft"]))
    events = list(Conversation(pair).generate(PROMPT, GenerationSettings(max_tokens=40, block_size=8)))
    done = events[-1]
    blocks = [e for e in events if isinstance(e, Block) and e.index > 0]  # index 0: the prefill's token
    assert blocks and all(b.draft_ms > 0 and b.verify_ms > 0 for b in blocks if b.drafted)
    phases = sum(b.draft_ms + b.verify_ms + b.rollback_ms for b in blocks) / 1e3
    assert 0 < phases <= done.stats["decode_s"] * 1.05


def test_cycle_cost_compares_setups_side_by_side(capsys, monkeypatch):
    import json
    import os

    from dflash_tui.bench import cycle_cost

    from dflash_tui.engine import step_rows

    monkeypatch.setenv("DFLASH_TUI_KERNELS", "1")  # the engine's choice on a GPU: the kernels (references here)
    # and verify rows as decode steps where asked (MLX's own per-row calls here), as on MLX CUDA
    monkeypatch.setattr(step_rows, "wanted", lambda: os.environ.get("DFLASH_TUI_KERNELS") != "0")

    assert cycle_cost.main(["--shape", "tiny", "--block-size", "4", "--tokens", "12", "--prompt", "16",
                            "--setups", "engine", "step-rows", "mlx-ops", "--repeat", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["setup"] for r in report["rows"]] == ["engine", "step-rows", "mlx-ops"] * 2
    assert all(r["attention"] == "kernel" and r["kernels"] and not r["step_rows"]
               for r in report["rows"] if r["setup"] == "engine")
    assert all(r["attention"] == "kernel" and r["kernels"] and r["step_rows"]
               for r in report["rows"] if r["setup"] == "step-rows")
    assert all(r["attention"] == "fused" and not r["kernels"] and not r["step_rows"]
               for r in report["rows"] if r["setup"] == "mlx-ops")
    assert set(report["steps_per_cycle"]) == {"tiny ctx16 engine b4", "tiny ctx16 step-rows b4",
                                              "tiny ctx16 mlx-ops b4"}
    assert all(v["n"] == 2 and v["median"] > 0 for v in report["steps_per_cycle"].values())
    # the setups' switch is process-wide: the run gives it back as it found it
    assert os.environ["DFLASH_TUI_KERNELS"] == "1"


# -- the CUDA sources compile (where nvcc is) ------------------------------------------------

@needs_nvcc
def test_kernel_sources_compile(tmp_path):
    bf = "__nv_bfloat16"
    qkv = [("q", bf), ("k", bf), ("v", bf)]
    parts = [("part_o", "float"), ("part_ml", "float")]
    consts = [f"using T = {bf}", "constexpr int G = 4", "constexpr int WARPS = 4", "constexpr bool CAUSAL = true",
              f"constexpr int SCALE_BITS = {ck._float_bits(0.125)}", "constexpr int CHUNK = 256"]
    kernels = [cc.kernel(f"attention_{D}", ck._ATTENTION_SOURCE, qkv, [("out", bf)],
                         [f"using T = {bf}", f"constexpr int D = {D}", "constexpr int G = 4", "constexpr int WARPS = 8",
                          "constexpr bool CAUSAL = true", f"constexpr int SCALE_BITS = {ck._float_bits(0.125)}"])
               for D in (128, 256)]
    kernels += [cc.kernel(f"split_{D}", ck._ATTENTION_SPLIT_SOURCE, qkv, parts, consts + [f"constexpr int D = {D}"])
                for D in (96, 128, 256)]
    kernels.append(cc.kernel("combine", ck._ATTENTION_COMBINE_SOURCE, parts, [("out", bf)], [f"using T = {bf}"]))
    for D in (128, 256):  # what the engine instantiates: 16 queries, 4 heads per KV head
        tile = 16 if D == 256 else 32
        assert cqa.allq_fits(16 * 4, D, tile, 256)
        kernels.append(cc.kernel(f"allq_{D}", cqa._ATTENTION_ALLQ_SOURCE, qkv, parts,
                                 consts + [f"constexpr int D = {D}", "constexpr int L = 16", f"constexpr int TK = {tile}"]))
    kernels.append(cc.kernel("gated_delta", gd._GATED_DELTA_SOURCE,
                             [("q", bf), ("k", bf), ("v", bf), ("g", "float"), ("beta", bf), ("state", "float")],
                             [("y", bf), ("states", "float")], ["constexpr int DK = 128", f"using YT = {bf}"]))
    out = cc.nvcc(tmp_path, cc.translation_unit(ck._HEADER, kernels))
    assert out.returncode == 0, out.stderr[-2000:]
