"""The published DFlash pair families, as data for tiny replicas (tests/replicas.py builds them).

Each family names its real target's architecture at tiny widths (hidden 64,
a 384-token tokenizer in a 392-row embedding) and its real draft's published
config (real_drafts/, see real_drafts/SOURCES.md). What a replica keeps of the
real target: model_type, tied or untied head, head_dim apart from or equal to
hidden/heads as the real one has it, the GQA ratio, MoE routing (top-k, shared
expert, norm), the layer pattern (hybrid interval, sliding/full alternation),
sliding windows and attention sinks, rope type and scaling. Widths, expert
counts (at most 64) and layer counts are cut; windows become 16 tokens so a
short generation runs past them. Real target configs are not on disk: their
values here are the public Hugging Face configs as known (SOURCES.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REAL_DRAFTS = Path(__file__).parent / "real_drafts"
WINDOW = 16  # replica sliding window (real: gpt-oss 128, Gemma 4 1024)


def real_draft(name: str, **fields: Any) -> dict[str, Any]:
    """A published draft config (real_drafts/<name>.json), plus fields known from elsewhere."""
    cfg = json.loads((REAL_DRAFTS / f"{name}.json").read_text())
    cfg.update(fields)
    return cfg


def table_draft(layers: int, hidden: int, ffn: int, heads: int, kv: int, block: int, sliding: int,
                window: Optional[int], ids: list[int], n_target: int, **fields: Any) -> dict[str, Any]:
    """A draft config from the published-config inspection table (SOURCES.md): z-lab's
    Qwen3-style layout with `sliding` sliding-attention layers before the full ones."""
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "num_hidden_layers": layers, "intermediate_size": ffn, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": 128, "rms_norm_eps": 1e-6, "attention_bias": False,
        "layer_types": ["sliding_attention"] * sliding + ["full_attention"] * (layers - sliding),
        "sliding_window": window, "use_sliding_window": window is not None, "num_target_layers": n_target,
        "block_size": block, "dflash_config": {"target_layer_ids": ids},
    }
    cfg.update(fields)
    return cfg


@dataclass(frozen=True)
class Family:
    name: str
    target: dict[str, Any]  # tiny mlx-lm config.json (vocab, eos and dtype are filled in by the builder)
    real_layers: int  # the real target's layer count (the draft's target_layer_ids refer to it)
    draft: dict[str, Any]  # the real draft's config
    draft_source: str
    dtype: str = "bfloat16"  # MoE replicas are float32: MLX CPU's GatherMM takes only float32
    quantize: bool = False  # 4-bit, by mlx-lm's own quantize_model
    notes: tuple[str, ...] = field(default_factory=tuple)


# -- tiny target configs per model_type ---------------------------------------------

def qwen3(layers: int, heads: int, kv: int, head_dim: int, tie: bool, rope_theta: float = 1e6) -> dict[str, Any]:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": layers,
            "intermediate_size": 128, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "rope_theta": rope_theta, "tie_word_embeddings": tie}


def qwen3_moe(layers: int, heads: int, kv: int, head_dim: int, experts: int, top_k: int) -> dict[str, Any]:
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
            "num_hidden_layers": layers, "intermediate_size": 128, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": head_dim, "num_experts": experts, "num_experts_per_tok": top_k,
            "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "rope_theta": 1e7, "tie_word_embeddings": False}


def qwen3_5(layers: int, heads: int, kv: int, head_dim: int, tie: bool, experts: int = 0, top_k: int = 0,
            linear_v_heads: int = 4) -> dict[str, Any]:
    """Gated DeltaNet + gated full attention every 4th layer (Qwen3.5 / Qwen3.6)."""
    moe = experts > 0
    text: dict[str, Any] = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": layers,
        "intermediate_size": 128, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "linear_num_key_heads": 2, "linear_num_value_heads": linear_v_heads, "linear_key_head_dim": 32,
        "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": tie, "attn_output_gate": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    }
    if moe:
        text.update({"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": 32,
                     "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1, "norm_topk_prob": True})
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text, "tie_word_embeddings": tie}


def qwen3_next(layers: int) -> dict[str, Any]:
    """Qwen3-Coder-Next (Qwen3-Next-80B-A3B layout): hybrid, 512 experts top-10 + shared expert."""
    return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
            "num_hidden_layers": layers, "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 1,
            "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
            "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "num_experts": 64, "num_experts_per_tok": 10,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "full_attention_interval": 4, "partial_rotary_factor": 0.25,
            "rope_theta": 5e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False}


def llama3(layers: int) -> dict[str, Any]:
    """Llama 3.1: GQA 4, head_dim = hidden/heads, llama3 rope scaling."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": layers,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}


def gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    """gpt-oss: sliding/full alternation, attention sinks and q/k/v/o biases, top-4 experts, YaRN."""
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": layers,
            "intermediate_size": 64, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 16,
            "num_local_experts": experts, "num_experts_per_tok": 4, "sliding_window": WINDOW, "rms_norm_eps": 1e-5,
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2), "rope_theta": 150000,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 4096, "truncate": False},
            "max_position_embeddings": 131072, "initial_context_length": 4096, "tie_word_embeddings": False}


def gemma4(layers: int, moe: bool) -> dict[str, Any]:
    """Gemma 4 26B-A4B / 31B: 5 sliding : 1 full, a wider K=V global head, proportional rope on the
    full layers, logit soft-capping, tied head; the 26B adds a routed expert block beside the MLP."""
    text: dict[str, Any] = {
        "model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": layers, "intermediate_size": 128,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "global_head_dim": 64,
        "num_global_key_value_heads": 1, "attention_k_eq_v": True, "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0, "sliding_window": WINDOW, "sliding_window_pattern": 6,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6),
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }
    if moe:
        text.update({"enable_moe_block": True, "num_experts": 64, "top_k_experts": 8, "moe_intermediate_size": 32})
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text}


def layer_kinds(target: dict[str, Any], n: int) -> list[str]:
    """The layer pattern of this target's architecture at `n` layers, as mlx-lm builds it."""
    text = target.get("text_config", target)
    kind = target["model_type"]
    if kind in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        every = int(text.get("full_attention_interval", 4))
        return ["full" if (i + 1) % every == 0 else "linear" for i in range(n)]
    if kind == "gpt_oss":
        return ["sliding", "full"] * (n // 2)
    if kind == "gemma4":
        every = int(text.get("sliding_window_pattern", 6))
        return ["full" if (i + 1) % every == 0 else "sliding" for i in range(n)]
    return ["full"] * n


Q35_4B = real_draft("Qwen3.5-4B-DFlash.current")
Q35_35B = real_draft("Qwen3.5-35B-A3B-DFlash.current")
GPT_OSS_20B = real_draft("gpt-oss-20b-DFlash")


def _sliding(layers: int, sliding: int) -> list[str]:
    return ["sliding_attention"] * sliding + ["full_attention"] * (layers - sliding)


QWEN3_4B = qwen3(8, heads=4, kv=1, head_dim=32, tie=True)
QWEN3_8B = qwen3(8, heads=4, kv=1, head_dim=16, tie=False)
QWEN35_4B = qwen3_5(12, heads=4, kv=1, head_dim=32, tie=True)
QWEN35_27B = qwen3_5(12, heads=6, kv=1, head_dim=32, tie=False, linear_v_heads=6)
QWEN35_35B = qwen3_5(12, heads=8, kv=1, head_dim=16, tie=False, experts=64, top_k=8)
Q35_ROPE = {"rope_parameters": {"rope_theta": 10000000, "rope_type": "default"}, "vocab_size": 248320,
            "max_position_embeddings": 262144}

QWEN36_27B_DRAFT = table_draft(5, 5120, 17408, 32, 8, block=16, sliding=4, window=2048, ids=[1, 16, 31, 46, 61],
                               n_target=64, **Q35_ROPE)

FAMILIES: list[Family] = [
    Family("qwen3-4b", QWEN3_4B, 36,
           real_draft("Qwen3-4B-DFlash-b16", num_hidden_layers=5, layer_types=_sliding(5, 0), num_attention_heads=32,
                      num_key_value_heads=8, num_target_layers=36, vocab_size=151936, rope_theta=1000000),
           "copy of the published config (its 3 layer_types are one user's variant: 5 layers, 32/8 heads from the table)"),
    Family("qwen3-8b", QWEN3_8B, 36, real_draft("Qwen3-8B-DFlash-b16"), "published config"),
    Family("qwen3-coder-30b-a3b", qwen3_moe(8, heads=8, kv=1, head_dim=16, experts=64, top_k=8), 48,
           real_draft("Qwen3-Coder-30B-A3B-DFlash"), "published config", dtype="float32"),
    Family("qwen3.5-4b", QWEN35_4B, 32, Q35_4B, "published config (current)"),
    Family("qwen3.5-9b", qwen3_5(12, heads=4, kv=1, head_dim=16, tie=False), 32,
           real_draft("Qwen3.5-9B-DFlash.v1", num_hidden_layers=6, layer_types=_sliding(6, 5), sliding_window=4096,
                      use_sliding_window=True, dflash_config={"mask_token_id": 248070,
                                                              "target_layer_ids": [1, 5, 9, 13, 17, 21, 25, 29]}),
           "published v1 config, current layers/window/ids from the table"),
    Family("qwen3.5-27b", QWEN35_27B, 64,
           real_draft("Qwen3.5-27B-DFlash.v1.partial", num_hidden_layers=6, layer_types=_sliding(6, 5), sliding_window=4096,
                      dflash_config={"mask_token_id": 248070, "target_layer_ids": [1, 10, 18, 27, 35, 44, 52, 61]}),
           "published v1 fields, current layers/window (published) and ids (table)"),
    Family("qwen3.5-35b-a3b", QWEN35_35B, 40, Q35_35B, "published config (current)", dtype="float32"),
    Family("qwen3.5-122b-a10b", qwen3_5(16, heads=16, kv=1, head_dim=16, tie=False, experts=64, top_k=8, linear_v_heads=8), 48,
           table_draft(6, 3072, 9216, 32, 8, block=16, sliding=5, window=4096, ids=[1, 7, 14, 20, 26, 32, 39, 45],
                       n_target=48, **Q35_ROPE), "table", dtype="float32"),
    Family("qwen3.6-27b", QWEN35_27B, 64, QWEN36_27B_DRAFT, "table"),
    Family("qwen3.6-35b-a3b", QWEN35_35B, 40,
           table_draft(6, 2048, 6144, 32, 8, block=16, sliding=5, window=4096, ids=[1, 6, 11, 16, 22, 27, 32, 37],
                       n_target=40, **Q35_ROPE), "table", dtype="float32"),
    Family("qwen3-coder-next", qwen3_next(20), 48,
           table_draft(8, 2048, 6144, 32, 4, block=16, sliding=0, window=None, ids=[3, 11, 23, 35, 43], n_target=48,
                       rope_theta=10000000, vocab_size=151936, max_position_embeddings=262144),
           "table (its ids all sit on full-attention layers: the replica has 5 of them)", dtype="float32"),
    Family("llama-3.1-8b", llama3(8), 32,
           real_draft("LLaMA3.1-8B-Instruct-DFlash-UltraChat.partial", model_type="llama", architectures=["DFlashDraftModel"],
                      intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128, block_size=10,
                      layer_types=_sliding(5, 0), rms_norm_eps=1e-5, vocab_size=128256, rope_theta=500000.0,
                      rope_scaling=llama3(1)["rope_scaling"], max_position_embeddings=131072),
           "published fields + table (block 10); rope copied from the target (assumed)"),
    Family("gpt-oss-20b", gpt_oss(8, experts=32), 24, GPT_OSS_20B, "published config", dtype="float32"),
    Family("gpt-oss-120b", gpt_oss(10, experts=64), 36,
           dict(GPT_OSS_20B, block_size=10, num_target_layers=36,
                dflash_config={"mask_token_id": 200000, "target_layer_ids": [1, 9, 17, 25, 33]}),
           "gpt-oss-20b's published config with the table's block 10 and ids", dtype="float32"),
    Family("gemma-4-31b", gemma4(18, moe=False), 60,
           table_draft(5, 5376, 10752, 64, 8, block=16, sliding=4, window=2048, ids=[1, 12, 23, 35, 46, 57], n_target=60,
                       vocab_size=262144), "table"),
    Family("gemma-4-26b-a4b", gemma4(18, moe=True), 30,
           table_draft(5, 2816, 5632, 32, 8, block=16, sliding=4, window=2048, ids=[1, 6, 11, 17, 22, 27], n_target=30,
                       vocab_size=262144), "table", dtype="float32"),
    Family("qwen3-8b-4bit", QWEN3_8B, 36, real_draft("Qwen3-8B-DFlash-b16"), "published config", quantize=True),
    Family("qwen3.6-27b-4bit", qwen3_5(8, heads=6, kv=1, head_dim=32, tie=False, linear_v_heads=6), 64,
           QWEN36_27B_DRAFT, "table", quantize=True),
]

BY_NAME = {f.name: f for f in FAMILIES}
