"""KV buffers laid out as mlx-lm's decoding has them (engine/decode_layout.py).

MLX CUDA picks a one-query attention call's kernel, and cuDNN's graph, from the keys' buffer
(its rows a multiple of 256 or not, its strides). A verify grows the engine's buffer from a
rolled-back offset to other lengths than `stream_generate`'s, so on MLX CUDA a decode step the
engine runs first gets the buffer mlx-lm's step would read, and a verify's per-query rows read
such a buffer. Here (CPU) the values are checked, and the re-laying forced on.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from dflash_tui.engine import cuda_step_attention as sa
from dflash_tui.engine import decode_layout


def test_buffer_rows_and_a_relaid_buffer():
    assert [decode_layout.buffer_rows(n) for n in (1, 255, 256, 257, 700)] == [256, 256, 256, 512, 768]
    kv = mx.random.normal((1, 2, 300, 16)).astype(mx.bfloat16)
    laid = decode_layout.laid_out(kv, 300, 512)
    assert laid.shape == (1, 2, 512, 16)
    assert mx.array_equal(laid[:, :, :300], kv).item() and not mx.any(laid[:, :, 300:]).item()
    assert mx.array_equal(decode_layout.laid_out(kv, 300, 256), kv[:, :, :256]).item()
    assert not mx.any(decode_layout.laid_out(kv, 100, 256)[:, :, 100:]).item()  # past the keys kept: zero


@pytest.mark.parametrize("wanted", [True, False])
def test_a_step_after_a_verify_reads_the_buffer_stream_generate_would(monkeypatch, qwen3_pair, wanted):
    monkeypatch.setattr(decode_layout, "wanted", lambda: wanted)
    target = qwen3_pair.target
    cache = target.make_cache()
    prompt = mx.array([[(7 * i) % 300 + 3 for i in range(250)]])
    mx.eval(target.forward(prompt, cache, last_only=True)[0])
    assert cache[0].keys.shape[2] == 256
    target.begin_verify(cache)
    mx.eval(target.forward(mx.array([[5] * 16]), cache)[0])  # 266 keys: mlx-lm regrows from 250 to 506 rows
    target.rollback(cache, 2, 16)
    assert cache[0].keys.shape[2] == 506 and cache[0].offset == 252
    logits, _ = target.forward(mx.array([[9]]), cache)
    mx.eval(logits)
    layers = [c for c in cache if type(c) is KVCache]
    # the step read a buffer of ceil(253 / 256) * 256 rows, as stream_generate's would be
    assert all(c.keys.shape[2] == (256 if wanted else 506) and c.offset == 253 for c in layers)
    # and computed what a step from a cache that never saw the verify computes (CPU: rows agree)
    fresh = target.make_cache()
    mx.eval(target.forward(mx.concatenate([prompt, mx.array([[5, 5]])], axis=1), fresh, last_only=True)[0])
    ref, _ = target.forward(mx.array([[9]]), fresh)
    assert mx.array_equal(logits, ref).item()


def test_per_query_rows_read_keys_laid_out_as_a_decode_step_s(monkeypatch):
    kv = mx.random.normal((1, 2, 270, 16)).astype(mx.bfloat16)
    q = mx.random.normal((1, 4, 16, 16)).astype(mx.bfloat16)
    values = mx.random.normal((1, 2, 270, 16)).astype(mx.bfloat16)
    plain = sa.per_query_attention(q, kv, values, 0.25)
    seen = []
    real = decode_layout.laid_out
    monkeypatch.setattr(sa, "laid_out", lambda kv, keep, rows: seen.append(rows) or real(kv, keep, rows))
    monkeypatch.setattr(decode_layout, "wanted", lambda: True)  # here on the CPU, forced down the CUDA path
    assert mx.array_equal(sa.per_query_attention(q, kv, values, 0.25), plain).item()
    # rows 255..270 keys: two buffer lengths, keys and values each laid out once per length
    assert sorted(seen) == [256, 256, 512, 512]
