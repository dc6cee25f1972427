"""Facts about a target or a draft checkpoint read from its files, without loading weights.

config.json gives the shapes; each safetensors file's header (an 8-byte length,
then JSON naming every tensor's dtype, shape and byte range) gives the sizes.
A hub repo id is looked up in the local Hugging Face cache only: nothing here
downloads.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dflash_tui.engine.config_values import REQUIRED, ConfigReader, is_whole, shorten
from dflash_tui.engine.draft import DraftConfig, DraftLoadError

# the safetensors dtypes MLX loads (mx.load), and their sizes; the format's others MLX refuses
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E8M0": 1, "C64": 8}
NOT_LOADED = {"F64", "F8_E5M2"}
MAX_HEADER = 256 * 1024 * 1024  # a header longer than this is not a safetensors file
DRAFT_BYTES = 2  # load_pair loads the draft in bfloat16: weights and cache
STATE_BYTES = 4  # mlx-lm keeps the Gated DeltaNet recurrent state in float32


def human_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    x, i = float(n), 0
    while abs(x) >= 1024 and i < len(units) - 1:
        x, i = x / 1024, i + 1
    return f"{x:.0f} {units[i]}" if i == 0 or x >= 100 else f"{x:.1f} {units[i]}"


class CheckpointError(ValueError):
    """A file that is not what it claims to be (the message is for the user)."""


# -- where the files are ---------------------------------------------------------------------
@dataclass
class Location:
    name: str
    path: Optional[Path]  # the directory holding config.json, when there is one
    where: str  # "directory" | "hub cache" | "not downloaded" | "not found"
    missing: list[str] = field(default_factory=list)  # weight files the index names that are absent

    @property
    def present(self) -> bool:
        return self.path is not None and not self.missing


def is_repo_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def locate(name: str, index_file: str = "model.safetensors.index.json") -> Location:
    """A local directory, a hub repo in the local cache, or a hub repo that would be downloaded."""
    path = Path(name).expanduser()
    if path.exists():
        return Location(name, path if path.is_dir() else None, "directory" if path.is_dir() else "not found")
    if not is_repo_id(name):
        return Location(name, None, "not found")
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(name, "config.json")
    except Exception:  # a name the hub would refuse (bad characters): not a repo id after all
        return Location(name, None, "not found")
    if not isinstance(hit, str):
        return Location(name, None, "not downloaded")
    snapshot = Path(hit).parent
    return Location(name, snapshot, "hub cache", missing=_missing_shards(snapshot, index_file))


def _missing_shards(folder: Path, index_file: str) -> list[str]:
    index = folder / index_file
    if not index.is_file():
        return []
    try:
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError):
        return [index_file]
    return [n for n in names if not (folder / n).is_file()]


# -- safetensors headers ---------------------------------------------------------------------
@dataclass
class Tensor:
    name: str
    dtype: str
    shape: list[int]
    nbytes: int

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def read_header(path: Path) -> list[Tensor]:
    """The tensors a safetensors file holds, from its header alone: each one's shape and dtype
    must take exactly the bytes its data_offsets span, and those must lie within the file (the
    checks mlx's loader makes before it reads a byte of them)."""
    try:
        _regular(path, None)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) != 8:
                raise CheckpointError(f"{path.name} is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"{path.name} is not a safetensors file (header length {n}, "
                                      f"file size {size} bytes)")
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"{path.name} is unreadable: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CheckpointError(f"{path.name} is not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name} is not a safetensors file (bad header)")
    data = size - 8 - n  # the bytes after the header
    return [_tensor(path.name, str(name), info, data) for name, info in header.items() if name != "__metadata__"]


