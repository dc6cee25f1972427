"""Runs draft checkpoints through z-lab's MLX reference (`dflash.model_mlx`, PyPI dflash 0.1.0)
and writes their logits; `test_draft_parity.py` starts it in a subprocess, because the
reference patches mlx-lm classes.

usage: python reference_draft_runner.py JOB.json
JOB: {"target": dir, "inputs": npz, "out": npz, "cases": [{"name", "draft": dir, "bias": bool,
      "steps": [{"token": int, "b": int, "features": npz key}]}]}
Writes out[f"{name}/{i}"] = the draft logits [b-1, V] of step i (fp32); for a DFlash2 draft also
its selector's greedy ids, and at temperature SAMPLE_T the first position's candidates and q.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

SAMPLE_T = 0.7


def _with_attention_biases(ref) -> None:
    """The MLX reference builds q/k/v/o without biases; the torch reference
    (z-lab/dflash@07ebd93, dflash/model.py `Qwen3DFlashAttention`) builds each as
    `nn.Linear(..., bias=config.attention_bias)`, the bias added before q_norm/k_norm.
    Give the MLX reference's projections biases the same way."""
    plain_init = ref.DFlashAttention.__init__

    def init(self, config, layer_idx):
        plain_init(self, config, layer_idx)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out_dim, in_dim = getattr(self, name).weight.shape
            setattr(self, name, nn.Linear(in_dim, out_dim, bias=True))

    ref.DFlashAttention.__init__ = init
    ref.DFlashAttention._plain_init = plain_init


def _plain_attention(ref) -> None:
    if hasattr(ref.DFlashAttention, "_plain_init"):
        ref.DFlashAttention.__init__ = ref.DFlashAttention._plain_init
        del ref.DFlashAttention._plain_init


def main(job_file: str) -> None:
    import dflash.model_mlx as ref
    from mlx_lm.utils import load_model

    job = json.loads(Path(job_file).read_text())
    ref.snapshot_download = lambda repo_id, **_: repo_id  # local checkpoints: no hub
    target, _ = load_model(Path(job["target"]))
    inputs = dict(np.load(job["inputs"]))
    out: dict[str, np.ndarray] = {}
    for case in job["cases"]:
        (_with_attention_biases if case.get("bias") else _plain_attention)(ref)
        draft = ref.load_draft(case["draft"]).bind(target)
        mask = int(draft.config.mask_token_id)
        cache = draft.make_cache()
        for i, step in enumerate(case["steps"]):
            block = mx.array([[step["token"]] + [mask] * (step["b"] - 1)])
            features = mx.array(inputs[step["features"]])
            # the steps of the reference's `__call__` / `DFlash2DraftModel.propose`, kept apart
            hidden = draft.hidden_states(block, features, cache, logits_start=1)
            logits = draft.compute_logits(hidden)
            out[f"{case['name']}/{i}"] = np.array(logits[0].astype(mx.float32))
            if isinstance(draft, ref.DFlash2DraftModel):
                tokens, _, _ = draft.candidate_selector.select(hidden, logits, block[:, 0], 0.0)
                out[f"{case['name']}/{i}/tokens"] = np.array(tokens[0])
                # sampling: the first position's q (later ones hang on the random path)
                _, candidates, q = draft.candidate_selector.select(hidden, logits, block[:, 0], SAMPLE_T)
                out[f"{case['name']}/{i}/candidates"] = np.array(candidates[0, 0])
                out[f"{case['name']}/{i}/q"] = np.array(q[0, 0].astype(mx.float32))
    out["version"] = np.array(version("dflash"))
    np.savez(job["out"], **out)


if __name__ == "__main__":
    main(sys.argv[1])
