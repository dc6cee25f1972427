"""The draft trainer: training forward == inference forward, end-to-end runs, checkpoints, resume."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from dflash_tui.engine.draft import DFlashDraft, DraftConfig, load_draft
from dflash_tui.training.common import lr_at
from dflash_tui.training.draft_forward import block_mask, block_tokens, train_hidden


def tiny_draft_config(**over) -> DraftConfig:
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                intermediate_size=64, vocab_size=50, block_size=4, mask_token_id=3, target_layer_ids=[0, 1],
                num_target_layers=2)
    base.update(over)
    return DraftConfig(**base)


def _inference_block(draft: DFlashDraft, embeds: mx.array, feats: mx.array) -> mx.array:
    """What one engine cycle computes: context pushed into a fresh cache, then the block."""
    return draft(embeds, feats, draft.make_cache())


REFERENCE_FEATURES = [  # the config fields the reference draft runs by (docs/draft-parity.md)
    {},
    dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3, attention_bias=True,
         input_embedding_scale=1.5),
    dict(layer_types=["sliding_attention", "sliding_attention"], sliding_window=5, is_causal=False),
    dict(is_causal=True, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
]


@pytest.mark.parametrize("features", range(len(REFERENCE_FEATURES)))
@pytest.mark.parametrize("anchor", [1, 7, 13])
def test_training_forward_equals_inference_for_one_block(anchor, features):
    mx.random.seed(0)
    draft = DFlashDraft(tiny_draft_config(**REFERENCE_FEATURES[features]))
    mx.eval(draft.parameters())
    table = mx.random.normal((50, 32))
    tokens = mx.random.randint(4, 50, (1, 20))
    feats = mx.random.normal((1, 20, 64))
    anchors = mx.array([[anchor]])
    blocks = block_tokens(tokens, anchors, 4, 3)
    assert blocks[0].tolist() == [tokens[0, anchor].item(), 3, 3, 3]
    trained = train_hidden(draft, table[blocks], feats, anchors)
    # the inference path sees exactly the context before the anchor
    reference = _inference_block(draft, table[blocks], feats[:, :anchor])
    assert mx.allclose(trained, reference, atol=1e-5).item()


@pytest.mark.parametrize("layers", [{}, dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                              sliding_window=4, attention_bias=True)])
def test_blocks_do_not_see_each_other(layers):
    """Several blocks in one training pass each equal their own inference cycle."""
    mx.random.seed(1)
    draft = DFlashDraft(tiny_draft_config(num_hidden_layers=3, **layers))
    mx.eval(draft.parameters())
    table = mx.random.normal((50, 32))
    tokens = mx.random.randint(4, 50, (2, 24))
    feats = mx.random.normal((2, 24, 64))
    anchors = mx.array([[2, 9, 9, 20], [5, 6, 17, 22]])  # repeats and neighbours too
    blocks = block_tokens(tokens, anchors, 4, 3)
    trained = train_hidden(draft, table[blocks], feats, anchors)
    for b in range(2):
        for j in range(4):
            a = anchors[b, j].item()
            ref = _inference_block(draft, table[blocks[b : b + 1, 4 * j : 4 * j + 4]], feats[b : b + 1, :a])
            assert mx.allclose(trained[b, 4 * j : 4 * j + 4], ref[0], atol=1e-5).item(), (b, j)


def test_block_mask_shape_and_window():
    """Windows count from each query's own position (z-lab/dflash@07ebd93 `_attention_mask`)."""
    mask = block_mask(mx.array([[3, 6]]), context_len=8, block_size=2, window=2)
    assert mask.shape == (1, 1, 4, 12)
    rows = np.array(mask[0, 0])
    assert rows[0, :8].tolist() == [False, False, True, False, False, False, False, False]  # position 3 sees 2
    assert rows[1, :8].tolist() == [False] * 8  # position 4 would see 3: the block's own slot, not context
    assert rows[2, :8].tolist() == [False] * 5 + [True, False, False]
    assert rows[0, 8:].tolist() == [True, True, False, False]  # bidirectional within the block
    assert rows[3, 8:].tolist() == [False, False, True, True]
    causal = np.array(block_mask(mx.array([[3, 6]]), context_len=8, block_size=2, window=2, causal=True)[0, 0])
    assert causal[0, 8:].tolist() == [True, False, False, False] and causal[1, 8:].tolist() == [True, True, False, False]


def test_lr_schedule_warms_up_then_decays():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01)


# -- end to end on a tiny random pair ----------------------------------------
# tiny_target: tests/conftest.py


