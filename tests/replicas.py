"""Build a family's tiny replica pair (tests/families.py) in the real checkpoint formats.

The target is mlx-lm's own model class with seeded random weights, saved as
mlx-lm saves a model (4-bit ones through mlx-lm's `quantize_model`, with the
`quantization` block in config.json). The draft is a z-lab-format checkpoint
written from its config alone (the published config with widths cut, its
target_layer_ids moved onto the replica's layers of the same kinds), not from
the engine's draft class, so a field the engine does not read yet (say
`attention_bias`) still shapes the weights on disk as the real file does.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx

from dflash_tui import random_pair as rp
from families import Family, layer_kinds

VOCAB_PAD = 8  # embedding rows past the tokenizer's last id, as published models pad theirs
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tokenizer(out_dir: Path) -> None:
    """The replicas' shared tokenizer (byte-level BPE, ChatML template), its special ids and
    size in specials.json."""
    ids = rp.build_tokenizer(out_dir, vocab_size=384)
    (out_dir / "specials.json").write_text(json.dumps(dict(ids, size=rp._tokenizer_size(out_dir))))


def build_pair(family: Family, root: Path, tokenizer_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Write the replica target and draft under `root`; returns their dirs and the mask token id."""
    specials = json.loads((tokenizer_dir / "specials.json").read_text())
    n_tok = specials["size"]
    target_dir, draft_dir = root / "target", root / "draft"
    target_dir.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, target_dir / name)
    config = target_config(family, vocab=n_tok + VOCAB_PAD, eos=specials["<|im_end|>"])
    save_target(family, config, target_dir, n_tok, seed)
    draft = draft_config(family, n_tok)
    save_draft(draft, draft_dir, seed + 1)
    return {"target": target_dir, "draft": draft_dir, "mask_token_id": n_tok, "draft_config": draft}


# -- target --------------------------------------------------------------------------

def target_config(family: Family, vocab: int, eos: int) -> dict[str, Any]:
    config = copy.deepcopy(family.target)
    config["vocab_size"] = vocab  # Gemma 4 passes its top-level vocab_size down to the text model
    if "text_config" in config:
        config["text_config"]["vocab_size"] = vocab
    config["eos_token_id"] = eos
    config["torch_dtype"] = family.dtype
    return config


def save_target(family: Family, config: dict[str, Any], out_dir: Path, n_tok: int, seed: int) -> None:
    from mlx_lm.utils import quantize_model, save_config, save_model

    model = rp.build_model(config, seed=seed, scale=4.0, dtype=mx.float32)
    _randomize_constants(model)
    _calm_embedding(model)
    _silence_padding(model, n_tok, config["eos_token_id"])
    model.set_dtype(getattr(mx, family.dtype))
    if family.quantize:
        model, config = quantize_model(model, config, group_size=64, bits=4)
        save_model(out_dir, model)
        save_config(config, config_path=out_dir / "config.json")
    else:
        rp.save_target(model, config, out_dir)


def _language_model(model: Any) -> Any:
    return model.language_model if hasattr(model, "language_model") else model


def _randomize_constants(model: Any) -> None:
    """Parameters mlx-lm initialises to a constant and a trained model has not: gpt-oss's
    attention sinks (zeros would leave them untested)."""
    for layer in _language_model(model).model.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "sinks"):
            attn.sinks = mx.random.normal(attn.sinks.shape)


def _silence_padding(model: Any, n_tok: int, eos: int) -> None:
    """Zero the head rows of ids past the tokenizer (the mask token among them), like a published
    model's untrained padding, and of EOS, so every reply runs its full length past the windows."""
    lm = _language_model(model)
    head = getattr(lm, "lm_head", None) or lm.model.embed_tokens
    ids = mx.arange(head.weight.shape[0])
    head.weight = head.weight * ((ids < n_tok) & (ids != eos))[:, None]


def _calm_embedding(model: Any) -> None:
    """Gemma multiplies its embedding by sqrt(hidden), which a trained embedding is small for: a
    random one that large drowns the layers and the tied head echoes the input token forever."""
    backbone = _language_model(model).model
    scale = getattr(backbone, "embed_scale", None)
    if scale:
        backbone.embed_tokens.weight = backbone.embed_tokens.weight / scale


# -- draft ---------------------------------------------------------------------------

