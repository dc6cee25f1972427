"""What the torch reference does where the MLX reference is silent or differs (docs/draft-parity.md).

Facts read in z-lab/dflash@07ebd93 dflash/model.py (the same code as dflash 0.1.0 on PyPI)
and in transformers 5.25.0, which that model runs its config and RoPE through
(`Qwen3Config`, `modeling_rope_utils`); the numbers below were computed with them.
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from dflash_tui.engine.draft import DraftConfig, DraftLoadError, load_draft, visible_keys
from dflash_tui.engine.draft_rope import DraftRoPE, standard_rope

_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
# transformers' _compute_yarn_parameters (head_dim 16, theta 1e4, max_position_embeddings 32768)
YARN_FACTS = {
    "truncated": ({}, 1.138629436111989,
                  [1.0, 0.31622776, 0.1, 0.025693506, 0.00625, 0.0013834966, 0.00025, 7.9056947e-05]),
    "truncate_false_attention_factor": ({"truncate": False, "attention_factor": 1.3}, 1.3,
                                        [1.0, 0.31622776, 0.1, 0.02861361, 0.006556971, 0.0012856319, 0.00025,
                                         7.9056947e-05]),
    # a lone mscale is ignored (mlx-lm's YarnRoPE would give 1.097)
    "mscale_alone": ({"mscale": 0.7}, 1.138629436111989,
                     [1.0, 0.31622776, 0.1, 0.025693506, 0.00625, 0.0013834966, 0.00025, 7.9056947e-05]),
    # no factor: max_position_embeddings / original_max_position_embeddings
    "factor_from_lengths": ({"factor": None}, 1.2079441541679836,
                            [1.0, 0.31622776, 0.1, 0.024705295, 0.005625, 0.001087033, 0.000125, 3.9528473e-05]),
}


@pytest.mark.parametrize("case", list(YARN_FACTS))
def test_yarn_frequencies_and_attention_factor_are_transformers(case):
    extra, factor, inv_freq = YARN_FACTS[case]
    theta, scaling = standard_rope({"rope_theta": 10_000.0, "rope_scaling": dict(_YARN, **extra),
                                    "max_position_embeddings": 32768})
    rope = DraftRoPE(16, theta, scaling, 32768)
    assert rope.attention_factor == pytest.approx(factor, rel=1e-12)
    assert np.allclose(np.array(rope._inv_freq), inv_freq, rtol=1e-6, atol=0)
    # transformers scales cos and sin by the factor: the rotated vector is scaled, position 0 included
    x = mx.random.normal((1, 1, 1, 16))
    assert np.allclose(np.array(rope(x, offset=0)), np.array(x) * factor, rtol=1e-6, atol=1e-6)


def test_window_and_causality_rule():
    """07ebd93 `_attention_mask`: causal k <= q; window q - k < W, and k - q < W when bidirectional."""
    q, k = mx.arange(10, 14), mx.arange(0, 14)  # a block of 4 at 10..13 over 10 context keys
    bi = np.array(visible_keys(q, k, causal=False, window=3))
    assert np.flatnonzero(bi[0]).tolist() == [8, 9, 10, 11, 12]  # 2 back, itself, 2 ahead
    assert np.flatnonzero(bi[3]).tolist() == [11, 12, 13]
    causal = np.array(visible_keys(q, k, causal=True, window=3))
    assert np.flatnonzero(causal[0]).tolist() == [8, 9, 10]
    assert np.flatnonzero(np.array(visible_keys(q, k, causal=True, window=None))[1]).tolist() == list(range(12))
    assert visible_keys(q, k, causal=False, window=None) is None


def _config(**extra: Any) -> dict[str, Any]:
    base = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "intermediate_size": 64, "vocab_size": 50, "num_target_layers": 4,
            "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2]}}
    base.update(extra)
    return base


def test_config_reads_as_the_reference_reads_it():
    c = DraftConfig.from_dict(_config())
    assert (c.rope_theta, c.rope_scaling, c.layer_types) == (10_000.0, None, ["full_attention"] * 3)
    assert [c.layer_causal(i) for i in range(3)] == [False] * 3 and c.attention_bias is False
    # `_draft_value`: dflash_config first, then the top level
    c = DraftConfig.from_dict(_config(output_multiplier=0.5, final_logit_softcapping=30.0,
                                      dflash_config={"mask_token_id": 3, "target_layer_ids": [0, 2],
                                                     "output_multiplier": 2.0, "input_embedding_scale": 4.0}))
    assert (c.output_multiplier, c.final_logit_softcapping, c.input_embedding_scale) == (2.0, 30.0, 4.0)
    # the legacy rope_scaling wins over rope_parameters; theta from the dict, then the top level
    c = DraftConfig.from_dict(_config(rope_theta=7.0, rope_parameters={"rope_type": "default", "rope_theta": 9.0},
                                      rope_scaling={"type": "linear", "factor": 2.0, "rope_theta": 5.0}))
    assert c.rope_theta == 5.0 and c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert DraftConfig.from_dict(_config(rope_theta=7.0, rope_parameters={"rope_type": "default"})).rope_theta == 7.0
    # no layer_types: Qwen3Config's rule (sliding from max_window_layers on, with use_sliding_window)
    c = DraftConfig.from_dict(_config(sliding_window=8, use_sliding_window=True, max_window_layers=1))
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert [c.layer_causal(i) for i in range(3)] == [False, True, True]
    assert DraftConfig.from_dict(_config(sliding_window=8, max_window_layers=1)).layer_types == ["full_attention"] * 3
    # is_causal overrides the per-layer default, for every layer
    c = DraftConfig.from_dict(_config(is_causal=False, sliding_window=8,
                                      layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    assert [c.layer_causal(i) for i in range(3)] == [False] * 3 and c.layer_window(0) == 8 and c.layer_window(1) is None


def test_config_round_trips():
    c = DraftConfig.from_dict(_config(
        attention_bias=True, is_causal=True, sliding_window=8, use_sliding_window=True,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        dflash_config={"mask_token_id": 3, "target_layer_ids": [0, 2], "input_embedding_scale": 2.0,
                       "output_multiplier": 0.5, "final_logit_softcapping": 30.0}))
    assert DraftConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("rope", [{"rope_type": "longrope", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0},
                                  {"rope_type": "yarn"}, {"rope_type": "llama3", "factor": 8.0},
                                  {"rope_type": "default", "partial_rotary_factor": 0.5}])
def test_rope_the_draft_cannot_run_is_one_line(rope, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_config(architectures=["DFlashDraftModel"], rope_scaling=rope)))
    with pytest.raises(DraftLoadError) as err:
        load_draft(str(tmp_path))
    assert "rope" in str(err.value) and "\n" not in str(err.value)
