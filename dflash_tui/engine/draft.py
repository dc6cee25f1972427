"""The DFlash block-diffusion draft model and its loader (z-lab checkpoint format).

The draft has no embedding or head of its own: it embeds with the target's
`embed_tokens` and reads out through the target's head. Target features from a
few target layers are fused (`hidden_norm(fc(concat))`) and injected as extra
keys/values in every draft layer; queries come only from the block.

The forward follows z-lab's torch reference (github.com/z-lab/dflash@07ebd93,
dflash/model.py) field by field: docs/draft-parity.md says what each config field
does there and how tests/test_draft_parity.py holds us to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

from dflash_tui.engine.checkpoint import SHARD_BYTES, save_sharded
from dflash_tui.engine.config_values import ConfigReader, is_whole, shown
from dflash_tui.engine.cuda_kernels import block_attention, block_attention_fits, kernels_wanted
from dflash_tui.engine.draft2 import CandidateSelector, GroupedDynamicConv
from dflash_tui.engine.draft_rope import DraftRoPE, RopeConfigError, standard_rope
from dflash_tui.errors import UserError


class DraftLoadError(UserError):
    """A draft checkpoint is missing, malformed, or not a DFlash draft."""


DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# published DFlash2 checkpoints store the selector's codebooks without the `.weight` suffix
_CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


@dataclass
class DraftConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: Optional[int] = None  # informative: only checked against the target when given
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: Optional[dict[str, Any]] = None
    max_position_embeddings: int = 40960
    layer_types: list[str] = field(default_factory=list)
    sliding_window: Optional[int] = None  # the window of sliding_attention layers (None: no window)
    attention_bias: bool = False  # q/k/v/o projections carry biases
    is_causal: Optional[bool] = None  # None: causal in sliding_attention layers only (the reference's rule)
    input_embedding_scale: float = 1.0  # times the target's raw embedding rows
    output_multiplier: float = 1.0  # times the target head's logits
    final_logit_softcapping: Optional[float] = None  # then cap * tanh(logits / cap)
    # DFlash2 (`DFlash2DraftModel`): convolutions around each sublayer, a candidate selector; 0 = none
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0

    @property
    def is_dflash2(self) -> bool:
        return self.conv_kernel_size > 0

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else "full_attention"

    def layer_window(self, i: int) -> Optional[int]:
        return self.sliding_window if self.layer_type(i) == "sliding_attention" else None

    def layer_causal(self, i: int) -> bool:
        return self.layer_type(i) == "sliding_attention" if self.is_causal is None else bool(self.is_causal)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> "DraftConfig":
        """Read a z-lab `config.json` the way the torch reference's `Qwen3Config` reads it."""
        dcfg = cfg.get("dflash_config") or {}
        if not isinstance(dcfg, dict):
            raise DraftLoadError("draft config.json: dflash_config must be an object")

        def draft_value(name: str, default: Any = None) -> Any:
            # the reference's `_draft_value`: dflash_config first, then the top level
            return dcfg.get(name, cfg.get(name, default))

        # every count and size a whole number within bounds, first: 10**18 layers would build a list that long
        r = ConfigReader(cfg, "draft config.json")
        n_layers, heads, hidden = r.int("num_hidden_layers"), r.int("num_attention_heads"), r.int("hidden_size")
        head_dim, kv_heads = r.int("head_dim", None, (None, 0)), r.int("num_key_value_heads", None, (None, 0))
        inter, vocab, window = r.int("intermediate_size"), r.int("vocab_size"), r.int("sliding_window", None, (None,))
        max_pos = r.int("max_position_embeddings", 32768, (None, 0))  # Qwen3Config's default
        window_from, n_target = r.int("max_window_layers", 28), r.int("num_target_layers", None, (None,))
        own = ConfigReader({**cfg, **dcfg}, "draft config.json")
        own.problems = r.problems  # one list: every bad key named at once
        block, mask = own.int("block_size", 16, (None,)), own.int("mask_token_id")
        ids = draft_value("target_layer_ids")
        if ids == []:
            r.note("target_layer_ids is empty", 0)
        elif not (isinstance(ids, list) and all(is_whole(i) and 0 <= i < 10_000 for i in ids)):
            r.note(f"target_layer_ids is {shown(ids)}, not a list of layer numbers", 0)
        if r.problems:
            raise DraftLoadError(f"draft config.json: {'; '.join(r.problems)}")
        try:
            theta, scaling = standard_rope(cfg)
            DraftRoPE(head_dim or hidden // heads, theta, scaling, max_pos)  # refuses what it cannot run
            # without layer_types, Qwen3Config's rule: sliding from max_window_layers on, if use_sliding_window
            # (it also drops the window without use_sliding_window, and then its cache cannot be built for
            # sliding layers: the MLX reference keeps the window, and so do we)
            sliding_from = window_from if cfg.get("use_sliding_window") and window else n_layers
            types = cfg.get("layer_types") or [
                "sliding_attention" if i >= sliding_from else "full_attention" for i in range(n_layers)
            ]
            cap = draft_value("final_logit_softcapping")
            v2 = "DFlash2DraftModel" in (cfg.get("architectures") or [])
            conv = [int(draft_value(k, 0)) if v2 else 0 for k in DFLASH2_FIELDS]
            if v2 and (min(conv) <= 0 or hidden % conv[1]):
                raise DraftLoadError("a DFlash2 draft needs dflash_config conv_kernel_size, conv_group_size "
                                     f"(dividing hidden_size), selector_rank and selector_top_k > 0, not {conv}")
            causal = cfg.get("is_causal")
            out = cls(
                hidden_size=hidden,
                num_hidden_layers=n_layers,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads or heads,
                head_dim=head_dim or hidden // heads,
                intermediate_size=inter,
                vocab_size=vocab,
                block_size=block,
                mask_token_id=mask,
                target_layer_ids=list(ids),
                num_target_layers=n_target,
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=scaling,
                max_position_embeddings=max_pos,
                layer_types=[str(t) for t in types],
                sliding_window=window,
                attention_bias=bool(cfg.get("attention_bias", False)),
                is_causal=bool(causal) if causal is not None else None,
                input_embedding_scale=float(draft_value("input_embedding_scale", 1.0)),
                output_multiplier=float(draft_value("output_multiplier", 1.0)),
                final_logit_softcapping=float(cap) if cap is not None else None,
                **dict(zip(DFLASH2_FIELDS, conv)),
            )
        except RopeConfigError as exc:
            raise DraftLoadError(str(exc)) from None
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            raise DraftLoadError(f"draft config.json is missing or has a bad field: {exc}") from None
        out.check()
        return out

    def check(self) -> None:
        """Sizes a draft can be built with; DraftLoadError naming every one that is not."""
        sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "vocab_size", "block_size", "num_target_layers")
        bad = [k for k in sizes if getattr(self, k) is not None and getattr(self, k) < 1]
        if not self.target_layer_ids:
            bad.append("target_layer_ids (empty)")
        if self.mask_token_id < 0:
            bad.append("mask_token_id")
        if bad:
            raise DraftLoadError(f"draft config.json has bad values: {', '.join(bad)}")

    def to_dict(self) -> dict[str, Any]:
        """The z-lab `config.json` layout (read back the same by `from_dict` and by the references)."""
        dflash: dict[str, Any] = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}
        if self.input_embedding_scale != 1.0:
            dflash["input_embedding_scale"] = self.input_embedding_scale
        if self.output_multiplier != 1.0:
            dflash["output_multiplier"] = self.output_multiplier
        if self.final_logit_softcapping is not None:
            dflash["final_logit_softcapping"] = self.final_logit_softcapping
        if self.is_dflash2:
            dflash.update({k: getattr(self, k) for k in DFLASH2_FIELDS})
        out: dict[str, Any] = {
            "architectures": ["DFlash2DraftModel" if self.is_dflash2 else "DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": self.layer_types or ["full_attention"] * self.num_hidden_layers,
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "attention_bias": self.attention_bias,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": dflash,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        return out


# How multi-query attention (the draft's block, the target's verify) runs: "fused" is MLX's own
# kernel, as mlx-lm calls it; "kernel" is the engine's one-launch CUDA kernel (`cuda_kernels`),
# on MLX CUDA only, where it cuts the cycle's price (2.06 against 2.95 target steps per cycle
# for a Qwen3-4B shape on an H200, `bench.cycle_cost`).
ATTENTION_MODES = ("fused", "kernel")


def default_attention_mode() -> str:
    """"kernel" where the block kernels are on (MLX CUDA; `DFLASH_TUI_KERNELS`), else "fused"."""
    return "kernel" if kernels_wanted() else "fused"


def multi_query_attention(mode: str, q: mx.array, keys: mx.array, values: mx.array, scale: float,
                          causal: bool) -> Optional[mx.array]:
    """Multi-query attention in `mode`; None means: use MLX's fused kernel."""
    if mode == "kernel" and block_attention_fits(q, keys, values):
        return block_attention(q, keys, values, scale, causal)
    return None


def visible_keys(q_pos: mx.array, k_pos: mx.array, causal: bool, window: Optional[int]) -> Optional[mx.array]:
    """[..., Lq, Lk] bool from query / key absolute positions [..., Lq] / [..., Lk]: which keys
    each query sees; None: all of them.

    The torch reference's rule (z-lab/dflash@07ebd93 `_attention_mask`): causal keeps k <= q;
    a window W keeps q - k < W, and also k - q < W when not causal.
    """
    if not causal and window is None:
        return None
    d = q_pos[..., :, None] - k_pos[..., None, :]
    ok = d >= 0 if causal else mx.ones(d.shape, dtype=mx.bool_)
    if window is not None:
        ok = ok & (d < window)
        if not causal:
            ok = ok & (-d < window)
    return ok


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig, layer_idx: int):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.window = cfg.layer_window(layer_idx)
        self.causal = cfg.layer_causal(layer_idx)
        self.mode = default_attention_mode()  # one of ATTENTION_MODES; DFlashDraft.set_attention_mode
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.rope = DraftRoPE(self.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)

    def _kv(self, x: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        B, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return self.rope(k, offset=offset), v

    def __call__(self, x: mx.array, ctx: Optional[mx.array], cache: KVCache) -> mx.array:
        """x: the block [B, L, H]; ctx: fused target features of newly committed tokens.

        The context K/V is appended to `cache` for good; the block's own K/V is
        appended too and must be trimmed by the caller once the forward is done.
        Cache slot j holds absolute position j.
        """
        B, L, _ = x.shape
        if ctx is not None and ctx.shape[1] > 0:
            kc, vc = self._kv(ctx, cache.offset)
            cache.update_and_fetch(kc, vc)
        start = cache.offset
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        q = self.rope(q, offset=start)
        kb, vb = self._kv(x, start)
        keys, values = cache.update_and_fetch(kb, vb)
        first, out = 0, None
        if self.window is None:
            out = multi_query_attention(self.mode, q, keys, values, self.scale, causal=self.causal)
        else:
            first = max(0, start - self.window + 1)  # no query of the block sees a key before this
            keys, values = keys[:, :, first:], values[:, :, first:]
        if out is None:
            mask = visible_keys(start + mx.arange(L), first + mx.arange(keys.shape[2]), self.causal, self.window)
            out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def append_context(self, ctx: mx.array, cache: KVCache) -> None:
        kc, vc = self._kv(ctx, cache.offset)
        cache.update_and_fetch(kc, vc)


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DraftAttention(cfg, layer_idx)
        self.mlp = DraftMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if cfg.is_dflash2:
            self.attention_conv = GroupedDynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = GroupedDynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def __call__(self, x: mx.array, ctx: Optional[mx.array], cache: KVCache) -> mx.array:
        if "attention_conv" not in self:
            h = x + self.self_attn(self.input_layernorm(x), ctx, cache)
            return h + self.mlp(self.post_attention_layernorm(h))
        # DFlash2: each sublayer's input and output pass the convolution, both kernels predicted from its input
        a = self.input_layernorm(x)
        k_in, k_out = self.attention_conv.kernels(a)
        h = x + self.attention_conv.mix(self.self_attn(self.attention_conv.mix(a, k_in, 0), ctx, cache), k_out, 1)
        m = self.post_attention_layernorm(h)
        k_in, k_out = self.mlp_conv.kernels(m)
        return h + self.mlp_conv.mix(self.mlp(self.mlp_conv.mix(m, k_in, 0)), k_out, 1)


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        k = len(cfg.target_layer_ids)
        self.fc = nn.Linear(k * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [DraftLayer(cfg, i) for i in range(cfg.num_hidden_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if cfg.is_dflash2:
            self.candidate_selector = CandidateSelector(cfg.vocab_size, cfg.hidden_size, cfg.selector_rank,
                                                        cfg.selector_top_k)

    @property
    def dtype(self) -> mx.Dtype:
        """The dtype the draft computes in (its norms', which stay as loaded when its linear layers
        are quantized)."""
        return self.hidden_norm.weight.dtype

    @property
    def selects(self) -> bool:
        """A DFlash2 draft: its candidate selector, not its logits' argmax, picks the proposals."""
        return "candidate_selector" in self

    def select(self, hidden: mx.array, logits: mx.array, first: mx.array, temperature: float = 0.0,
               key: Optional[mx.array] = None) -> tuple[mx.array, Optional[mx.array]]:
        """A DFlash2 draft's proposals [B, L] from the hidden states and logits of the proposal
        positions and the block's first token [B]: greedy, or sampled with their q [B, L, V]."""
        return self.candidate_selector.path(hidden, logits, first, temperature, key)

    @property
    def attention_mode(self) -> str:
        return self.layers[0].self_attn.mode if self.layers else "fused"

    def set_attention_mode(self, mode: str) -> None:
        """How the block attends (one of ATTENTION_MODES); caches made before keep working."""
        if mode not in ATTENTION_MODES:
            raise ValueError(f"unknown attention mode {mode!r}")
        for layer in self.layers:
            layer.self_attn.mode = mode

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    @staticmethod
    def cache_arrays(cache: list[KVCache]) -> list[tuple[mx.array, mx.array]]:
        """The arrays a cache holds, to evaluate."""
        return [(c.keys, c.values) for c in cache if c.keys is not None]

    def fuse(self, features: mx.array) -> mx.array:
        """[B, L, k*H] concatenated target features -> [B, L, H] draft context."""
        return self.hidden_norm(self.fc(features.astype(self.dtype)))

    def append_context(self, features: mx.array, cache: list[KVCache]) -> None:
        """Push committed tokens' target features into the draft cache without drafting."""
        ctx = self.fuse(features)
        for layer, c in zip(self.layers, cache):
            layer.self_attn.append_context(ctx, c)

    def block_input(self, block_embeds: mx.array) -> mx.array:
        """The target's raw embedding rows of the block -> the draft's input (the reference
        scales the rows by `input_embedding_scale` before the first layer)."""
        h = block_embeds.astype(self.dtype)
        scale = self.config.input_embedding_scale
        return h * scale if scale != 1.0 else h

    def read_out(self, logits: mx.array) -> mx.array:
        """The target head's logits of draft hidden states -> the draft's logits: times
        `output_multiplier`, then soft-capped (the reference's `compute_logits`)."""
        c = self.config
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.final_logit_softcapping is not None and c.final_logit_softcapping > 0:
            logits = mx.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
        return logits

    def __call__(self, block_embeds: mx.array, features: Optional[mx.array], cache: list[KVCache]) -> mx.array:
        """Hidden states of the block [B, L, H] (before the target's head); `block_embeds` are
        the target's raw embedding rows.

        Leaves the block's K/V in `cache`; callers trim `L` afterwards.
        """
        ctx = self.fuse(features) if features is not None and features.shape[1] > 0 else None
        h = self.block_input(block_embeds)
        for layer, c in zip(self.layers, cache):
            h = layer(h, ctx, c)
        return self.norm(h)


def resolve_checkpoint(path_or_repo: str, allow_download: bool = True) -> Path:
    """A local directory, or a hub repo id fetched with only its json + safetensors."""
    p = Path(path_or_repo).expanduser()
    if p.exists():
        if not p.is_dir():
            raise DraftLoadError(f"draft path is not a directory: {p}")
        return p
    if not allow_download or path_or_repo.startswith((".", "/", "~")) or path_or_repo.count("/") != 1:
        raise DraftLoadError(f"draft not found: {path_or_repo} (no such directory, and not a hub repo id)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path_or_repo, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # network, auth, missing repo: all one message for the user
        raise DraftLoadError(f"could not fetch draft {path_or_repo!r} from the hub: {type(exc).__name__}: {exc}") from None


def load_draft(path_or_repo: str, dtype: mx.Dtype = mx.bfloat16) -> DFlashDraft:
    path = resolve_checkpoint(path_or_repo)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise DraftLoadError(f"not a draft checkpoint (no config.json): {path}")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DraftLoadError(f"draft config.json is unreadable: {exc}") from None
    archs = raw.get("architectures") or []
    if not any("DFlash" in a for a in archs) and "dflash_config" not in raw:
        raise DraftLoadError(f"not a DFlash draft checkpoint (architectures={archs}): {path}")
    cfg = DraftConfig.from_dict(raw)
    model = DFlashDraft(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DraftLoadError(f"draft checkpoint has no .safetensors weights: {path}")
    weights: dict[str, mx.array] = {}
    for f in files:
        try:
            weights.update(mx.load(str(f)))
        except (RuntimeError, ValueError, OSError) as exc:  # truncated, corrupt, not safetensors
            raise DraftLoadError(f"draft weights {f.name} cannot be read (truncated or corrupt?): "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    weights = {(k + ".weight" if k in _CODEBOOKS else k): v for k, v in weights.items()}
    # Some exports carry the target's embedding/head; the draft uses the target's own.
    weights = {k: v for k, v in weights.items() if not k.startswith(("embed_tokens.", "lm_head."))}
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise DraftLoadError(f"draft weights do not match its config: {exc}") from None
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def save_draft(model: DFlashDraft, out_dir: str | Path, dtype: mx.Dtype = mx.bfloat16, shard_bytes: int = SHARD_BYTES) -> Path:
    """Write a z-lab-format checkpoint: config.json + (sharded) model.safetensors."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    weights = {k.removesuffix(".weight") if k.removesuffix(".weight") in _CODEBOOKS else k: v.astype(dtype)
               for k, v in tree_flatten(model.parameters())}
    save_sharded(weights, out, shard_bytes)
    return out
