"""The target-side rollbacks the family replicas rely on, each shown to matter.

- Sliding-window layers (gpt-oss, Gemma 4): `WindowKVCache` against the keys a from-scratch run
  attends over, and a gpt-oss replica through one-token target steps right after cut-short
  verifies (what the adaptive block size does) and a second turn past the window. With mlx-lm's
  own RotatingKVCache the first parts from mlx-lm within a few tokens.
- Qwen3-Next's Gated DeltaNet layers (Qwen3-Coder-Next): with their state restore skipped, the
  replica parts from mlx-lm.

The gpt-oss replica here has its draft's attention_bias turned off, so that this file checks the
target side whatever the draft loader reads; test_families.py runs the published draft config.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from conftest import oracle_proposer, reference_tokens
from dflash_tui.engine import gdn_tape
from dflash_tui.engine.block_sizer import BlockSizer
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block
from dflash_tui.engine.loading import load_pair
from dflash_tui.engine.target import Target
from dflash_tui.engine.window_cache import WindowKVCache
from families import BY_NAME
from replicas import build_pair, build_tokenizer

N_TOKENS = 40
PROMPT = "Write a function that adds two numbers and explain it."


class Schedule(BlockSizer):
    """Block sizes in a fixed cycle, as the adaptive sizer may choose them (1 = the target alone)."""

    def __init__(self, sizes: list[int]):
        self.sizes, self.i, self.chosen, self.max_block = sizes, 0, {}, max(sizes)

    def choose(self, left=None) -> int:
        b = self.sizes[self.i % len(self.sizes)]
        self.i += 1
        return max(1, min(b, left or b))

    def observe(self, b: int, accepted: int) -> None:
        pass


def window_keys_test(window: int, history: int, steps: list[tuple[int, int]]) -> None:
    """Run forwards of `new` tokens, each cut back to `keep`, and check every forward attends over
    exactly the keys a sliding window over the kept sequence gives: in time order for several
    tokens (mlx-lm's concatenating path), in the ring's slot order for one (its one-token step;
    no generation started, so the ring counts from position 0)."""
    cache = WindowKVCache(window, history=history)
    seq: list[float] = []  # the value each kept position's key carries
    for new, keep in steps:
        vals = [float(len(seq) + i) + random.choice([0.0, 0.25, 0.5]) for i in range(new)]  # exact in fp32
        k = mx.array(vals).reshape(1, 1, new, 1)
        keys, values = cache.update_and_fetch(k, k)
        want = seq[max(0, len(seq) - (window - 1)):] + vals
        if new == 1 and len(want) == window:
            want.sort(key=lambda v: int(v) % window)  # slot of position q: q mod window
        assert keys.reshape(-1).tolist() == want and values.shape == keys.shape
        cache.trim(new - keep)
        seq = seq + vals[:keep]
        assert cache.offset == len(seq)


def test_window_cache_attends_over_the_window_of_what_was_kept():
    random.seed(0)
    steps = [(30, 30)] + [(random.choice([1, 1, 4, 8, 16]), 0) for _ in range(60)]
    steps = [(n, k if k else random.randint(1, n)) for n, k in steps]
    window_keys_test(window=8, history=4, steps=steps)
    window_keys_test(window=16, history=0, steps=steps)


def test_window_cache_rolls_back_as_far_as_its_history():
    cache = WindowKVCache(8, history=4)
    for _ in range(200):  # one token at a time: the buffer is compacted again and again
        cache.update_and_fetch(mx.zeros((1, 1, 1, 2)), mx.zeros((1, 1, 1, 2)))
    assert cache.can_trim(4)  # at least `history` tokens behind the window
    most = max(n for n in range(200) if cache.can_trim(n))
    with pytest.raises(ValueError):
        cache.trim(most + 1)
    assert cache.trim(most) == most and cache.offset == 200 - most
    assert not cache.can_trim(1)  # all that is left is the window the next forward needs


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("replica_tokenizer")
    build_tokenizer(out)
    return out


def replica(name: str, root, tokenizer_dir, **draft_fields) -> SimpleNamespace:
    import mlx_lm

    family = BY_NAME[name]
    family = dataclasses.replace(family, draft=dict(family.draft, **draft_fields))
    dirs = build_pair(family, root, tokenizer_dir, seed=3)
    model, tokenizer = mlx_lm.load(str(dirs["target"]))
    return SimpleNamespace(dirs=dirs, vanilla=SimpleNamespace(target=SimpleNamespace(model=model, tokenizer=tokenizer)))


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory, tokenizer_dir) -> SimpleNamespace:
    return replica("gpt-oss-20b", tmp_path_factory.mktemp("gpt_oss"), tokenizer_dir, attention_bias=False)


def scheduled_run(dirs, vanilla, sizes: list[int], n: int = N_TOKENS) -> tuple[list[int], list[int], list]:
    pair = load_pair(str(dirs["target"]), str(dirs["draft"]))
    conv = Conversation(pair)
    conv.messages = [{"role": "user", "content": PROMPT}]
    ids = conv.prompt_tokens()
    conv.messages = []
    ref = reference_tokens(vanilla, ids, n)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.3, seed=1, vocab=pair.target.vocab_size)
    conv.block_sizer = lambda max_block: Schedule(sizes)
    events = list(conv.generate(PROMPT, GenerationSettings(max_tokens=n, block_size="auto")))
    return events[-1].tokens, ref, events


def test_target_alone_steps_after_cut_short_verifies(gpt_oss):
    tokens, ref, events = scheduled_run(gpt_oss.dirs, gpt_oss.vanilla, [6, 1, 1])
    assert len(ref) == N_TOKENS and tokens == ref
    cut = [e for e in events if isinstance(e, Block) and e.drafted and e.accepted < len(e.drafted)]
    assert len(cut) >= 3  # verifies cut short, each followed by target-alone steps


def test_mlx_lm_ring_cache_fails_the_same_run(gpt_oss, monkeypatch):
    """The bug WindowKVCache fixes: trimming mlx-lm's RotatingKVCache after a cut-short verify."""
    monkeypatch.setattr(Target, "make_cache", lambda self: make_prompt_cache(self.model))
    tokens, ref, _ = scheduled_run(gpt_oss.dirs, gpt_oss.vanilla, [6, 1, 1])
    assert tokens != ref


def test_second_turn_past_the_window_reuses_the_cache(gpt_oss):
    pair = load_pair(str(gpt_oss.dirs["target"]), str(gpt_oss.dirs["draft"]))
    conv = Conversation(pair)
    for i, text in enumerate([PROMPT, "Now the same for three numbers, please."]):
        ids = Conversation(pair).prompt_tokens(conv.messages + [{"role": "user", "content": text}])
        ref = reference_tokens(gpt_oss.vanilla, ids, N_TOKENS)
        conv.propose = oracle_proposer(ids + ref, error_rate=0.2, seed=i, vocab=pair.target.vocab_size)
        events = list(conv.generate(text, GenerationSettings(max_tokens=N_TOKENS)))
        assert events[-1].tokens == ref, f"turn {i}"
    assert events[0].cached_tokens > 16  # truncated within the history, past the 16-token window


def test_qwen3_next_needs_its_gated_deltanet_rollback(tmp_path_factory, tokenizer_dir, monkeypatch):
    rep = replica("qwen3-coder-next", tmp_path_factory.mktemp("qwen3_next"), tokenizer_dir)
    tokens, ref, _ = scheduled_run(rep.dirs, rep.vanilla, [4], n=16)
    assert tokens == ref
    monkeypatch.setattr(gdn_tape, "restore", lambda cache, keep: gdn_tape.disarm(cache))  # the planted bug
    tokens, ref, _ = scheduled_run(rep.dirs, rep.vanilla, [4], n=16)
    assert tokens != ref
