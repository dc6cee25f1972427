"""Quantized drafts: the draft's own linear layers in 4 or 8 bits (`--draft-quant`).

The draft has no embedding or head of its own (it borrows the target's), so what is
quantized is every `nn.Linear` it owns: the feature fusion `fc`, the attention and MLP
projections, and a DFlash2 draft's convolution and selector projections. The selector's
codebooks (embeddings) stay as loaded. Output stays lossless: the target verifies
every proposal; only the acceptance can change, and the bench measures it
(dflash_tui/bench/draft_quant.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

BITS = (4, 8)
GROUP_SIZE = 64  # mlx-lm's default group


def quantizable(module: nn.Module, group_size: int = GROUP_SIZE) -> bool:
    """A plain linear layer whose input width is a whole number of groups."""
    return isinstance(module, nn.Linear) and module.weight.shape[-1] % group_size == 0


def quantize_draft(draft: nn.Module, bits: int, group_size: int = GROUP_SIZE) -> int:
    """Quantize the draft's linear layers in place; returns how many were quantized."""
    if bits not in BITS:
        raise ValueError(f"draft quantization must be one of {BITS} bits, not {bits}")
    count = sum(1 for _, m in draft.named_modules() if quantizable(m, group_size))
    nn.quantize(draft, group_size=group_size, bits=bits, class_predicate=lambda _, m: quantizable(m, group_size))
    mx.eval(draft.parameters())
    return count