def scale_layer_ids(real_ids: list[int], real_kinds: list[str], kinds: list[str]) -> list[int]:
    """Move target_layer_ids onto a shorter stack: each id goes to a layer of the same kind
    (linear / full / sliding), in order, as near its relative depth as the kinds allow."""
    n, n_real = len(kinds), len(real_kinds)
    want = [i * (n - 1) / (n_real - 1) for i in real_ids]
    inf = float("inf")
    # best[k][j]: least total displacement placing the first k ids with the k-th at layer j
    best = [[inf] * n for _ in real_ids]
    back = [[-1] * n for _ in real_ids]
    for k, (i, w) in enumerate(zip(real_ids, want)):
        for j in range(n):
            if kinds[j] != real_kinds[i]:
                continue
            if k == 0:
                best[k][j] = abs(j - w)
                continue
            prev = min(range(j), key=lambda p: best[k - 1][p], default=None)
            if prev is not None and best[k - 1][prev] < inf:
                best[k][j] = best[k - 1][prev] + abs(j - w)
                back[k][j] = prev
    j = min(range(n), key=lambda p: best[-1][p])
    if best[-1][j] == inf:
        raise ValueError(f"{n} layers cannot hold {real_ids} on their kinds")
    out = [j]
    for k in range(len(real_ids) - 1, 0, -1):
        j = back[k][j]
        out.append(j)
    return out[::-1]


def _draft_heads(real: dict[str, Any]) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) at hidden 64: the real GQA ratio, and head_dim equal to
    hidden/heads only where the real one is."""
    heads, kv = int(real["num_attention_heads"]), int(real["num_key_value_heads"])
    ratio = heads // kv
    real_dim = int(real.get("head_dim") or real["hidden_size"] // heads)
    if real_dim * heads == int(real["hidden_size"]):
        return ratio, 1, 64 // ratio
    return ratio, 1, 32 if 64 // ratio != 32 else 16


def draft_config(family: Family, n_tok: int) -> dict[str, Any]:
    """The family's published draft config at the replica's widths."""
    real = family.draft
    cfg = copy.deepcopy(real)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids of the real tokenizer
        cfg.pop(name, None)
    heads, kv, head_dim = _draft_heads(real)
    text = family.target.get("text_config", family.target)
    n = int(text["num_hidden_layers"])
    dflash = dict(cfg.get("dflash_config") or {})
    real_ids = dflash.get("target_layer_ids", cfg.get("target_layer_ids"))
    ids = scale_layer_ids(real_ids, layer_kinds(family.target, family.real_layers), layer_kinds(family.target, n))
    cfg.update(hidden_size=64, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
               intermediate_size=128, vocab_size=n_tok + VOCAB_PAD, num_target_layers=n)
    cfg["num_hidden_layers"] = len(cfg.get("layer_types") or []) or int(real["num_hidden_layers"])
    if cfg.get("sliding_window"):
        cfg["sliding_window"] = max(16, int(cfg["sliding_window"]) // 128)  # 4096 -> 32, 2048 -> 16
    dflash.update(target_layer_ids=ids, mask_token_id=n_tok)  # the first id past the tokenizer
    cfg.pop("target_layer_ids", None)
    cfg.pop("mask_token_id", None)
    cfg["dflash_config"] = dflash
    return cfg


def draft_weights(cfg: dict[str, Any], seed: int) -> dict[str, mx.array]:
    """Random weights under z-lab's names and shapes for this config (biases where it has
    attention_bias)."""
    mx.random.seed(seed)
    h, nh, nkv, hd, inter = (int(cfg[k]) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                     "head_dim", "intermediate_size"))
    k = len(cfg["dflash_config"]["target_layer_ids"])
    bias = bool(cfg.get("attention_bias"))

    def linear(name: str, out: int, inp: int, with_bias: bool = False) -> None:
        bound = inp**-0.5
        w[f"{name}.weight"] = mx.random.uniform(-bound, bound, (out, inp))
        if with_bias:
            w[f"{name}.bias"] = mx.random.uniform(-bound, bound, (out,))

    w: dict[str, mx.array] = {}
    linear("fc", h, k * h)
    w["hidden_norm.weight"] = mx.ones((h,))
    w["norm.weight"] = mx.ones((h,))
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"layers.{i}"
        linear(f"{p}.self_attn.q_proj", nh * hd, h, bias)
        linear(f"{p}.self_attn.k_proj", nkv * hd, h, bias)
        linear(f"{p}.self_attn.v_proj", nkv * hd, h, bias)
        linear(f"{p}.self_attn.o_proj", h, nh * hd, bias)
        w[f"{p}.self_attn.q_norm.weight"] = mx.ones((hd,))
        w[f"{p}.self_attn.k_norm.weight"] = mx.ones((hd,))
        linear(f"{p}.mlp.gate_proj", inter, h)
        linear(f"{p}.mlp.up_proj", inter, h)
        linear(f"{p}.mlp.down_proj", h, inter)
        w[f"{p}.input_layernorm.weight"] = mx.ones((h,))
        w[f"{p}.post_attention_layernorm.weight"] = mx.ones((h,))
    return {name: v.astype(mx.bfloat16) for name, v in w.items()}  # published drafts are bf16


def save_draft(cfg: dict[str, Any], out_dir: Path, seed: int) -> None:
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    mx.save_safetensors(str(out_dir / "model.safetensors"), draft_weights(cfg, seed), metadata={"format": "pt"})
