"""Published draft formats load: a gpt-oss draft (attention biases, YaRN, no num_target_layers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from dflash_tui import random_pair as rp
from dflash_tui.engine.draft import load_draft
from dflash_tui.engine.draft_step import block_logits
from dflash_tui.engine.loading import check_fit, load_target

# z-lab/gpt-oss-20b-DFlash config.json as shipped (2026-04-20), dimensions shrunk to the test target's
GPT_OSS_DRAFT = {
    "architectures": ["DFlashDraftModel"], "attention_bias": True, "attention_dropout": 0.0, "block_size": 8,
    "bos_token_id": 199998, "dtype": "bfloat16", "eos_token_id": 200002, "hidden_act": "silu",
    "initial_context_length": 4096, "initializer_range": 0.02, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
    # shrunk: 2880 hidden, 64/8 heads of 64, 7680 intermediate, 8 layers, 5 target layers, vocab 201088
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 96, "num_hidden_layers": 2,
}


def _torch_named_weights(cfg: dict[str, Any], n_feats: int, seed: int) -> dict[str, mx.array]:
    """Random weights under the torch reference's parameter names."""
    rng = np.random.default_rng(seed)
    H, D = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D, cfg["intermediate_size"]
    shapes = {"fc.weight": (H, n_feats * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                   p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                   p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                   p + "mlp.down_proj.weight": (H, inter)}
        for name, (o, i_) in {"q": (q, H), "k": (kv, H), "v": (kv, H), "o": (H, q)}.items():
            shapes |= {p + f"self_attn.{name}_proj.weight": (o, i_), p + f"self_attn.{name}_proj.bias": (o,)}
    return {k: mx.array(rng.standard_normal(s).astype(np.float32) * (1.0 if len(s) == 1 else s[-1] ** -0.5))
            for k, s in shapes.items()}


def test_gpt_oss_draft_loads_with_its_biases(qwen3_dirs, tmp_path):
    target_dir = qwen3_dirs["target"]
    tcfg = json.loads((target_dir / "config.json").read_text())
    cfg = dict(GPT_OSS_DRAFT, vocab_size=tcfg["vocab_size"],
               dflash_config={"mask_token_id": rp.mask_token_id(target_dir), "target_layer_ids": [0, 1, 3]})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    weights = _torch_named_weights(cfg, 3, seed=0)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    draft = load_draft(str(tmp_path), dtype=mx.float32)
    c = draft.config
    assert c.attention_bias and c.num_target_layers is None and c.layer_types == ["full_attention"] * 2
    assert c.rope_scaling["rope_type"] == "yarn" and c.block_size == 8 and not c.layer_causal(0)
    assert mx.array_equal(draft.layers[1].self_attn.o_proj.bias, weights["layers.1.self_attn.o_proj.bias"]).item()
    target = load_target(str(target_dir))
    check_fit(target, draft)  # no num_target_layers: nothing to compare it with
    logits = block_logits(target, draft, draft.make_cache(), 5, 8, mx.random.normal((1, 6, 3 * 64)))
    assert logits.shape == (7, tcfg["vocab_size"]) and np.isfinite(np.array(logits)).all()


def test_missing_bias_is_one_clear_error(qwen3_dirs, tmp_path):
    tcfg = json.loads((qwen3_dirs["target"] / "config.json").read_text())
    cfg = dict(GPT_OSS_DRAFT, vocab_size=tcfg["vocab_size"], dflash_config={"mask_token_id": 3, "target_layer_ids": [0]})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    weights = {k: v for k, v in _torch_named_weights(cfg, 1, seed=0).items() if not k.endswith("q_proj.bias")}
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    with pytest.raises(Exception) as err:
        load_draft(str(tmp_path))
    assert "q_proj.bias" in str(err.value)
