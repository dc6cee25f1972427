"""Bucketed (and folded) multi-query attention: same numbers as the fused kernel, and greedy
DFlash output equal to plain mlx-lm greedy output with the mode forced on, for attention
and hybrid targets, across block sizes and bucket boundaries."""

from __future__ import annotations

import mlx.core as mx
import pytest

from conftest import _build_pair, oracle_proposer, reference_tokens
from dflash_tui.engine import draft as draft_mod
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.draft import BucketKVCache, bucketed_attention, folded_attention
from dflash_tui.engine.events import Block
from dflash_tui.engine.loading import load_pair
from mlx_lm.models.cache import KVCache

SCALE = 16**-0.5
LONG = "def push(self, item): self.items.append(item) " * 60  # several hundred tokens: more than a bucket


def fused(q, k, v, causal):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask="causal" if causal else None)


def filled_cache(k: mx.array, v: mx.array, bucket: int, junk: bool) -> BucketKVCache:
    """A cache holding k/v, grown in two pieces, whose unused slots hold stale keys (as after a trim)."""
    c = BucketKVCache(bucket)
    S = k.shape[2]
    c.update_and_fetch(k[:, :, : S // 2], v[:, :, : S // 2])
    if junk:
        c.update_and_fetch(10 * mx.ones_like(k[:, :, : S - S // 2]), -10 * mx.ones_like(v[:, :, : S - S // 2]))
        c.trim(S - S // 2)
    c.update_and_fetch(k[:, :, S // 2 :], v[:, :, S // 2 :])
    return c


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("S,L", [(40, 16), (32, 16), (33, 1), (300, 7)])
def test_bucketed_and_folded_equal_the_fused_kernel(causal, S, L):
    mx.random.seed(S + L)
    q = mx.random.normal((1, 8, L, 16))
    k = mx.random.normal((1, 2, S, 16))
    v = mx.random.normal((1, 2, S, 16))
    want = fused(q, k, v, causal)
    assert mx.allclose(folded_attention(q, k, v, SCALE, causal=causal), want, atol=1e-5).item()
    for bucket in (16, 64, 256):
        cache = filled_cache(k, v, bucket, junk=True)
        assert cache.keys.shape[2] % cache.step == 0 and cache.keys.shape[2] >= -(-S // bucket) * bucket
        for compiled in (False, True):
            got = bucketed_attention(q, cache, SCALE, causal=causal, compiled=compiled)
            assert got is not None and got.shape == want.shape
            assert mx.allclose(got, want, atol=1e-5).item(), (bucket, compiled)


def test_bucketed_window_equals_the_sliced_keys():
    mx.random.seed(7)
    q = mx.random.normal((1, 4, 16, 16))
    k = mx.random.normal((1, 2, 70, 16))
    v = mx.random.normal((1, 2, 70, 16))
    window = 20
    want = fused(q, k[:, :, -(window + 16) :], v[:, :, -(window + 16) :], causal=False)
    got = bucketed_attention(q, filled_cache(k, v, 32, junk=True), SCALE, causal=False, window=window)
    assert mx.allclose(got, want, atol=1e-5).item()


def test_a_plain_kvcache_too_short_for_the_bucket_falls_back():
    c = KVCache()
    k = mx.zeros((1, 2, 300, 16))
    c.update_and_fetch(k, k)  # mlx-lm allocates 512 slots here
    c.trim(50)
    c.update_and_fetch(k[:, :, :270], k[:, :, :270])  # regrown from 250: 250 + 512 slots, not a multiple of 256
    assert c.keys.shape[2] == 762
    assert bucketed_attention(mx.zeros((1, 4, 2, 16)), c, SCALE, causal=True) is None


def test_bucket_cache_grows_a_step_at_a_time_and_trims_like_kvcache():
    ours, theirs = BucketKVCache(64), KVCache()
    mx.random.seed(0)
    for n, drop in [(5, 0), (300, 3), (16, 15), (250, 0), (16, 10), (1, 0)]:
        k = mx.random.normal((1, 2, n, 8))
        for c in (ours, theirs):
            a, b = c.update_and_fetch(k, -k)
            c.trim(drop)
        assert ours.offset == theirs.offset
        assert ours.keys.shape[2] % 256 == 0
        assert mx.array_equal(ours.keys[..., : ours.offset, :], theirs.keys[..., : theirs.offset, :]).item()
        assert mx.array_equal(ours.values[..., : ours.offset, :], theirs.values[..., : theirs.offset, :]).item()


# -- the whole loop, mode forced on ------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    return _build_pair(tmp_path_factory.mktemp("qwen3_5_bucketed"), "qwen3_5", seed=0, linear_head_dim=32)


def pair_in_mode(dirs, mode: str):
    pair = load_pair(str(dirs["target"]), str(dirs["draft"]))
    assert pair.target.use_attention(mode) == len(pair.target.attention_ids if pair.target.is_hybrid else pair.target.layers)
    pair.draft.set_attention_mode(mode)
    return pair


def oracle_generate(pair, text: str, block_size: int, max_tokens: int, seed: int):
    conv = Conversation(pair)
    conv.messages.append({"role": "user", "content": text})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(pair, ids, max_tokens)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.15, seed=seed, vocab=pair.target.vocab_size)
    events = list(conv.generate(text, GenerationSettings(max_tokens=max_tokens, block_size=block_size, prefill_chunk=128)))
    done = events[-1]
    assert done.type == "done", done
    return ids, ref, [e for e in events if isinstance(e, Block)], done


@pytest.mark.parametrize("mode", ["bucketed", "bucketed-compiled", "folded"])
@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_forced_mode_matches_stream_generate(qwen3_dirs, mode, block_size, monkeypatch):
    """A prompt longer than a bucket, and output crossing several bucket boundaries (bucket 32)."""
    monkeypatch.setattr(draft_mod, "BUCKET", 32)
    pair = pair_in_mode(qwen3_dirs, mode)
    ids, ref, blocks, done = oracle_generate(pair, LONG, block_size, 150, seed=block_size)
    assert len(ids) > 64 and len(ref) == 150  # the prompt spans buckets; the output crosses ~5 boundaries
    assert done.tokens == ref
    if mode.startswith("bucketed"):
        caches = pair_caches(pair)
        assert caches and all(isinstance(c, BucketKVCache) and c.bucket == 32 for c in caches)
    if block_size > 2:
        accepted = {b.accepted for b in blocks if b.drafted}
        assert 0 in accepted and len(accepted) >= 3, accepted


def pair_caches(pair) -> list:
    from dflash_tui.engine.state import DecodeState

    state = DecodeState(pair.target, pair.draft)
    return [c for c in list(state.target_cache) + list(state.draft_cache) if isinstance(c, KVCache)]


def test_bucketed_default_bucket_with_a_long_prompt(qwen3_dirs):
    """The shipped bucket (256): a prompt longer than one bucket, and output that crosses the next."""
    pair = pair_in_mode(qwen3_dirs, "bucketed")
    conv = Conversation(pair)
    conv.messages.append({"role": "user", "content": LONG})
    n_prompt = len(conv.prompt_tokens())
    conv.messages.clear()
    assert n_prompt > 256
    crossing = 512 - n_prompt + 40 if n_prompt < 512 else 80
    ids, ref, _, done = oracle_generate(pair, LONG, 16, min(max(crossing, 40), 300), seed=3)
    assert done.tokens == ref


@pytest.mark.parametrize("mode", ["bucketed", "folded"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_hybrid_forced_mode_matches_stream_generate(hybrid_dirs, mode, block_size, monkeypatch):
    monkeypatch.setattr(draft_mod, "BUCKET", 32)
    pair = pair_in_mode(hybrid_dirs, mode)
    _, ref, blocks, done = oracle_generate(pair, "Write a function that adds two numbers. " * 6, block_size, 120,
                                           seed=block_size)
    assert done.tokens == ref
    assert any(0 < b.accepted < len(b.drafted) for b in blocks)


def test_env_var_picks_the_mode(qwen3_dirs, monkeypatch):
    monkeypatch.setenv("DFLASH_TUI_VERIFY", "bucketed")
    pair = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
    assert pair.target.attention_mode == "bucketed" and pair.draft.attention_mode == "bucketed"
    assert type(pair.target.layers[0].self_attn).__name__.startswith("BucketedSDPA")
    assert pair.target.use_attention("fused") == 0
    assert type(pair.target.layers[0].self_attn).__name__ == "Attention"
    monkeypatch.setenv("DFLASH_TUI_VERIFY", "nonsense")
    with pytest.raises(Exception, match="DFLASH_TUI_VERIFY"):
        load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))


@pytest.mark.parametrize("mode", ["bucketed", "bucketed-compiled", "folded"])
def test_the_real_draft_proposes_the_same_tokens_in_every_mode(qwen3_dirs, mode, monkeypatch):
    """Draft attention (no mask, context growing every cycle) in `mode` against the fused kernel."""
    monkeypatch.setattr(draft_mod, "BUCKET", 32)
    runs = {}
    for m in ("fused", mode):
        pair = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
        pair.target.use_attention(m)
        pair.draft.set_attention_mode(m)
        events = list(Conversation(pair).generate(LONG[:400], GenerationSettings(max_tokens=100, block_size=8)))
        runs[m] = [e.drafted for e in events if isinstance(e, Block)]
    assert sum(len(d) for d in runs["fused"]) > 60
    assert runs[mode] == runs["fused"]


def test_verify_shapes_benchmark_runs_on_the_tiny_shape(capsys):
    import json

    from dflash_tui.bench import verify_shapes

    assert verify_shapes.main(["--shape", "tiny-hybrid", "--reps", "3", "--steps", "4", "--cycles", "6",
                               "--widths", "2", "--modes", "fused", "bucketed", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in report["rows"]] == ["fused", "bucketed"]
    for r in report["rows"]:
        assert r["fixed_ms"] > 0 and r["growing_ms"] > 0 and r["cycle_steps"] > 0
        assert set(r["widths_ms"]) == {"2", "16"}  # JSON keys
