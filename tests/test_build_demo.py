"""The demo build script end to end on a miniature corpus: target, saved regeneration, draft, evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash_tui.engine.draft import load_draft
from dflash_tui.engine.loading import load_target
from dflash_tui.training import build_demo
from dflash_tui.training.corpus import read_examples, write_corpus
from dflash_tui.training.trainer import Sequences

TINY_SHAPE = ["--hidden", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
              "--intermediate", "64", "--seq-len", "128", "--vocab-size", "400", "--no-compile"]


def _source_tree(root: Path, n: int = 400) -> Path:
    """Many small documented functions: enough requests that the hash split holds some out."""
    root.mkdir(parents=True)
    verbs = ["Return", "Compute", "Build", "Parse", "Format", "Count"]
    nouns = ["the sum", "a list", "the name", "a mapping", "the total", "a string"]
    lines = []
    for i in range(n):
        doc = f"{verbs[i % 6]} {nouns[(i // 6) % 6]} of item number {i} for the caller."
        lines.append(f'def func_{i}(a, b):\n    """{doc}"""\n    total = a + b * {i}\n    return total\n\n')
    (root / "mod.py").write_text("".join(lines))
    return root


def test_build_demo_regenerates_once_then_trains_on_the_saved_data(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    write_corpus([_source_tree(tmp_path / "src")], corpus, named_per_cent=0)
    assert read_examples(corpus / "heldout.jsonl"), "the miniature corpus should hold some requests out"
    work, target_dir, draft_dir = tmp_path / "work", tmp_path / "target", tmp_path / "draft"
    common = ["--work", str(work), "--corpus", str(corpus), "--target-out", str(target_dir),
              "--draft-out", str(draft_dir), *TINY_SHAPE]

    # stage 1: target + regeneration only
    assert build_demo.main([*common, "--target-steps", "4", "--target-batch", "4", "--regen-prompts", "6",
                            "--regen-batch", "4", "--max-new-tokens", "12", "--regen-only"]) == 0
    metrics = json.loads((work / "metrics.json").read_text())
    assert metrics["target"]["params"] > 0
    assert 0 < metrics["regeneration"]["sequences"] <= 6
    assert not draft_dir.exists(), "--regen-only must stop before the draft"
    saved = Sequences.load(work / "sequences.npz")
    assert len(saved.tokens) == metrics["regeneration"]["sequences"]
    assert all(len(t) > p for t, p in zip(saved.tokens, saved.prompt_lens))
    target = load_target(str(target_dir))
    assert target.num_layers == 2

    # stage 2: the draft from the saved regeneration, with the target reused
    assert build_demo.main([*common, "--skip-target", "--sequences", str(work / "sequences.npz"),
                            "--draft-layers", "1", "--draft-steps", "3", "--draft-batch", "2", "--anchors", "2",
                            "--block-size", "4", "--eval-prompts", "1", "--eval-max-tokens", "8"]) == 0
    metrics = json.loads((work / "metrics.json").read_text())
    assert metrics["draft"]["steps"] == 3
    assert metrics["draft"]["sequences"] == len(saved.tokens), "the draft must train on the saved data"
    assert metrics["eval"]["mean_tokens_per_cycle"] >= 1.0
    draft = load_draft(str(draft_dir))
    assert draft.config.block_size == 4 and draft.config.num_target_layers == 2
    assert np.isfinite(metrics["draft"]["final_loss"])
