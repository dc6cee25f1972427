"""Hybrid (Gated DeltaNet + attention) targets: greedy DFlash output equals plain
mlx-lm greedy output token for token, with partial accepts at every depth."""

from __future__ import annotations

import functools

import pytest

from conftest import _build_pair, oracle_proposer, reference_tokens
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block, Done, Prefill
from dflash_tui.engine.hybrid import HybridCache, HybridTarget
from dflash_tui.engine.loading import Pair, load_pair

N_TOKENS = 256
PROMPT = "Write a function that adds two numbers and explain it. " * 4
DIMS = {"linear_head_dim": 32}  # 2 key heads, 4 value heads (qwen3_5_config defaults)


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    return _build_pair(tmp_path_factory.mktemp("qwen3_5"), "qwen3_5", seed=0, **DIMS)


@pytest.fixture(scope="module")
def hybrid_pair(hybrid_dirs) -> Pair:
    return load_pair(str(hybrid_dirs["target"]), str(hybrid_dirs["draft"]))


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory) -> Pair:
    dirs = _build_pair(tmp_path_factory.mktemp("qwen3_5_moe"), "qwen3_5", seed=0, moe=True, **DIMS)
    return load_pair(str(dirs["target"]), str(dirs["draft"]))


def prompt_ids(pair: Pair, text: str, messages=()) -> list[int]:
    conv = Conversation(pair)
    conv.messages = [dict(m) for m in messages] + [{"role": "user", "content": text}]
    return conv.prompt_tokens()


@functools.lru_cache(maxsize=None)
def _reference(pair_id: int, ids: tuple, n: int) -> list[int]:
    return reference_tokens(_pairs[pair_id], list(ids), n)


_pairs: dict[int, Pair] = {}


def reference(pair: Pair, ids: list[int], n: int = N_TOKENS) -> list[int]:
    _pairs[id(pair)] = pair
    return _reference(id(pair), tuple(ids), n)


def run(conv: Conversation, text: str, settings: GenerationSettings) -> tuple[list, Done]:
    events = list(conv.generate(text, settings))
    assert isinstance(events[0], Prefill)
    assert isinstance(events[-1], Done), events[-1]
    return events, events[-1]


def oracle_run(pair: Pair, block_size: int, seed: int, text: str = PROMPT, n: int = N_TOKENS):
    ids = prompt_ids(pair, text)
    ref = reference(pair, ids, n)
    conv = Conversation(pair)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.15, seed=seed, vocab=pair.target.vocab_size)
    events, done = run(conv, text, GenerationSettings(max_tokens=n, block_size=block_size))
    return ref, events, done


def assert_partial_accepts(events, block_size: int) -> None:
    blocks = [e for e in events if isinstance(e, Block) and e.drafted]
    accepted = {b.accepted for b in blocks}
    assert 0 in accepted, accepted
    if block_size > 2:
        partial = {a for a in accepted if 0 < a < len(blocks[0].drafted)}
        assert len(partial) >= 2 and max(accepted) >= min(block_size - 1, 6), accepted


def test_loads_as_hybrid_with_uneven_linear_heads(hybrid_pair, moe_pair):
    for pair, module in ((hybrid_pair, "qwen3_5"), (moe_pair, "qwen3_5_moe")):
        target = pair.target
        assert isinstance(target, HybridTarget) and not target.unsupported
        assert type(target.model).__module__.endswith("." + module)
        args = target.args
        assert args.linear_num_key_heads != args.linear_num_value_heads
        assert target.linear_ids and target.attention_ids
        assert isinstance(target.make_cache(), HybridCache)


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_oracle_draft_matches_stream_generate(hybrid_pair, block_size):
    ref, events, done = oracle_run(hybrid_pair, block_size, seed=block_size)
    assert len(ref) == N_TOKENS  # no early stop: all 256 tokens are compared
    assert done.tokens == ref
    assert_partial_accepts(events, block_size)
    assert done.stats["tokens_per_cycle"] > 1.5


@pytest.mark.parametrize("block_size", [4, 16])
def test_moe_variant_matches_stream_generate(moe_pair, block_size):
    ref, events, done = oracle_run(moe_pair, block_size, seed=100 + block_size)
    assert len(ref) == N_TOKENS
    assert done.tokens == ref
    assert_partial_accepts(events, block_size)


def test_replay_mode_matches_stream_generate(hybrid_pair):
    """The rollback path Metal takes (replay through mlx-lm's update), forced on this backend."""
    t = hybrid_pair.target
    replaying = HybridTarget(t.model, t.tokenizer, name="replay", rollback_mode="replay")
    replaying.capture_ids = list(t.capture_ids)  # shares the model, and so its capturing layers
    pair = Pair(target=replaying, draft=hybrid_pair.draft, target_name="replay", draft_name=hybrid_pair.draft_name)
    ref, events, done = oracle_run(pair, 8, seed=8)
    assert done.tokens == ref
    assert_partial_accepts(events, 8)


def test_real_draft_matches_stream_generate(hybrid_pair):
    conv = Conversation(hybrid_pair)
    _, done = run(conv, PROMPT, GenerationSettings(max_tokens=120, block_size=16))
    assert done.tokens == reference(hybrid_pair, prompt_ids(hybrid_pair, PROMPT), 120)