def _prompts_file(path: Path, n: int) -> Path:
    rows = [{"prompt": f"def f{i}(x): return x + {i}"} for i in range(n - 1)]
    rows.append({"messages": [{"role": "user", "content": "push an item"}, {"role": "assistant", "content": "dropped"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_draft_cli_end_to_end_and_resume(tiny_target, tmp_path, capsys):
    from dflash_tui.cli import main

    prompts = _prompts_file(tmp_path / "prompts.jsonl", 20)
    out = tmp_path / "draft"
    common = ["train-draft", "--target", str(tiny_target), "--prompts", str(prompts), "--out", str(out),
              "--layers", "1", "--block-size", "4", "--batch-size", "4", "--anchors", "4", "--seq-len", "64",
              "--max-new-tokens", "24", "--lr", "3e-3", "--eval-prompts", "2", "--eval-max-tokens", "12",
              "--checkpoint-every", "20", "--no-compile"]
    assert main(common + ["--steps", "40"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 40 and summary["mean_tokens_per_cycle"] >= 1.0

    metrics = json.loads((out / "trainer_state" / "metrics.json").read_text())
    assert metrics["train"]["final_loss"] < metrics["train"]["first_loss"] - 0.2  # it learns
    assert len(metrics["eval"]["prompts"]) == 2

    # the checkpoint is a z-lab draft the engine loads, with the trained weights
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
    assert cfg["dflash_config"]["mask_token_id"] == 3 and cfg["num_target_layers"] == 3
    draft = load_draft(str(out), dtype=mx.float32)
    state = mx.load(str(out / "trainer_state" / "draft.safetensors"))
    from mlx.utils import tree_flatten

    for name, value in tree_flatten(draft.parameters()):
        assert mx.allclose(value, state[name].astype(mx.bfloat16).astype(mx.float32)).item(), name

    # resume continues the same run to a longer schedule
    assert main(common + ["--steps", "50", "--resume"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 50


def test_init_from_a_saved_draft_goes_on_from_its_weights(tiny_target, tmp_path, capsys):
    from mlx.utils import tree_flatten

    from dflash_tui.cli import main
    from dflash_tui.engine.loading import load_target
    from dflash_tui.training.trainer import TrainConfig, init_draft, make_draft_config
    from dflash_tui.engine.draft import DFlashDraft

    prompts = _prompts_file(tmp_path / "prompts.jsonl", 12)
    first = tmp_path / "first"
    common = ["train-draft", "--target", str(tiny_target), "--prompts", str(prompts), "--layers", "1",
              "--block-size", "4", "--batch-size", "4", "--anchors", "4", "--seq-len", "64", "--max-new-tokens", "16",
              "--lr", "3e-3", "--eval-prompts", "0", "--checkpoint-every", "0", "--no-compile"]
    assert main(common + ["--out", str(first), "--steps", "30"]) == 0
    first_loss = json.loads((first / "trainer_state" / "metrics.json").read_text())["train"]["final_loss"]

    # the new run's draft starts as the saved one, not as a copy of the target's layers
    target = load_target(str(tiny_target))
    cfg = TrainConfig(layers=1, block_size=4, init=str(first))
    draft = DFlashDraft(make_draft_config(target, cfg))
    assert init_draft(draft, target, cfg.init, seed=1) > 0
    saved = dict(tree_flatten(load_draft(str(first), dtype=mx.float32).parameters()))
    for name, value in tree_flatten(draft.parameters()):
        assert mx.array_equal(value, saved[name]).item(), name

    # and a run that goes on from it starts near where the first one ended
    second = tmp_path / "second"
    assert main(common + ["--out", str(second), "--steps", "5", "--init", str(first), "--lr", "1e-4"]) == 0
    capsys.readouterr()
    fresh_first = json.loads((first / "trainer_state" / "metrics.json").read_text())["train"]["first_loss"]
    went_on = json.loads((second / "trainer_state" / "metrics.json").read_text())["train"]["first_loss"]
    assert abs(went_on - first_loss) < abs(fresh_first - first_loss)

    # a checkpoint of another shape is one clear error
    rc = main(common + ["--out", str(tmp_path / "third"), "--steps", "1", "--init", str(first), "--layers", "2"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "shape differs" in err and "num_hidden_layers" in err and "Traceback" not in err


def test_resume_without_a_run_is_one_clear_error(tiny_target, tmp_path, capsys):
    from dflash_tui.cli import main

    prompts = _prompts_file(tmp_path / "p.jsonl", 4)
    rc = main(["train-draft", "--target", str(tiny_target), "--prompts", str(prompts), "--out", str(tmp_path / "x"),
               "--steps", "1", "--resume"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "nothing to resume" in err and "Traceback" not in err


def test_bad_prompts_file_is_one_clear_error(tiny_target, tmp_path, capsys):
    from dflash_tui.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    assert main(["train-draft", "--target", str(tiny_target), "--prompts", str(bad), "--out", str(tmp_path / "o")]) != 0
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_compiled_step_matches_plain(tiny_target, tmp_path):
    from dflash_tui.engine.loading import load_target
    from dflash_tui.training.trainer import TrainConfig, train_draft

    target = load_target(str(tiny_target))
    prompts = [[{"role": "user", "content": f"add {i} and {i + 1}"}] for i in range(8)]
    losses = []
    for compiled in (False, True):
        cfg = TrainConfig(layers=1, block_size=4, steps=3, batch_size=4, anchors=4, seq_len=64, max_new_tokens=16,
                          checkpoint_every=0, compile=compiled)
        losses.append(train_draft(target, prompts, tmp_path / f"c{compiled}", cfg)["train"]["final_loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_step_budget_fits_the_pace_after_the_slow_first_steps():
    from dflash_tui.training.common import StepBudget

    budget = StepBudget(seconds=10.0, steps=None, window=10, first_fit=5)
    elapsed = 3.0  # the first step pays for compiling
    assert not budget.tick(1, elapsed)
    for step in range(2, 31):
        elapsed += 0.1
        assert not budget.tick(step, elapsed)
    assert budget.fitted
    assert 69 <= budget.total <= 72  # 30 done, 4.1 s left at 0.1 s a step
    assert budget.tick(31, 10.5)


def test_step_budget_with_fixed_steps_keeps_them():
    from dflash_tui.training.common import StepBudget

    budget = StepBudget(seconds=None, steps=7)
    assert budget.total == 7 and budget.fitted and not budget.tick(3, 1e9)
