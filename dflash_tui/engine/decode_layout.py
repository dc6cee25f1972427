"""KV buffers laid out as mlx-lm's own decoding lays them out (MLX CUDA).

MLX CUDA chooses a one-query attention call's kernel from the keys' *buffer*: cuDNN's decode
graph only when the keys are a slice of a buffer whose row count is a multiple of 256 (the
length mlx-lm's `KVCache` grows by), else `sdpa_vector`; and it builds and caches cuDNN's
graph per shapes and strides, so the buffer's row count is part of the computation
(mlx/backend/cuda/scaled_dot_product_attention.cpp, `use_cudnn_for_decoding`, `SDPACacheKey`;
MLX commit 846d17622). `stream_generate` only ever appends, so when a step reads n keys its
buffer has ceil(n / 256) * 256 rows. The engine's buffers do not: a verify grows a buffer
from a rolled-back offset, which mlx-lm's cache regrows to offset + 256. A decode step the
engine runs (target alone, the adaptive size's block 1, a prompt's last token) therefore
first gets its buffers back to the rows mlx-lm's would have (`align_for_step`), and a
verify's rows computed as steps read their keys from such a buffer (`laid_out`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from dflash_tui.engine.cuda_kernels import on_cuda

KV_CACHE_STEP = KVCache.step  # 256: mlx-lm's buffer grows by this many rows


def buffer_rows(n: int) -> int:
    """Rows of mlx-lm's KVCache buffer when a decode step reads n keys (it grows from empty)."""
    return -(-n // KV_CACHE_STEP) * KV_CACHE_STEP


def laid_out(kv: mx.array, keep: int, rows: int) -> mx.array:
    """kv's first `keep` rows (axis 2) in a fresh contiguous buffer of `rows` rows, zero after
    them, as mlx-lm's buffer is past the keys it holds."""
    b, h, _, d = kv.shape
    head = kv[:, :, : min(keep, rows)]
    if head.shape[2] == rows:
        return mx.contiguous(head)
    return mx.concatenate([head, mx.zeros((b, h, rows - head.shape[2], d), kv.dtype)], axis=2)


def wanted() -> bool:
    """Where the layout picks the kernel: MLX CUDA (elsewhere nothing is changed)."""
    return on_cuda()


def align_for_step(cache: list[Any]) -> int:
    """Give every plain KVCache of `cache` the buffer mlx-lm's would have for a one-token step
    at its offset; returns how many were re-laid (a copy each, after a verify grew the buffer)."""
    n = 0
    for c in cache:
        if type(c) is not KVCache or c.keys is None:
            continue
        rows = buffer_rows(c.offset + 1)
        if c.keys.shape[2] != rows:
            c.keys = laid_out(c.keys, c.offset, rows)
            c.values = laid_out(c.values, c.offset, rows)
            n += 1
    return n
