"""By hand, not in CI: our draft against z-lab's torch reference itself (dflash 0.1.0
`dflash/model.py`, the code of z-lab/dflash@07ebd93) on the same weights.

Needs torch and transformers next to the reference (`pip install torch`; the reference with
`--no-deps`). Prints, per case, the largest logit difference over three cycles; every
case should be below 1e-4 in fp32 (it was below 6e-6 with torch 2.13 and transformers 5.25).

usage: python tests/torch_reference_check.py WORK_DIR [CASE ...]
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx
import numpy as np
import torch
from dflash.model import DFlash2DraftModel, DFlashDraftModel, _crop_to, _draft_value, _make_cache
from mlx.utils import tree_flatten
from safetensors.numpy import load_file

from dflash_tui import random_pair as rp
from dflash_tui.engine.draft import load_draft, save_draft
from dflash_tui.engine.draft_step import block_logits, block_proposals
from dflash_tui.engine.loading import load_target

STEPS = [(11, 4), (3, 4), (2, 6)]  # (context tokens, block size) per cycle
SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
Edit = Optional[Callable[[dict[str, Any]], Any]]
CASES: dict[str, tuple[dict[str, Any], Edit]] = {
    "plain": ({}, None),
    "sliding_causal_scales": (dict(layer_types=SLIDING, sliding_window=5, input_embedding_scale=1.7,
                                   output_multiplier=0.6, final_logit_softcapping=3.0), None),
    "bidirectional_window_below_block": (dict(layer_types=SLIDING, sliding_window=3, is_causal=False), None),
    "bias_yarn": (dict(attention_bias=True, rope_theta=150000.0, rope_scaling=dict(_YARN, factor=32.0)), None),
    "yarn_truncate_false_attention_factor": (dict(rope_theta=1e4, rope_scaling=dict(
        _YARN, truncate=False, attention_factor=1.3, beta_fast=8)), None),
    "yarn_lone_mscale": (dict(rope_theta=1e4, rope_scaling=dict(_YARN, mscale=0.7)), None),
    "llama3_causal": (dict(is_causal=True, rope_theta=5e5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}), None),
    "linear": (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), None),
    "rope_parameters_only": ({}, lambda c: (c.pop("rope_theta"), c.pop("rope_scaling"),
                                            c.update(rope_parameters={"rope_theta": 3000.0, "rope_type": "default"}))),
    "top_level_scales": ({}, lambda c: c.update(input_embedding_scale=2.0, output_multiplier=0.5,
                                                final_logit_softcapping=2.5)),
    "no_layer_types": ({}, lambda c: (c.pop("layer_types"), c.update(sliding_window=3, use_sliding_window=True,
                                                                     max_window_layers=1))),
    "dflash2": (dict(layer_types=["sliding_attention"] * 3, sliding_window=5, is_causal=False, conv_kernel_size=2,
                     conv_group_size=16, selector_rank=8, selector_top_k=5), None),
}


def _dflash2_weights(d: Path) -> None:
    """Random fixed kernels (they start at zero) and a selector strong enough to leave the argmax."""
    draft = load_draft(str(d), dtype=mx.float32)
    flat = dict(tree_flatten(draft.parameters()))
    new = {k: mx.random.normal(v.shape) * 0.5 for k, v in flat.items() if k.endswith("base_kernel")}
    new |= {k: v * 4 for k, v in flat.items() if "candidate_selector" in k}
    draft.load_weights(list(new.items()), strict=False)
    save_draft(draft, d, dtype=mx.float32)


def main(work: Path, only: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    tdir = work / "target"
    if not tdir.exists():
        rp.build_target(tdir, kind="qwen3", seed=0, tie=False)
    tcfg = json.loads((tdir / "config.json").read_text())
    mask = rp.mask_token_id(tdir)
    tw = load_file(str(tdir / "model.safetensors"))
    embed, head = torch.tensor(tw["model.embed_tokens.weight"]), torch.tensor(tw["lm_head.weight"])
    target = load_target(str(tdir))
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((1, n, 3 * tcfg["hidden_size"])).astype(np.float32) for n, _ in STEPS]
    toks = [int(t) for t in rng.integers(5, 300, len(STEPS))]
    for i, (name, (fields, edit)) in enumerate(CASES.items()):
        if only and name not in only:
            continue
        d = work / name
        shutil.rmtree(d, ignore_errors=True)
        base = rp.draft_config_for(tcfg, mask, layers=3, block_size=6, target_layer_ids=[0, 1, 3], intermediate=96)
        rp.build_draft(d, replace(base, **fields), seed=20 + i)
        if edit:
            c = json.loads((d / "config.json").read_text())
            edit(c)
            (d / "config.json").write_text(json.dumps(c))
        if "conv_kernel_size" in fields:
            _dflash2_weights(d)
        ours_draft = load_draft(str(d), dtype=mx.float32)
        cache, ours = ours_draft.make_cache(), []
        for (_, b), f, t in zip(STEPS, feats, toks):
            ours.append(np.array(block_logits(target, ours_draft, cache, t, b, mx.array(f))))
        cache, our_ids = ours_draft.make_cache(), []
        for (_, b), f, t in zip(STEPS, feats, toks):
            step = block_proposals(target, ours_draft, cache, t, b, mx.array(f))
            our_ids.append(np.array(step.greedy()) if ours_draft.selects else None)
        kind = DFlash2DraftModel if ours_draft.config.is_dflash2 else DFlashDraftModel
        ref = kind.from_pretrained(str(d), attn_implementation="sdpa", dtype=torch.float32).eval()
        scale = float(_draft_value(ref.config, "input_embedding_scale", 1.0))
        pkv, start, refs, same_ids = _make_cache(ref.config), 0, [], True
        with torch.no_grad():  # the steps of the reference's `dflash_generate`
            for (n, b), f, t in zip(STEPS, feats, toks):
                start += n
                noise = torch.nn.functional.embedding(torch.tensor([[t] + [mask] * (b - 1)]), embed) * scale
                pos = torch.arange(start - n, start + b)[None]
                h = ref(target_hidden=torch.tensor(f), noise_embedding=noise, position_ids=pos,
                        past_key_values=pkv, use_cache=True)[:, 1:]
                _crop_to(pkv, start)
                refs.append(ref.compute_logits(h, lambda x: x @ head.T)[0].numpy())
                if kind is DFlash2DraftModel:
                    ids = ref.propose(h, torch.tensor([t]), lambda x: x @ head.T, 0.0)[0][0].numpy()
                    same_ids &= ids.tolist() == our_ids[len(refs) - 1].tolist()
        diff = max(float(np.abs(a - r).max()) for a, r in zip(ours, refs))
        print(f"{name:40s} max |ours - torch| = {diff:.2e}" + ("" if same_ids else "  SELECTED IDS DIFFER"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