def test_three_turns_reuse_the_cache_and_equal_fresh_runs(hybrid_pair):
    conv = Conversation(hybrid_pair, system="You are terse.")
    settings = GenerationSettings(max_tokens=48, block_size=8)
    for i, text in enumerate(["first question", "and a second one", "third and last"]):
        before = [dict(m) for m in conv.messages]
        ids = prompt_ids(hybrid_pair, text, before)
        ref = reference(hybrid_pair, ids, 48)
        conv.propose = oracle_proposer(ids + ref, error_rate=0.2, seed=i, vocab=hybrid_pair.target.vocab_size)
        events, done = run(conv, text, settings)
        prefill = events[0]
        if i > 0:
            assert prefill.cached_tokens > 0  # only what changed is prefilled
        assert prefill.cached_tokens < prefill.prompt_tokens
        assert done.tokens == ref, f"turn {i}"
        fresh = Conversation(hybrid_pair, system="You are terse.")
        fresh.messages = before
        _, fresh_done = run(fresh, text, settings)
        assert fresh_done.tokens == done.tokens
    # regenerate truncates the caches back to the last prompt: lands on its snapshot
    events = list(conv.regenerate(settings))
    assert isinstance(events[-1], Done)
    assert events[0].cached_tokens == events[0].prompt_tokens - 1
    assert events[-1].tokens == done.tokens


def test_truncation_to_a_shared_prefix(hybrid_pair):
    """A new prompt sharing only part of the cached history: restores a snapshot, then prefills."""
    conv = Conversation(hybrid_pair)
    settings = GenerationSettings(max_tokens=40, block_size=4)
    first = prompt_ids(hybrid_pair, "tell me about stacks")
    list(conv.generate_tokens(first, settings))
    second = first + prompt_ids(hybrid_pair, "and queues")[1:]
    events = list(conv.generate_tokens(second, settings))
    assert 0 < events[0].cached_tokens <= len(first)
    assert events[-1].tokens == reference(hybrid_pair, second, 40)
    # a prompt sharing less than any snapshot starts from an empty cache, still exact
    events = list(conv.generate_tokens(first[:3] + [5, 6, 7], settings))
    assert events[0].cached_tokens == 0
    assert events[-1].tokens == reference(hybrid_pair, first[:3] + [5, 6, 7], 40)


def test_two_engines_interleaved_do_not_interfere(hybrid_pair, moe_pair):
    """Two targets, and two caches on one target, decoding in lockstep."""
    settings = GenerationSettings(max_tokens=96, block_size=8)
    runs = []
    for pair, text in ((hybrid_pair, "alpha"), (moe_pair, "beta"), (hybrid_pair, "gamma")):
        ids = prompt_ids(pair, text)
        ref = reference(pair, ids, 96)
        conv = Conversation(pair)
        conv.propose = oracle_proposer(ids + ref, error_rate=0.2, seed=len(runs), vocab=pair.target.vocab_size)
        runs.append((ref, conv.generate(text, settings)))
    finished: dict[int, Done] = {}
    while len(finished) < len(runs):
        for i, (_, gen) in enumerate(runs):
            if i in finished:
                continue
            ev = next(gen)
            if isinstance(ev, Done):
                finished[i] = ev
    for i, (ref, _) in enumerate(runs):
        assert finished[i].tokens == ref, i


def test_plain_mlx_lm_is_untouched(hybrid_dirs, hybrid_pair):
    """The attached model still generates through mlx-lm exactly as a freshly loaded one."""
    import mlx_lm

    fresh, tokenizer = mlx_lm.load(str(hybrid_dirs["target"]))
    ids = prompt_ids(hybrid_pair, "untouched?")
    want = [r.token for r in mlx_lm.stream_generate(fresh, tokenizer, ids, max_tokens=32)]
    got = [r.token for r in mlx_lm.stream_generate(hybrid_pair.target.model, tokenizer, ids, max_tokens=32)]
    assert got == want
    assert type(fresh.language_model.model.layers[0].linear_attn).__name__ == "GatedDeltaNet"


def _forward_rows(model, run) -> list[int]:
    """The row count of every forward of `model` while `run()` runs (its first layer's inputs)."""
    layer = model.layers[0]
    base = type(layer)
    rows: list[int] = []

    def __call__(self, x, *args, **kwargs):
        rows.append(x.shape[1])
        return base.__call__(self, x, *args, **kwargs)

    layer.__class__ = type("Counting" + base.__name__, (base,), {"__call__": __call__})
    try:
        run()
    finally:
        layer.__class__ = base
    return rows


def test_prefill_runs_mlx_lms_pieces(hybrid_pair):
    """The prompt goes through the target in mlx-lm's prefill pieces, each whole (chunks of the
    body, then the last token alone): on a GPU a row may round with its forward's row count, so
    another split would start decoding from another state than `stream_generate`."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from dflash_tui.engine.state import DecodeState

    target = hybrid_pair.target
    ids = prompt_ids(hybrid_pair, "count the pieces")
    assert len(ids) > 17
    model = target.model
    theirs = _forward_rows(model, lambda: next(generate_step(mx.array(ids), model, max_tokens=1, prefill_step_size=8)))
    state = DecodeState(target, hybrid_pair.draft)
    ours = _forward_rows(model, lambda: state.prefill(ids, chunk=8))
    body = len(ids) - 1
    assert ours == [8] * (body // 8) + ([body % 8] if body % 8 else []) + [1]
    assert theirs[: len(ours)] == ours  # then mlx-lm's first decode step
    # a regenerate's truncation point, the prompt end minus one, still has its snapshot
    assert state.target_cache.snapshots[-1].length == len(ids) - 1
