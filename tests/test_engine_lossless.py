"""Greedy DFlash output must equal plain mlx-lm greedy output, token for token."""

from __future__ import annotations

import pytest

from conftest import oracle_proposer, reference_tokens
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block, Done, Prefill

PROMPTS = {
    "short": "hi",
    "medium": "Write a function that adds two numbers and explain it. " * 4,
    "long": "def push(self, item): self.items.append(item) " * 60,  # > one prefill chunk
}


def run(conv: Conversation, text: str, settings: GenerationSettings) -> tuple[list, Done]:
    events = list(conv.generate(text, settings))
    assert isinstance(events[0], Prefill)
    assert isinstance(events[-1], Done), events[-1]
    return events, events[-1]


def s_tpc(done: Done) -> float:
    return done.stats["tokens_per_cycle"]


def prompt_of(conv: Conversation) -> list[int]:
    return conv.prompt_tokens(conv.messages[:-1])


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_oracle_draft_matches_stream_generate(qwen3_pair, block_size, prompt):
    """Partial accepts at every depth: the draft is right ~70% of the time."""
    conv = Conversation(qwen3_pair)
    text = PROMPTS[prompt]
    conv.messages.append({"role": "user", "content": text})
    prompt_ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(qwen3_pair, prompt_ids, 200)
    conv.propose = oracle_proposer(prompt_ids + ref, error_rate=0.15, seed=block_size, vocab=qwen3_pair.target.vocab_size)
    events, done = run(conv, text, GenerationSettings(max_tokens=200, block_size=block_size, prefill_chunk=128))
    assert done.tokens == ref
    blocks = [e for e in events if isinstance(e, Block)]
    assert sum(b.reply_tokens for b in blocks) == len(ref)
    assert all(b.drafted[: b.accepted] == b.emitted[: b.accepted] and b.emitted for b in blocks if b.drafted)
    if block_size > 2:
        # the oracle must have produced rejections and partial accepts of several depths
        accepted = {b.accepted for b in blocks if b.drafted}
        assert 0 in accepted and len(accepted) >= 3 and max(accepted) >= min(block_size - 1, 6), accepted
    assert done.stats["tokens_per_cycle"] > 1.5


@pytest.mark.parametrize("block_size", [4, 16])
def test_random_draft_matches_stream_generate(qwen3_pair, block_size):
    conv = Conversation(qwen3_pair)
    _, done = run(conv, PROMPTS["medium"], GenerationSettings(max_tokens=120, block_size=block_size))
    assert done.tokens == reference_tokens(qwen3_pair, prompt_of(conv), 120)


@pytest.mark.parametrize("block_size", [4, 16])
def test_max_tokens_is_exact(qwen3_pair, block_size):
    for max_tokens in (1, block_size - 1, block_size, block_size + 1):
        conv = Conversation(qwen3_pair)
        conv.messages.append({"role": "user", "content": "count"})
        ids = conv.prompt_tokens()
        conv.messages.clear()
        ref = reference_tokens(qwen3_pair, ids, max_tokens)
        conv.propose = oracle_proposer(ids + ref + [0] * 32, error_rate=0.0, vocab=qwen3_pair.target.vocab_size)
        _, done = run(conv, "count", GenerationSettings(max_tokens=max_tokens, block_size=block_size))
        assert len(done.tokens) == max_tokens, (max_tokens, len(done.tokens))
        assert done.tokens == ref
        assert done.finish_reason == "length"


def test_eos_inside_an_accepted_block(qwen3_pair):
    """A stop token in the middle of a fully accepted block ends the output right there."""
    tok = qwen3_pair.target.tokenizer
    conv = Conversation(qwen3_pair)
    conv.messages.append({"role": "user", "content": "stop soon"})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(qwen3_pair, ids, 64)
    # make a token that first appears mid-block a stop token, for both decoders
    pos = next(i for i in range(5, 60) if i % 8 not in (0, 1) and ref[i] not in ref[:i])
    stop = ref[pos]
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids = saved | {stop}
    try:
        want = reference_tokens(qwen3_pair, ids, 64)
        assert want == ref[:pos]
        conv.propose = oracle_proposer(ids + ref, error_rate=0.0, vocab=qwen3_pair.target.vocab_size)
        events, done = run(conv, "stop soon", GenerationSettings(max_tokens=64, block_size=8))
    finally:
        tok.eos_token_ids = saved
    assert done.finish_reason == "stop"
    assert done.tokens == want
    last = [e for e in events if isinstance(e, Block)][-1]
    # the stop token ended the reply inside the block: it is the last token the block gave, and no
    # drafted token after it counts as accepted, although the target agreed with them all
    assert last.eos and last.emitted[-1] == stop and stop not in last.emitted[:-1]
    assert len(last.drafted) > len(last.emitted) and last.accepted == len(last.emitted)
    assert last.drafted[: last.accepted] == last.emitted[: last.accepted]


def test_three_turns_equal_fresh_runs(qwen3_pair):
    conv = Conversation(qwen3_pair, system="You are terse.")
    settings = GenerationSettings(max_tokens=40, block_size=8)
    for i, text in enumerate(["first question", "and a second one", "third and last"]):
        events, done = run(conv, text, settings)
        prefill = events[0]
        if i > 0:
            assert prefill.cached_tokens > 0  # only the new message is prefilled
        assert prefill.cached_tokens < prefill.prompt_tokens
        # a fresh run on the whole conversation so far
        assert done.tokens == reference_tokens(qwen3_pair, prompt_of(conv), 40), f"turn {i}"
        fresh = Conversation(qwen3_pair)
        fresh.messages = [dict(m) for m in conv.messages[:-2]]
        fresh.state.reset()
        _, fresh_done = run(fresh, text, settings)
        assert fresh_done.tokens == done.tokens


