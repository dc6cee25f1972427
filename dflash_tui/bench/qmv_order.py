"""A NumPy replay of MLX CUDA's one-row quantized matmul (qmv), operation by operation.

The bench compares it with MLX's own one-row calls on the device: if it equals them while the
row-wise kernel does not, the kernel has a bug; if neither does, the order written down in
dflash_tui/engine/cuda_rowwise_quant.py is wrong. Every bf16 step is rounded exactly once
(products of two bf16 values are exact in float64, so float64 then one rounding to bf16 is a
fused multiply-add), every float step is a float32 operation.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def round_bf16(v: np.ndarray) -> np.ndarray:
    """Round float64 values to the nearest bfloat16 (ties to even), kept as float64."""
    m, e = np.frexp(v)
    return np.ldexp(np.rint(m * 256.0), e - 8)


def unpack(wq: mx.array, bits: int) -> np.ndarray:
    """MLX's packed uint32 weights [N, K*bits/32] as integers [N, K] (value j of a word at bits j*bits)."""
    words = np.array(wq, dtype=np.uint32)
    per_word = 32 // bits
    vals = np.empty((words.shape[0], words.shape[1] * per_word), dtype=np.float64)
    for j in range(per_word):
        vals[:, j::per_word] = (words >> np.uint32(j * bits)) & np.uint32((1 << bits) - 1)
    return vals


def qmv_rows(x: mx.array, wq: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int,
             features: int = 0, lane_order: str = "butterfly") -> np.ndarray:
    """Each row of x [M, K] (bf16) as MLX CUDA's qmv computes it alone, for the first
    `features` outputs (all when 0): float64 array [M, F] of bf16 values. q * scale + bias
    rounds once (a fused multiply-add, as MLX's build computes it). `lane_order="sequential"`
    adds the 32 lane sums one after another instead (not qmv's: to tell whether inputs show it)."""
    n = wq.shape[0] if not features else min(features, wq.shape[0])
    k = x.shape[-1]
    xs = np.array(x.astype(mx.float32), dtype=np.float64).reshape(-1, k)
    q = unpack(wq[:n], bits)
    s = np.repeat(np.array(scales[:n].astype(mx.float32), dtype=np.float64), group_size, axis=1)
    b = np.repeat(np.array(biases[:n].astype(mx.float32), dtype=np.float64), group_size, axis=1)
    w = round_bf16(q * s + b)
    e = 16 if bits == 4 else 8  # qmv's elems_per_thread
    # qmv's residue tile (lanes whose tile starts below K) is the next tile of the same sequence,
    # and a lane past K adds nothing: zero padding to whole tiles computes the same
    tiles = -(-k // (32 * e))
    pad = tiles * 32 * e - k
    w = np.pad(w, ((0, 0), (0, pad))).reshape(n, tiles, 32, e)  # column r*32E + lane*E + i
    xs = np.pad(xs, ((0, 0), (0, pad)))
    out = np.empty((xs.shape[0], n))
    for m, row in enumerate(xs.reshape(-1, tiles, 32, e)):
        if bits < 8:  # E accumulators in bf16, one fused rounding per step
            acc = np.zeros((n, 32, e))
            for r in range(tiles):
                acc = round_bf16(row[r] * w[:, r] + acc)
            acc = acc.astype(np.float32)
        else:  # E float accumulators; the product of two bf16 values is exact in float32
            acc = np.zeros((n, 32, e), dtype=np.float32)
            for r in range(tiles):
                acc = acc + (row[r] * w[:, r]).astype(np.float32)
        lane_sum = np.zeros((n, 32), dtype=np.float32)
        for i in range(e):
            lane_sum = lane_sum + acc[:, :, i]
        if lane_order == "sequential":
            total = np.zeros(n, dtype=np.float32)
            for lane in range(32):
                total = total + lane_sum[:, lane]
        else:
            for o in (16, 8, 4, 2, 1):  # cg::reduce: out += shfl_xor(out, o)
                lane_sum = lane_sum + lane_sum[:, np.arange(32) ^ o]
            total = lane_sum[:, 0]
        out[m] = round_bf16(total.astype(np.float64))
    return out
