"""Random-weight target/draft pairs written in the real checkpoint formats.

Used by the tests (tiny pairs loaded back through `mlx_lm.load` and the draft
loader) and by the benchmarks (pairs shaped like real models). Nothing here is
a trained model: it exists so real code paths can run without a model hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from dflash_tui.engine.draft import DFlashDraft, DraftConfig, save_draft

_SAMPLE_TEXT = """\
def add(a, b):
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

The quick brown fox jumps over the lazy dog. Speculative decoding drafts a block
of tokens and the target verifies them in one forward pass; accepted tokens are
kept and the first rejected one is replaced by the target's own token.
for i in range(10): print(i, i * i, {"key": [1, 2, 3]})
"""


def build_tokenizer(out_dir: Path, vocab_size: int = 384, text: Optional[str] = None) -> dict[str, int]:
    """Train a byte-level BPE tokenizer with ChatML special tokens; returns their ids."""
    from dflash_tui.training.tokenizer import train_tokenizer  # the demo target's own recipe

    return train_tokenizer((text or _SAMPLE_TEXT).splitlines(keepends=True) * 4, out_dir, vocab_size=vocab_size)


def qwen3_config(vocab_size: int, hidden: int = 64, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                 head_dim: int = 16, intermediate: int = 128, tie: bool = True, eos_token_id: int = 2) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": tie,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }


def qwen3_5_config(vocab_size: int, hidden: int = 64, layers: int = 8, heads: int = 4, kv_heads: int = 2,
                   head_dim: int = 16, intermediate: int = 128, linear_k_heads: int = 2, linear_v_heads: int = 4,
                   linear_head_dim: int = 16, full_attention_interval: int = 4, tie: bool = True,
                   eos_token_id: int = 2, moe: bool = False) -> dict[str, Any]:
    text: dict[str, Any] = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 32768,
        "linear_num_key_heads": linear_k_heads,
        "linear_num_value_heads": linear_v_heads,
        "linear_key_head_dim": linear_head_dim,
        "linear_value_head_dim": linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": full_attention_interval,
        "tie_word_embeddings": tie,
        "attn_output_gate": True,
        "rope_parameters": {"rope_theta": 1_000_000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
    }
    if moe:
        text.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": intermediate // 2,
                     "shared_expert_intermediate_size": intermediate // 2, "decoder_sparse_step": 1,
                     "norm_topk_prob": True})
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": tie,
        "eos_token_id": eos_token_id,
    }


def build_model(config: dict[str, Any], seed: int = 0, scale: float = 1.0, dtype: mx.Dtype = mx.float32):
    """Instantiate an mlx-lm model from a config with seeded random weights."""
    from mlx_lm.utils import _get_classes  # the same class lookup mlx_lm.load uses

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    if scale != 1.0:
        model.update(_scaled(model.parameters(), scale))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def _scaled(params, scale):
    from mlx.utils import tree_map

    return tree_map(lambda p: p * scale if p.ndim >= 2 else p, params)


def save_target(model, config: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})


def build_target(out_dir: Path, kind: str = "qwen3", seed: int = 0, vocab_size: int = 384,
                 text: Optional[str] = None, scale: float = 4.0, dtype: str = "float32", **dims: Any) -> dict[str, Any]:
    """Tokenizer + random-weight mlx-lm target in `out_dir`, its weights stored in `dtype`
    ("float32" or "bfloat16", as published checkpoints are); returns the config.

    `scale` multiplies the random matrices: at mlx's default init a tiny model
    repeats one token forever, which would make exactness tests trivial.
    """
    ids = build_tokenizer(out_dir, vocab_size=vocab_size, text=text)
    vocab = max(ids.values()) + 1
    vocab = max(vocab, _tokenizer_size(out_dir))
    maker = {"qwen3": qwen3_config, "qwen3_5": qwen3_5_config}[kind]
    config = maker(vocab, eos_token_id=ids["<|im_end|>"], **dims)
    config["torch_dtype"] = dtype
    model = build_model(config, seed=seed, scale=scale, dtype=getattr(mx, dtype))
    save_target(model, config, out_dir)
    return config


def _tokenizer_size(out_dir: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(out_dir / "tokenizer.json")).get_vocab_size()


def draft_config_for(target_config: dict[str, Any], mask_token_id: int, layers: int = 2, block_size: int = 16,
                     target_layer_ids: Optional[list[int]] = None, **dims: Any) -> DraftConfig:
    text = target_config.get("text_config", target_config)
    n_target = int(text["num_hidden_layers"])
    ids = target_layer_ids or sorted({min(n_target - 1, max(0, round(i * (n_target - 1) / 3))) for i in range(3)})
    hidden = int(text["hidden_size"])
    return DraftConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=dims.get("heads", int(text["num_attention_heads"])),
        num_key_value_heads=dims.get("kv_heads", int(text["num_key_value_heads"])),
        head_dim=dims.get("head_dim", int(text.get("head_dim") or hidden // int(text["num_attention_heads"]))),
        intermediate_size=dims.get("intermediate", int(text["intermediate_size"])),
        vocab_size=int(text["vocab_size"]),
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=ids,
        num_target_layers=n_target,
    )


def build_draft(out_dir: Path, cfg: DraftConfig, seed: int = 1, dtype: mx.Dtype = mx.float32) -> DFlashDraft:
    mx.random.seed(seed)
    draft = DFlashDraft(cfg)
    mx.eval(draft.parameters())
    save_draft(draft, out_dir, dtype=dtype)
    return draft


def mask_token_id(target_dir: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json")).token_to_id("<|mask|>")
