"""The draft computes what z-lab's reference computes, on the same weights (docs/draft-parity.md).

Each case is a small random fp32 checkpoint written by `save_draft`, run for two cycles (a
prefill's context, then a few committed tokens) by our engine's draft step and by z-lab's
MLX reference (`dflash.model_mlx` of dflash 0.1.0, in a subprocess: it patches mlx-lm
classes); the draft logits must agree to 1e-4. Every case also checks that the fields it
covers matter: with one of them changed, our logits must move well past the tolerance.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from dflash_tui import random_pair as rp
from dflash_tui.engine.draft import DFlashDraft, DraftConfig, load_draft, save_draft
from dflash_tui.engine.draft_step import block_logits, block_proposals
from dflash_tui.engine.loading import load_target

REFERENCE = "0.1.0"  # the dflash release read for these facts; a newer one may decide differently
TOL = 1e-4
RUNNER = Path(__file__).with_name("reference_draft_runner.py")
SAMPLE_T = 0.7  # the runner's sampling temperature
STEPS = [(11, 4), (3, 4)]  # (context tokens pushed, block size) per cycle: 11 outruns the windows

SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]
# name -> (config fields, perturbations that must change the logits)
CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    # the reference's default: sliding layers causal within the block, full layers bidirectional
    "sliding_causal": (
        dict(layer_types=SLIDING, sliding_window=5, input_embedding_scale=1.7, output_multiplier=0.6,
             final_logit_softcapping=3.0),
        [dict(sliding_window=6), dict(is_causal=False), dict(input_embedding_scale=1.0),
         dict(output_multiplier=1.0), dict(final_logit_softcapping=None)],
    ),
    "sliding_bidirectional_yarn": (
        dict(layer_types=SLIDING, sliding_window=4, is_causal=False, rope_theta=10_000.0,
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
        [dict(sliding_window=3), dict(is_causal=None), dict(rope_scaling=None)],
    ),
    "full_causal_llama3": (
        dict(is_causal=True, rope_theta=500_000.0,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8}),
        [dict(is_causal=None), dict(rope_scaling=None)],
    ),
    "attention_bias": (dict(attention_bias=True), [dict(zero="_proj.bias")]),
    # DFlash2DraftModel, shaped like the published Qwen3.8 one: all sliding, bidirectional
    "dflash2": (
        dict(layer_types=["sliding_attention"] * 3, sliding_window=5, is_causal=False, conv_kernel_size=2,
             conv_group_size=16, selector_rank=8, selector_top_k=5),
        [dict(zero="base_kernel"), dict(zero="kernel_projection.weight"), dict(sliding_window=4)],
    ),
}


def _reference_installed() -> None:
    try:
        got = version("dflash")
    except PackageNotFoundError:
        pytest.fail(f"the draft parity test needs z-lab's reference: python -m pip install --no-deps dflash=={REFERENCE}")
    if got != REFERENCE:
        pytest.fail(f"the draft parity test was written against dflash {REFERENCE}, found {got}")


def _draft_config(target_cfg: dict[str, Any], mask: int, fields: dict[str, Any]) -> DraftConfig:
    base = rp.draft_config_for(target_cfg, mask, layers=3, block_size=4, target_layer_ids=[0, 1, 3],
                               intermediate=96)
    return replace(base, **fields)


def _ours(target, draft: DFlashDraft, features: list[mx.array], tokens: list[int]) -> list[np.ndarray]:
    cache = draft.make_cache()
    return [np.array(block_logits(target, draft, cache, t, b, f)) for (_, b), f, t in zip(STEPS, features, tokens)]


def _perturbed(draft: DFlashDraft, change: dict[str, Any]) -> DFlashDraft:
    """The same weights under a changed config, or with the weights named by `zero` zeroed."""
    change = dict(change)
    zero = change.pop("zero", None)
    weights = {k: (mx.zeros_like(v) if zero and k.endswith(zero) else v)
               for k, v in tree_flatten(draft.parameters())}
    other = DFlashDraft(replace(draft.config, **change))
    other.load_weights(list(weights.items()))
    return other


def _build(out_dir: Path, cfg: DraftConfig, seed: int) -> None:
    mx.random.seed(seed)
    draft = DFlashDraft(cfg)
    if cfg.is_dflash2:  # weights that make every DFlash2 part count (the fixed kernels start at zero)
        scaled = {k: v * 4 for k, v in tree_flatten(draft.parameters()) if "candidate_selector" in k}
        kernels = {k: mx.random.normal(v.shape) * 0.5 for k, v in tree_flatten(draft.parameters())
                   if k.endswith("base_kernel")}
        draft.load_weights(list((scaled | kernels).items()), strict=False)
    save_draft(draft, out_dir, dtype=mx.float32)


@pytest.fixture(scope="module")
def parity_run(qwen3_dirs, tmp_path_factory):
    """Build every case, run the reference once over all of them."""
    _reference_installed()
    root = tmp_path_factory.mktemp("parity")
    target_dir = qwen3_dirs["target"]
    target_cfg = json.loads((target_dir / "config.json").read_text())
    mask = rp.mask_token_id(target_dir)
    k = 3 * int(target_cfg["hidden_size"])
    rng = np.random.default_rng(0)
    inputs = {f"f{i}": rng.standard_normal((1, n, k)).astype(np.float32) for i, (n, _) in enumerate(STEPS)}
    tokens = [int(t) for t in rng.integers(5, 300, len(STEPS))]
    np.savez(root / "inputs.npz", **inputs)
    job: dict[str, Any] = {"target": str(target_dir), "inputs": str(root / "inputs.npz"),
                           "out": str(root / "ref.npz"), "cases": []}
    for i, (name, (fields, _)) in enumerate(CASES.items()):
        _build(root / name, _draft_config(target_cfg, mask, fields), seed=10 + i)
        job["cases"].append({"name": name, "draft": str(root / name), "bias": bool(fields.get("attention_bias")),
                             "steps": [{"token": t, "b": b, "features": f"f{j}"}
                                       for j, ((_, b), t) in enumerate(zip(STEPS, tokens))]})
    (root / "job.json").write_text(json.dumps(job))
    run = subprocess.run([sys.executable, str(RUNNER), str(root / "job.json")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ref = dict(np.load(root / "ref.npz"))
    assert str(ref["version"]) == REFERENCE
    features = [mx.array(inputs[f"f{i}"]) for i in range(len(STEPS))]
    return load_target(str(target_dir)), root, ref, features, tokens


@pytest.mark.parametrize("case", list(CASES))
def test_draft_logits_match_the_reference(parity_run, case):
    target, root, ref, features, tokens = parity_run
    draft = load_draft(str(root / case), dtype=mx.float32)
    ours = _ours(target, draft, features, tokens)
    for i, got in enumerate(ours):
        want = ref[f"{case}/{i}"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= TOL, (case, i, float(np.abs(got - want).max()))
    if draft.config.is_dflash2:
        _selector_matches(target, draft, features, tokens, ref, case, ours)
    # the fields this case covers change what the draft computes: a wrong one fails above
    for change in CASES[case][1]:
        moved = _ours(target, _perturbed(draft, change), features, tokens)
        gap = max(float(np.abs(m - r).max()) for m, r in zip(moved, ours))
        assert gap > 100 * TOL, (case, change, gap)


def _selector_matches(target, draft: DFlashDraft, features, tokens, ref, case: str, logits: list[np.ndarray]) -> None:
    """The greedy path: the reference's ids, and not merely the logits' argmax. Sampling: the
    first position's q is the reference's, and every drawn id has q > 0 (the rest of the path
    hangs on the draws)."""
    cache = draft.make_cache()
    steps = [block_proposals(target, draft, cache, t, b, f) for (_, b), f, t in zip(STEPS, features, tokens)]
    greedy = [np.array(step.greedy()) for step in steps]
    for i, (step, ids) in enumerate(zip(steps, greedy)):
        assert ids.tolist() == ref[f"{case}/{i}/tokens"].tolist(), (case, i)
        drawn, q = (np.array(x) for x in step.sample(SAMPLE_T, mx.random.key(i)))
        assert np.allclose(q.sum(-1), 1.0, atol=1e-5) and (q[np.arange(len(drawn)), drawn] > 0).all()
        assert np.abs(q[0, ref[f"{case}/{i}/candidates"]] - ref[f"{case}/{i}/q"]).max() <= TOL
    assert any((ids != row.argmax(-1)).any() for ids, row in zip(greedy, logits))
