"""Sliding-window targets (gpt-oss, Gemma 4) over a conversation many windows long.

mlx-lm's one-token steps read a sliding window's keys from a ring, in slot order; its
prefill reads them in time order. A sum's order decides its rounding, so the engine must
give every one-token step and every verify row the ring's order, and reuse across turns
only the rows a prefill computed. Each turn here is compared with a fresh, separate
`mlx_lm.load` + `stream_generate` over the whole conversation, at blocks 1 (the target
alone), 4 and 16 with partial accepts, over two turns.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import oracle_proposer, reference_tokens
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Done, Prefill
from dflash_tui.engine.loading import load_pair
from dflash_tui.engine.window_cache import WindowKVCache
from families import BY_NAME, WINDOW
from replicas import build_pair, build_tokenizer
from test_families import assert_partial_accepts

N_TOKENS = 40
HISTORY = [  # about 25 windows of the replicas' 16 tokens before the first reply
    {"role": "user", "content": "Write a function that adds two numbers and explain it. " * 3},
    {"role": "assistant", "content": "Here is a function that adds numbers and some explanation of it. " * 3},
    {"role": "user", "content": "Now the same for three numbers, please, and explain again in detail. " * 2},
]
NEXT = "And once more for four numbers, with a docstring."


@pytest.fixture(scope="module", params=["gemma-4-31b", "gpt-oss-20b"])
def windowed(request, tmp_path_factory) -> SimpleNamespace:
    import mlx_lm

    tok = tmp_path_factory.mktemp("window_tokenizer")
    build_tokenizer(tok)
    dirs = build_pair(BY_NAME[request.param], tmp_path_factory.mktemp(request.param), tok, seed=3)
    model, tokenizer = mlx_lm.load(str(dirs["target"]))
    vanilla = SimpleNamespace(target=SimpleNamespace(model=model, tokenizer=tokenizer))
    return SimpleNamespace(pair=load_pair(str(dirs["target"]), str(dirs["draft"])), vanilla=vanilla)


def turn(conv: Conversation, windowed, text: str, block_size, seed: int) -> tuple[list, Done, list[int]]:
    probe = Conversation(conv.pair)
    probe.messages = [dict(m) for m in conv.messages] + [{"role": "user", "content": text}]
    ids = probe.prompt_tokens()
    assert len(ids) > 20 * WINDOW
    ref = reference_tokens(windowed.vanilla, ids, N_TOKENS)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.2, seed=seed, vocab=conv.target.vocab_size)
    settings = GenerationSettings(max_tokens=N_TOKENS, block_size=block_size, baseline=block_size == 1)
    events = list(conv.generate(text, settings))
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Done)
    return events, events[-1], ref


@pytest.mark.parametrize("block_size", [1, 4, "own"])
def test_long_conversation_equals_fresh_mlx_lm_runs(windowed, block_size):
    seed = 16 if block_size == "own" else block_size
    if block_size == "own":  # the draft's trained block size (8 for gpt-oss, 16 for Gemma 4): the largest allowed
        block_size = windowed.pair.draft.config.block_size
    conv = Conversation(windowed.pair)
    conv.messages = [dict(m) for m in HISTORY[:-1]]
    events, done, ref = turn(conv, windowed, HISTORY[-1]["content"], block_size, seed=seed)
    assert done.tokens == ref, "turn 1"
    if block_size > 1:
        assert_partial_accepts(events)
    events, done, ref = turn(conv, windowed, NEXT, block_size, seed=seed + 1)
    assert done.tokens == ref, "turn 2"
    assert events[0].cached_tokens > 0  # the prompt's prefilled rows were reused


def test_steps_read_the_window_in_ring_order_and_reuse_stops_at_prefilled_rows(windowed):
    """The mechanism itself: after a turn, the caches hold rows a one-token step computed, and a
    next turn reuses only the prompt's prefilled rows."""
    conv = Conversation(windowed.pair)
    conv.messages = [dict(m) for m in HISTORY[:-1]]
    list(conv.generate(HISTORY[-1]["content"], GenerationSettings(max_tokens=8, baseline=True)))
    state = conv.state
    prompt_len = state.prefilled + 1  # the prompt's last token was the first one-token step
    assert len(state.tokens) > prompt_len
    window = next(c for c in state.target_cache if isinstance(c, WindowKVCache))
    assert window.ring_base == prompt_len - 1 and window._ring_order(prompt_len + 3) is not None
    events = list(conv.generate(NEXT, GenerationSettings(max_tokens=4, baseline=True)))
    assert events[0].cached_tokens == prompt_len - 1
