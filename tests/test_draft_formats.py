"""Published draft formats load: a gpt-oss draft (attention biases, YaRN, no num_target_layers) and a
DFlash2 draft (`DFlash2DraftModel`: convolutions, candidate selector), which also decodes exactly."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from dflash_tui import random_pair as rp
from dflash_tui.engine.draft import DFlashDraft, load_draft, save_draft
from dflash_tui.engine.draft_step import block_logits, block_proposals
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block
from dflash_tui.engine.loading import check_fit, load_pair, load_target
from dflash_tui.errors import UserError
from dflash_tui.training.draft_forward import train_hidden

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


def _dflash2_draft(qwen3_dirs, out_dir) -> DFlashDraft:
    """A DFlash2 draft for the test target, saved as published (Qwen3.8-27B-DFlash2's layout)."""
    tcfg = json.loads((qwen3_dirs["target"] / "config.json").read_text())
    cfg = rp.draft_config_for(tcfg, rp.mask_token_id(qwen3_dirs["target"]), layers=2, block_size=8)
    cfg = replace(cfg, layer_types=["sliding_attention"] * 2, sliding_window=16, is_causal=False,
                  conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)
    mx.random.seed(3)
    draft = DFlashDraft(cfg)
    save_draft(draft, out_dir, dtype=mx.float32)
    return draft


def test_dflash2_checkpoint_is_in_the_published_layout(qwen3_dirs, tmp_path):
    _dflash2_draft(qwen3_dirs, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["is_causal"] is False
    assert {k: cfg["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                "selector_top_k")} == {"conv_kernel_size": 2, "conv_group_size": 16,
                                                                       "selector_rank": 8, "selector_top_k": 4}
    names = set(mx.load(str(tmp_path / "model.safetensors")))
    assert "candidate_selector.predecessor_codebook" in names and "layers.1.mlp_conv.base_kernel" in names
    assert load_draft(str(tmp_path)).config.is_dflash2


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_dflash2_draft_decodes_exactly(qwen3_dirs, tmp_path, temperature):
    _dflash2_draft(qwen3_dirs, tmp_path / "draft")
    pair = load_pair(str(qwen3_dirs["target"]), str(tmp_path / "draft"), draft_dtype=mx.float32)
    settings = dict(max_tokens=40, temperature=temperature, seed=7)
    events = list(Conversation(pair).generate("hi there", GenerationSettings(block_size=8, **settings)))
    alone = list(Conversation(pair).generate("hi there", GenerationSettings(baseline=True, **settings)))[-1]
    got = events[-1]
    if temperature == 0.0:
        assert got.tokens == alone.tokens  # greedy: the target's own output, token for token
    drafted = [e.drafted for e in events if isinstance(e, Block) and e.drafted]
    assert drafted and all(len(d) <= 7 for d in drafted) and 0 < len(got.tokens) <= 40


def test_dflash2_training_is_refused_in_one_line(qwen3_dirs, tmp_path):
    draft = _dflash2_draft(qwen3_dirs, tmp_path)
    with pytest.raises(UserError, match="DFlash2"):
        train_hidden(draft, mx.zeros((1, 8, 64)), mx.zeros((1, 12, 3 * 64)), mx.array([[2]]))


def test_dflash2_without_its_fields_is_one_line(qwen3_dirs, tmp_path):
    _dflash2_draft(qwen3_dirs, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["dflash_config"]["selector_top_k"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="DFlash2 draft needs"):
        load_draft(str(tmp_path))


def test_dflash2_sampled_path_follows_its_q(qwen3_dirs, tmp_path):
    """Each drawn id comes from the q handed to rejection sampling: position 0, and position 1
    given the commonest first draw (q of later positions hangs on the draws before)."""
    from collections import Counter

    from test_sampling import PASS, chi_square_p

    draft = _dflash2_draft(qwen3_dirs, tmp_path)
    target = load_target(str(qwen3_dirs["target"]))
    step = block_proposals(target, draft, draft.make_cache(), 5, 4, mx.random.normal((1, 6, 3 * 64)))
    draws = [tuple(np.array(x) for x in step.sample(1.0, mx.random.key(s))) for s in range(2000)]
    q0 = draws[0][1][0]
    assert chi_square_p(Counter(int(ids[0]) for ids, _ in draws), dict(enumerate(q0))) > PASS
    top = Counter(int(ids[0]) for ids, _ in draws).most_common(1)[0][0]
    given = [(ids, q) for ids, q in draws if ids[0] == top]
    assert chi_square_p(Counter(int(ids[1]) for ids, _ in given), dict(enumerate(given[0][1][1]))) > PASS
