"""Every published pair family: a tiny replica of it (tests/families.py) loads through the real
loaders, and greedy DFlash output equals plain mlx-lm token for token at blocks 4 and 16 (partial
accepts from an oracle draft: mlx-lm's own tokens with planted errors) and over two turns.

The reference is always a separate, untouched `mlx_lm.load` of the replica's directory. Prompt
plus reply run past the replicas' 16-token sliding windows.

Every family is testable here (mlx-lm 0.32 has gemma4 and qwen3_next). The two gpt-oss families
load only once the draft loader reads `attention_bias` (their published drafts carry q/k/v/o
biases); test_family_rollback.py checks the gpt-oss target side without it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import oracle_proposer, reference_tokens
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block, Done, Prefill
from dflash_tui.engine.hybrid import HybridTarget
from dflash_tui.engine.loading import load_pair
from dflash_tui.engine.window_cache import WindowKVCache
from families import BY_NAME, FAMILIES
from replicas import build_pair, build_tokenizer

N_TOKENS = 40
SEED = 3
_REFS: dict[tuple, list[int]] = {}  # families sharing a real target (Qwen3.5 / 3.6) share its replica's replies
PROMPT = "Write a function that adds two numbers and explain it."
SECOND = "Now the same for three numbers, please."


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("replica_tokenizer")
    build_tokenizer(out)
    return out


@pytest.fixture(scope="module", params=[f.name for f in FAMILIES])
def replica(request, tmp_path_factory, tokenizer_dir) -> SimpleNamespace:
    import mlx_lm

    family = BY_NAME[request.param]
    dirs = build_pair(family, tmp_path_factory.mktemp(family.name), tokenizer_dir, seed=SEED)
    model, tokenizer = mlx_lm.load(str(dirs["target"]))
    vanilla = SimpleNamespace(target=SimpleNamespace(model=model, tokenizer=tokenizer))
    weights = (json.dumps(family.target, sort_keys=True), family.dtype, family.quantize, SEED)
    return SimpleNamespace(family=family, dirs=dirs, vanilla=vanilla, weights=weights)


@pytest.fixture(scope="module")
def pair(replica):
    return load_pair(str(replica.dirs["target"]), str(replica.dirs["draft"]))


def prompt_ids(pair, messages: list[dict[str, str]]) -> list[int]:
    conv = Conversation(pair)
    conv.messages = [dict(m) for m in messages]
    return conv.prompt_tokens()


def reference(replica, ids: list[int]) -> list[int]:
    """Plain mlx-lm's greedy reply (on the untouched load of the replica's directory)."""
    key = (replica.weights, tuple(ids))
    if key not in _REFS:
        _REFS[key] = reference_tokens(replica.vanilla, ids, N_TOKENS)
    return _REFS[key]


def oracle_turn(conv: Conversation, replica, text: str, block_size=None, seed: int = 0) -> tuple[list, Done, list[int]]:
    """One turn with an oracle draft built on mlx-lm's reply to the whole conversation so far."""
    ids = prompt_ids(conv.pair, conv.messages + [{"role": "user", "content": text}])
    ref = reference(replica, ids)
    assert len(ref) == N_TOKENS and len(set(ref)) >= 8, ref  # a long, varied reply: a real test
    conv.propose = oracle_proposer(ids + ref, error_rate=0.2, seed=seed, vocab=conv.target.vocab_size)
    events = list(conv.generate(text, GenerationSettings(max_tokens=N_TOKENS, block_size=block_size)))
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Done), events[-1]
    return events, events[-1], ref


def test_loads_through_the_real_loaders(replica, pair):
    """The target as mlx-lm loads it, the draft's published fields as the loader reads them."""
    family, draft = replica.family, replica.dirs["draft_config"]
    cfg = pair.draft.config
    assert cfg.block_size == int(draft.get("block_size") or draft["dflash_config"]["block_size"])
    assert cfg.target_layer_ids == draft["dflash_config"]["target_layer_ids"]
    assert cfg.mask_token_id == replica.dirs["mask_token_id"]
    assert pair.target.tokenizer.convert_ids_to_tokens(cfg.mask_token_id) is None  # past the tokenizer...
    assert cfg.mask_token_id < pair.target.vocab_size  # ...inside the embedding
    assert cfg.layer_types == (draft.get("layer_types") or ["full_attention"] * cfg.num_hidden_layers)
    assert cfg.sliding_window == draft.get("sliding_window")
    assert type(pair.target.model).__module__.rsplit(".", 1)[-1] == family.target["model_type"]
    assert isinstance(pair.target, HybridTarget) == (family.target["model_type"] in ("qwen3_5", "qwen3_5_moe", "qwen3_next"))
    windowed = [c for c in pair.target.make_cache() if isinstance(c, WindowKVCache)]
    assert bool(windowed) == (family.target["model_type"] in ("gpt_oss", "gemma4"))
    assert hasattr(pair.target.backbone.embed_tokens, "scales") == family.quantize


def test_greedy_equals_mlx_lm_at_block_4(replica, pair):
    events, done, ref = oracle_turn(Conversation(pair), replica, PROMPT, block_size=4, seed=4)
    assert done.tokens == ref
    assert_partial_accepts(events)


def test_two_turns_equal_fresh_runs(replica, pair):
    """The draft's own block size (8, 10 or 16: the largest it may be asked for), then 6 on the same
    conversation: each turn equals mlx-lm run afresh on the whole conversation, the second reusing the
    first's caches."""
    conv = Conversation(pair)
    events, done, ref = oracle_turn(conv, replica, PROMPT, block_size=pair.draft.config.block_size, seed=16)
    assert done.tokens == ref, "turn 1"
    assert_partial_accepts(events)
    events, done, ref = oracle_turn(conv, replica, SECOND, block_size=6, seed=17)
    assert done.tokens == ref, "turn 2"
    assert events[0].cached_tokens > 0  # only what the caches lacked was prefilled


def assert_partial_accepts(events: list) -> None:
    accepted = {e.accepted for e in events if isinstance(e, Block) and e.drafted}
    assert 0 in accepted and len(accepted) >= 3, accepted  # rejections and partial accepts of several depths