def _regular(path: Path, limit: Optional[int]) -> None:
    """A regular file (a fifo would hang the read, a device never end it), at most `limit` bytes."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path.name} is not a regular file")
    if limit is not None and st.st_size > limit:
        raise CheckpointError(f"{path.name} is {human_bytes(st.st_size)}, more than a config holds")


def _tensor(file: str, name: str, info: Any, data: int) -> Tensor:
    """One header entry, checked: a known dtype, a shape of whole numbers, data_offsets spanning
    exactly shape x dtype size, within the file's data."""
    where = f"{file}: tensor {name!r:.80}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where} has a malformed entry")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype in NOT_LOADED:
        raise CheckpointError(f"{where} is {dtype}, which MLX does not load")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{where} has an unknown dtype ({dtype!r:.40})")
    if not isinstance(shape, list) or not all(is_whole(d) and d >= 0 for d in shape):
        raise CheckpointError(f"{where} has a malformed shape ({shape!r:.80})")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_whole(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise CheckpointError(f"{where} has malformed data_offsets ({offsets!r:.80})")
    t = Tensor(name, dtype, shape, offsets[1] - offsets[0])
    want = t.elements * DTYPE_BYTES[dtype]
    if t.nbytes != want:
        raise CheckpointError(f"{where}: {dtype} of shape {shorten(shape)} takes {shorten(want)} bytes, "
                              f"but its data_offsets {shorten(offsets)} span {shorten(t.nbytes)}")
    if offsets[1] > data:
        raise CheckpointError(f"{where}: its data_offsets {shorten(offsets)} run past the end of the file "
                              f"({data} bytes of data)")
    return t


def read_weights(folder: Path, pattern: str) -> list[Tensor]:
    files = sorted(folder.glob(pattern))
    if not files:
        raise CheckpointError(f"no {pattern} weights in the checkpoint")
    return [t for f in files for t in read_header(f)]


# -- config ------------------------------------------------------------------------------------
MAX_CONFIG = 16 * 1024 * 1024  # a config.json longer than this is not one (published ones are kilobytes)


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        _regular(path, MAX_CONFIG)
        cfg = json.loads(path.read_bytes())
    except CheckpointError:
        raise
    except OSError:
        raise CheckpointError("no readable config.json") from None
    except RecursionError:
        raise CheckpointError("config.json is not valid JSON: nested too deep") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise CheckpointError(f"config.json is not valid JSON: {shorten(exc)}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError("config.json is not a JSON object")
    return cfg


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings: `text_config` for multimodal wrappers (Qwen3.5), else the top level."""
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


# -- the cache a model keeps ------------------------------------------------------------------
@dataclass
class LayerCache:
    kind: str  # "attention" | "sliding" | "linear" | "shared" (reads another layer's KV)
    per_token: int  # bytes of K and V per cached token
    window: Optional[int] = None  # a sliding layer keeps at most this many tokens
    fixed: int = 0  # bytes that do not grow with the context (a linear layer's conv + recurrent state)

    def bytes_at(self, tokens: int) -> int:
        kept = min(tokens, self.window) if self.window else tokens
        return self.fixed + self.per_token * kept


def cache_bytes(layers: list[LayerCache], tokens: int) -> int:
    return sum(layer.bytes_at(tokens) for layer in layers)


# What config.json may state, as (lowest, highest): far wider than any published model, so a value
# outside is a broken or hostile file (10**18 layers would size a list that long, 0 heads divides by 0).

def _int(cfg: dict[str, Any], key: str, default: Any = REQUIRED, unset: tuple = ()) -> int:
    """One checked count or size (CheckpointError naming the key)."""
    reader = ConfigReader(cfg)
    value = reader.int(key, default, unset)
    reader.check()
    return value


def layer_kinds(cfg: dict[str, Any], reader: Optional[ConfigReader] = None) -> list[str]:
    """Per layer: "attention", "sliding" or "linear", as mlx-lm builds the model."""
    r = reader or ConfigReader(cfg)
    n = r.int("num_hidden_layers")
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        names = {"linear_attention": "linear", "sliding_attention": "sliding"}
        kinds = [names.get(str(t), "attention") for t in types]
    elif "full_attention_interval" in cfg or "linear_num_value_heads" in cfg:
        # Qwen3.5 / Qwen3-Next: every interval-th layer is full attention, the rest Gated DeltaNet
        interval = r.int("full_attention_interval", 4)
        kinds = ["attention" if (i + 1) % interval == 0 else "linear" for i in range(n)]
    else:
        kinds = ["attention"] * n
    shared = r.int("num_kv_shared_layers", 0, unset=(None,))  # Gemma 4: the last layers reuse earlier KV
    if reader is None:
        r.check()
    return [("shared" if i >= n - shared > 0 else k) for i, k in enumerate(kinds)]


def target_cache_layers(cfg: dict[str, Any], act_bytes: int, reader: Optional[ConfigReader] = None) -> list[LayerCache]:
    text = text_config(cfg)
    r = reader or ConfigReader(text)
    heads = r.int("num_attention_heads")
    hidden = r.int("hidden_size")
    head_dim = r.int("head_dim", None, unset=(None, 0))
    if head_dim is None:  # mlx-lm's rule where a config gives none
        head_dim = hidden // heads
        if head_dim < 1:
            r.note(f"hidden_size {hidden} over num_attention_heads {heads} leaves no head size", 1)
            head_dim = 1
    kv_heads = r.int("num_key_value_heads", heads)
    if heads % kv_heads:
        r.note(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}", 1)
    out = []
    for kind in layer_kinds(text, r):
        if kind == "linear":
            out.append(LayerCache("linear", 0, fixed=_linear_state_bytes(text, act_bytes, r)))
        elif kind == "shared":
            out.append(LayerCache("shared", 0))
        elif kind == "sliding":
            window = r.int("sliding_window", None, unset=(None, 0))
            out.append(LayerCache("sliding", 2 * kv_heads * head_dim * act_bytes, window=window))
        else:
            # Gemma 4 gives its full-attention layers their own head size and count
            d = r.int("global_head_dim", head_dim, unset=(None, 0))
            h = r.int("num_global_key_value_heads", kv_heads, unset=(None, 0))
            out.append(LayerCache("attention", 2 * h * d * act_bytes))
    if reader is None:
        r.check()
    return out


def _linear_state_bytes(text: dict[str, Any], act_bytes: int, r: ConfigReader) -> int:
    """A Gated DeltaNet layer's state: the conv state (kernel - 1 rows of q, k and v, in the
    activation dtype) and the recurrent state (value heads x value dim x key dim, float32)."""
    k_heads, v_heads = r.int("linear_num_key_heads"), r.int("linear_num_value_heads")
    k_dim, v_dim = r.int("linear_key_head_dim"), r.int("linear_value_head_dim")
    conv = (r.int("linear_conv_kernel_dim", 4) - 1) * (2 * k_heads * k_dim + v_heads * v_dim) * act_bytes
    return conv + v_heads * v_dim * k_dim * STATE_BYTES


def recurrent_state_bytes(cfg: dict[str, Any]) -> int:
    text = text_config(cfg)
    return _int(text, "linear_num_value_heads") * _int(text, "linear_value_head_dim") * _int(text, "linear_key_head_dim") * STATE_BYTES


# -- a target ----------------------------------------------------------------------------------
@dataclass
class TargetFacts:
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int  # rows of the embedding the draft borrows
    context: int  # max_position_embeddings
    kinds: dict[str, int]  # layer kind -> count
    quantization: str  # words: "4-bit affine, group 64" or "none"
    activation_dtype: str  # what the model computes and caches in
    weights_bytes: int  # as mlx-lm holds them after loading
    cache: list[LayerCache]
    recurrent_bytes: int  # one linear layer's recurrent state (hybrids), else 0

    @property
    def hybrid(self) -> bool:
        return self.kinds.get("linear", 0) > 0

    @property
    def per_token(self) -> int:
        """Cache bytes per token of context (sliding layers up to their window)."""
        return sum(layer.per_token for layer in self.cache)

    @property
    def fixed_state(self) -> int:
        return sum(layer.fixed for layer in self.cache)


def _activation_dtype(tensors: list[Tensor]) -> str:
    """A quantized model computes in its scales' dtype, another in its embedding's."""
    by_name = {t.name: t for t in tensors}
    for t in tensors:
        if t.name.endswith("embed_tokens.weight"):
            scales = by_name.get(t.name[: -len("weight")] + "scales")
            return (scales or t).dtype
    floats = [t for t in tensors if t.dtype in ("BF16", "F16", "F32")]
    return max(floats, key=lambda t: t.nbytes).dtype if floats else "BF16"


def _quantization(cfg: dict[str, Any]) -> str:
    q = cfg.get("quantization") or text_config(cfg).get("quantization")
    if isinstance(q, dict):
        return f"{q.get('bits', '?')}-bit {q.get('mode', 'affine')}, group {q.get('group_size', '?')}"
    qc = cfg.get("quantization_config") or text_config(cfg).get("quantization_config")
    if isinstance(qc, dict):
        return str(qc.get("quant_method", "yes"))
    return "none"


# what mlx-lm's sanitize drops from multimodal checkpoints (Qwen3.5, Gemma 4): the text model runs alone
_DROPPED = ("vision_tower", "visual.", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision",
            "vision_embedder")


def _dropped(name: str) -> bool:
    name = name.removeprefix("model.")
    return "mtp." in name or name.startswith(_DROPPED)


def vocab_tensors(tensors: list[Tensor]) -> list[Tensor]:
    """The language model's embedding and lm_head (not an MTP head's or a vision tower's, which mlx-lm drops)."""
    return [t for t in tensors if t.shape and t.name.endswith(("embed_tokens.weight", "lm_head.weight"))
            and not _dropped(t.name)]


def check_vocab_rows(folder: Path) -> None:
    """CheckpointError naming both numbers where the rows of the embedding or of an untied lm_head (read from
    the safetensors headers) are not the vocab_size mlx-lm builds them with. A padded vocabulary is no
    exception: published configs state the padded size; mlx-lm's sharded load skips the shape check, so
    there such a model would load wrong instead."""
    from mlx_lm.utils import _get_classes

    cfg = read_config(folder)
    args = _get_classes(config=cfg)[1].from_dict(cfg)
    text = getattr(args, "text_config", None)  # a wrapper's (Qwen3.5, Gemma 4) language model is built from this
    lm = text if isinstance(text, dict) else vars(args)
    vocab = lm.get("vocab_size")
    if not is_whole(vocab):
        return
    # unstated in a wrapper's text_config, tying defaults by family (Gemma 4 ties, Qwen3.5 not): its lm_head left alone;
    # a model whose settings have no such field builds its own head (gpt-oss)
    tied = lm.get("tie_word_embeddings", None if lm is text else False)
    # mlx-lm makes the embedding and an untied lm_head exactly vocab_size rows and loads strictly; a tied lm_head is dropped
    wrong = [t for t in vocab_tensors(read_weights(folder, "model*.safetensors")) if t.shape[0] != vocab
             and (t.name.endswith("embed_tokens.weight") or (tied is not None and not tied))]
    if wrong:
        rows = " and ".join(f"{t.name} has {t.shape[0]} rows" for t in wrong)
        raise CheckpointError(f"config.json's vocab_size is {vocab}, but {rows}: mlx-lm builds "
                              f"{'them' if len(wrong) > 1 else 'it'} with vocab_size rows and cannot load this")


def _loaded_bytes(cfg: dict[str, Any], tensors: list[Tensor]) -> int:
    """What the weights take once mlx-lm has loaded them: as stored, except what it drops (the
    multi-token prediction heads, vision and audio towers, a tied head's copy), and FP8
    checkpoints, which it dequantizes to bfloat16."""
    qc = cfg.get("quantization_config")
    fp8 = isinstance(qc, dict) and qc.get("quant_method") == "fp8"
    tied = bool(text_config(cfg).get("tie_word_embeddings"))
    total = 0
    for t in tensors:
        if _dropped(t.name) or (tied and t.name.endswith("lm_head.weight")):
            continue
        if fp8 and t.dtype.startswith("F8_"):
            total += t.elements * 2
        elif fp8 and t.name.endswith("_scale_inv"):
            continue
        else:
            total += t.nbytes
    return total


def target_facts(folder: Path) -> TargetFacts:
    cfg = read_config(folder)
    text = text_config(cfg)
    # every count and size the facts read, checked before the weights' headers are
    r = ConfigReader(text)
    hidden, layers = r.int("hidden_size"), r.int("num_hidden_layers")
    stated_vocab = r.int("vocab_size", None)  # mlx-lm sizes the embedding from it; its rows are the figure
    context = r.int("max_position_embeddings", 0, unset=(None,))  # 0: not stated
    target_cache_layers(cfg, 2, r)
    r.check()
    tensors = read_weights(folder, "model*.safetensors")
    embed = next((t for t in tensors if t.name.endswith("embed_tokens.weight")), None)
    vocab = embed.shape[0] if embed is not None and embed.shape else stated_vocab
    if vocab is None:
        raise CheckpointError("config.json: no vocab_size, and no embed_tokens weight to count")
    act = _activation_dtype(tensors)
    cache = target_cache_layers(cfg, DTYPE_BYTES.get(act, 2))
    kinds: dict[str, int] = {}
    for layer in cache:
        kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    return TargetFacts(
        model_type=str(cfg.get("model_type", "?")),
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=vocab,
        context=context,
        kinds=kinds,
        quantization=_quantization(cfg),
        activation_dtype=act,
        weights_bytes=_loaded_bytes(cfg, tensors),
        cache=cache,
        recurrent_bytes=recurrent_state_bytes(cfg) if kinds.get("linear") else 0,
    )


# -- a draft -----------------------------------------------------------------------------------
@dataclass
class DraftFacts:
    config: DraftConfig
    params: int  # the draft's own (the target's embedding and head it borrows not counted)
    weights_bytes: int  # in bfloat16, as load_pair loads it

    @property
    def per_token(self) -> int:
        """The draft caches K and V of every committed token in every layer (sliding ones too)."""
        c = self.config
        return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * DRAFT_BYTES


def draft_facts(folder: Path) -> DraftFacts:
    raw = read_config(folder)
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or (not any("DFlash" in str(a) for a in archs) and "dflash_config" not in raw):
        raise DraftLoadError(f"not a DFlash draft checkpoint (architectures={archs!r:.80})")
    cfg = DraftConfig.from_dict(raw)
    # load_draft drops a copy of the target's embedding or head some exports carry
    own = [t for t in read_weights(folder, "*.safetensors")
           if not t.name.removeprefix("model.").startswith(("embed_tokens.", "lm_head."))]
    params = sum(t.elements for t in own)
    return DraftFacts(cfg, params, params * DRAFT_BYTES)
