"""Adaptive block size: the choice follows cost and acceptance; the output never changes."""

from __future__ import annotations

from conftest import oracle_proposer, reference_tokens
from dflash_tui.engine.adaptive import measure_costs
from dflash_tui.engine.block_sizer import EXPLORE, BlockSizer
from dflash_tui.engine.conversation import Conversation, GenerationSettings

FLAT = {b: 1.0 for b in (2, 4, 8, 16)}  # a device where a block costs the same whatever its size
STEEP = {b: 0.5 + 0.25 * b for b in (2, 4, 8, 16)}  # verify cost grows with the block


def test_expected_tokens_follow_acceptance():
    s = BlockSizer(FLAT, 16, prior=0.5, prior_weight=1.0)
    assert abs(s.expected_tokens(1) - 1.0) < 1e-9
    assert abs(s.expected_tokens(3) - (1 + 0.5 + 0.25)) < 1e-9


def test_choice_depends_on_cost_and_acceptance():
    good = BlockSizer(STEEP, 16)
    bad = BlockSizer(STEEP, 16)
    for _ in range(60):
        good.observe(16, 15)  # every proposal accepted
        bad.observe(16, 0)  # the first proposal always rejected
    assert good.choose() == 16
    assert bad.choose() == 2
    assert BlockSizer(FLAT, 16, prior=0.3).choose() == 16  # free extra positions are always worth it
    assert good.choose(left=3) == 3  # never past max_tokens


def test_a_draft_that_does_not_pay_gives_way_to_the_target_alone_and_is_tried_again():
    costs = {1: 0.75, **STEEP}  # a target step alone costs less than any drafted block
    s = BlockSizer(costs, 16)
    assert s.choose() > 1  # the prior expects the draft to pay
    for _ in range(60):
        s.observe(16, 0)  # the first proposal always rejected
    picks = [s.choose() for _ in range(3 * (EXPLORE + 1))]
    # the target steps alone, with one drafted block after every EXPLORE of those steps
    assert picks == ([1] * EXPLORE + [2]) * 3, picks
    for _ in range(60):
        s.observe(2, 1)  # ... and once the draft is accepted again, drafting resumes
    assert s.choose() > 1 and s.alone == 0


def test_peek_tells_the_next_choice_without_making_it():
    costs = {1: 0.75, **STEEP}
    s = BlockSizer(costs, 16)
    for _ in range(60):
        s.observe(16, 0)
    for _ in range(2 * (EXPLORE + 1)):  # through the target-alone stretches and the checks between them
        before = (s.alone, dict(s.chosen))
        nxt = s.peek()
        assert (s.alone, s.chosen) == before  # nothing counted
        assert s.choose() == nxt


def test_the_sizer_needs_no_mlx():
    import subprocess
    import sys

    code = "import sys, dflash_tui.engine.block_sizer; sys.exit(any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_new_stretch_of_text_takes_over_within_a_few_cycles():
    """A short reply must not run on what a long, easy one taught: after 60 fully accepted
    blocks, a few cycles that reject the second proposal bring the choice down."""
    s = BlockSizer(STEEP, 16)
    for _ in range(60):
        s.observe(16, 15)
    assert s.choose() == 16
    cycles = 0
    while s.choose() > 4:
        s.observe(s.choose(), 1)
        cycles += 1
        assert cycles <= 6, "still drafting long blocks"


def test_observe_counts_only_what_was_tested():
    s = BlockSizer(FLAT, 8, prior=0.5, prior_weight=0.001, decay=1.0)  # plain counts
    s.observe(8, 2)  # positions 1, 2 accepted, 3 rejected, 4.. never tested
    assert s.accept_rate(1) > 0.99 and s.accept_rate(2) > 0.99 and s.accept_rate(3) < 0.01
    assert abs(s.accept_rate(4) - 2 / 3) < 0.02  # untested: the pooled rate


def test_measured_costs_cover_the_sizes(qwen3_pair):
    costs = measure_costs(qwen3_pair.target, qwen3_pair.draft, (1, 2, 8, 16), context=16, reps=1)
    assert set(costs) == {1, 2, 8, 16} and all(c > 0 for c in costs.values())


def test_auto_block_size_is_exact_and_adapts(qwen3_pair):
    conv = Conversation(qwen3_pair)
    conv.messages.append({"role": "user", "content": "adapt"})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(qwen3_pair, ids, 150)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.0, vocab=qwen3_pair.target.vocab_size)
    conv._sizer = BlockSizer(STEEP, 16, prior=0.2)  # a known cost curve; a low prior starts small
    events = list(conv.generate("adapt", GenerationSettings(max_tokens=150, block_size="auto")))
    done = events[-1]
    assert done.tokens == ref
    assert done.stats["block_size"] == "auto" and done.stats["block_sizes"]
    # a draft that is always right pushes the choice from small blocks to the largest
    sizes = [len(e.drafted) + 1 for e in events if getattr(e, "drafted", None)]
    assert sizes[0] < 8 and sizes[-3:-1] == [16, 16], sizes


def test_target_alone_steps_between_drafted_blocks_keep_the_output_exact(qwen3_pair):
    conv = Conversation(qwen3_pair)
    conv.messages.append({"role": "user", "content": "alone"})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(qwen3_pair, ids, 120)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.6, seed=3, vocab=qwen3_pair.target.vocab_size)
    # drafting barely pays here: the sizer mixes target-alone steps with drafted blocks
    conv._sizer = BlockSizer({1: 1.0, 2: 1.5, 4: 2.5, 8: 5.0, 16: 10.0}, 16, prior=0.3)  # up to 16: kept
    events = list(conv.generate("alone", GenerationSettings(max_tokens=120, block_size="auto")))
    done = events[-1]
    assert done.tokens == ref
    blocks = [e for e in events if e.type == "block"]
    alone = [e for e in blocks[1:] if not e.drafted]  # the first block is the prefill's token
    assert alone and any(e.drafted for e in blocks) and done.stats["block_sizes"].get("1", done.stats["block_sizes"].get(1))
