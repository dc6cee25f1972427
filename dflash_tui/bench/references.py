"""What the cycle benchmark compares against, timed the way a user would run them.

- vanilla: `mlx_lm.stream_generate` on its own, untouched model instance (the time
  between two yielded tokens is one decode step);
- z-lab: the `dflash` package's MLX `stream_generate` (its reference implementation),
  with a draft of the same shape; with random weights it accepts almost nothing, so
  the time between two yields is one of its cycles.

Both take prompt token ids and a tokenizer made by `tokenizer_for`.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import mlx.core as mx


def tokenizer_for(workdir: Optional[Path] = None) -> Any:
    """A small real tokenizer (mlx-lm's wrapper) to drive the generators; the random
    models' token ids past its vocabulary decode to nothing."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from dflash_tui import random_pair as rp

    path = Path(workdir or tempfile.mkdtemp(prefix="cycle-cost-tok-"))
    rp.build_tokenizer(path)
    tok = load_tokenizer(path)
    tok._eos_token_ids = set()  # a random model must not stop on a chance end token
    return tok


def _yield_gaps_ms(responses: Iterable[Any], skip: int) -> list[float]:
    gaps, last = [], None
    for _ in responses:
        now = time.perf_counter()
        if last is not None:
            gaps.append((now - last) * 1e3)
        last = now
    return gaps[skip:] or gaps


def vanilla_step_ms(model: Any, tokenizer: Any, prompt: list[int], tokens: int) -> float:
    """Median time between tokens of `mlx_lm.stream_generate` (prefill excluded)."""
    import mlx_lm

    from dflash_tui.engine.target import finish_stream_generate

    gaps = _yield_gaps_ms(mlx_lm.stream_generate(model, tokenizer, mx.array(prompt), max_tokens=tokens), skip=3)
    finish_stream_generate()  # its last step is not the next measurement's
    return statistics.median(gaps)


def zlab_available() -> bool:
    try:
        import dflash.model_mlx  # noqa: F401
    except Exception:  # not installed, or its own imports missing
        return False
    return True


def zlab_draft(draft_config: Any, dtype: mx.Dtype) -> Any:
    """The reference's draft model class with random weights, shaped like `draft_config`
    (the engine's DraftConfig)."""
    from dflash.model_mlx import DFlashConfig, DFlashDraftModel

    c = draft_config
    cfg = DFlashConfig(hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
                       num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                       head_dim=c.head_dim, intermediate_size=c.intermediate_size, vocab_size=c.vocab_size,
                       rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                       max_position_embeddings=c.max_position_embeddings, block_size=c.block_size,
                       target_layer_ids=tuple(c.target_layer_ids),
                       num_target_layers=c.num_target_layers or max(c.target_layer_ids) + 2,
                       mask_token_id=c.mask_token_id)
    mx.random.seed(2)
    draft = DFlashDraftModel(cfg)
    draft.set_dtype(dtype)
    mx.eval(draft.parameters())
    return draft


def zlab_cycle_ms(model: Any, draft: Any, tokenizer: Any, prompt: list[int], block: int, tokens: int) -> float:
    """Median time of one reference cycle; the model's layers are given back unhooked."""
    from dflash.model_mlx import _get_layers, stream_generate

    try:
        gaps = _yield_gaps_ms(stream_generate(model, draft, tokenizer, mx.array(prompt), block_size=block,
                                              max_tokens=tokens), skip=3)
    finally:  # the reference hooks the layers it reads in place: undo it for the next user
        layers = _get_layers(model)
        for i, layer in enumerate(layers):
            if hasattr(layer, "_layer") and type(layer).__name__ == "_LayerHook":
                layers[i] = layer._layer
        if hasattr(model, "_hidden_states"):
            del model._hidden_states
    return statistics.median(gaps)