def test_baseline_mode_matches_and_drafts_nothing(qwen3_pair):
    conv = Conversation(qwen3_pair)
    events, done = run(conv, PROMPTS["medium"], GenerationSettings(max_tokens=50, baseline=True))
    assert done.tokens == reference_tokens(qwen3_pair, prompt_of(conv), 50)
    blocks = [e for e in events if isinstance(e, Block)]
    assert all(not b.drafted and len(b.emitted) == 1 for b in blocks)
    assert done.stats["mode"] == "baseline"
    # a DFlash turn after a baseline turn still matches (the draft context stayed whole)
    _, done2 = run(conv, "again", GenerationSettings(max_tokens=50, block_size=8))
    assert done2.tokens == reference_tokens(qwen3_pair, prompt_of(conv), 50)


def test_cancel_between_cycles_keeps_what_was_produced(qwen3_pair):
    conv = Conversation(qwen3_pair)
    seen = []

    def cancel() -> bool:
        return len(seen) >= 3

    events = []
    for ev in conv.generate(PROMPTS["medium"], GenerationSettings(max_tokens=100, block_size=4), cancel):
        events.append(ev)
        if isinstance(ev, Block):
            seen.append(ev)
    done = events[-1]
    assert done.finish_reason == "cancelled"
    assert len(seen) == 3
    produced = [t for b in seen for t in b.emitted]
    assert done.tokens == produced
    assert produced == reference_tokens(qwen3_pair, prompt_of(conv), 100)[: len(produced)]
    assert conv.messages[-1] == {"role": "assistant", "content": done.text}


def test_block_text_adds_up_to_done_text(qwen3_pair):
    conv = Conversation(qwen3_pair)
    events, done = run(conv, "text", GenerationSettings(max_tokens=60, block_size=4))
    assert "".join(e.text for e in events if isinstance(e, Block)) == done.text
    assert done.text == qwen3_pair.target.tokenizer.decode(done.tokens)


def test_a_failed_turn_leaves_no_half_message(qwen3_pair, monkeypatch):
    conv = Conversation(qwen3_pair)
    run(conv, "works", GenerationSettings(max_tokens=5, block_size=4))
    before = [dict(m) for m in conv.messages]

    def boom(*a, **k):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(conv.state, "prefill", boom)
    events = list(conv.generate("fails", GenerationSettings(max_tokens=5)))
    assert events[-1].type == "error" and "out of memory" in events[-1].message
    assert conv.messages == before


def test_a_block_past_the_drafts_own_is_refused_and_the_conversation_goes_on(qwen3_pair):
    conv = Conversation(qwen3_pair)
    run(conv, "works", GenerationSettings(max_tokens=5, block_size=4))
    before = [dict(m) for m in conv.messages]
    events = list(conv.generate("too big", GenerationSettings(max_tokens=5, block_size=17)))
    assert [e.type for e in events] == ["error"] and "block size 17 refused" in events[0].message
    assert conv.messages == before
    # the target alone has no block to size; the draft's own size is allowed
    assert list(conv.generate("alone", GenerationSettings(max_tokens=3, block_size=17, baseline=True)))[-1].type == "done"
    assert list(conv.generate("own", GenerationSettings(max_tokens=3, block_size=16)))[-1].type == "done"


def test_decode_speed_runs_from_the_first_token_to_the_end_of_the_reply(qwen3_pair):
    """A cycle that only ends the reply with EOS is decode time: the reply is not over before it, and
    leaving it out would favour DFlash, whose cycle costs more than the step that says EOS for
    mlx_lm.stream_generate (which bench counts the same way)."""
    import time

    import mlx.core as mx

    from dflash_tui.engine.speculative import draft_proposals

    tok = qwen3_pair.target.tokenizer
    conv = Conversation(qwen3_pair)
    conv.messages.append({"role": "user", "content": "a slow stop"})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(qwen3_pair, ids, 40)
    k = next(i for i in range(6, 40) if ref[i] not in ref[:i])
    stop = ref[k]
    wrong = next(t for t in range(qwen3_pair.target.vocab_size) if t not in ref and t not in tok.eos_token_ids)

    def propose(state, token, b):
        real = draft_proposals(state, token, b)
        if len(state.tokens) == len(ids) + k - 1:  # the cycle after the last kept token: it can only stop
            time.sleep(0.5)
        return mx.array([wrong] * (b - 1), dtype=real.dtype) + 0 * real  # never accepted: one token a cycle

    conv.propose = propose
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids = saved | {stop}
    try:
        events, done = run(conv, "a slow stop", GenerationSettings(max_tokens=40, block_size=2))
    finally:
        tok.eos_token_ids = saved
    assert done.finish_reason == "stop" and done.tokens == ref[:k]
    last = [e for e in events if isinstance(e, Block)][-1]
    assert last.emitted == [stop] and last.eos and last.drafted and last.reply_tokens == 0  # it gave only the stop
    assert s_tpc(done) == 1.0  # every cycle gave one token, the last one the stop: never below 1
    s = done.stats
    span = (k - 1) / s["decode_tps"]
    assert s["decode_s"] >= span >= 0.5  # the speed holds the slow last cycle, as the wall time does
