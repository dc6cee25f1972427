"""Weights on disk in mlx-lm's layout, sharded so no file passes a size limit."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

SHARD_BYTES = 15 * 2**20  # one weight file stays under 15 MiB


def save_sharded(weights: dict[str, mx.array], out_dir: Path, shard_bytes: int = SHARD_BYTES) -> list[str]:
    """mlx-lm's layout: model.safetensors, or model-0000i-of-0000n.safetensors + an index."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, mx.array]] = [{}]
    size = 0
    for k in sorted(weights):
        v = weights[k]
        if size and size + v.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.nbytes
    for old in out_dir.glob("model*.safetensors"):
        old.unlink()
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]
    weight_map = {}
    for name, shard in zip(names, shards):
        mx.save_safetensors(str(out_dir / name), shard, metadata={"format": "mlx"})
        weight_map.update({k: name for k in shard})
    index = out_dir / "model.safetensors.index.json"
    if len(shards) > 1:
        total = sum(v.nbytes for v in weights.values())
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    elif index.exists():
        index.unlink()
    return names
