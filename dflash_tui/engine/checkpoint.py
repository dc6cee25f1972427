"""Weights on disk in mlx-lm's layout, sharded so no file passes a size limit.

A checkpoint is written whole into a temporary folder and then moved into
place; only the files of a checkpoint (config.json, the weight shards, their
index) are ever replaced or removed, never anything else in the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import mlx.core as mx

SHARD_BYTES = 15 * 2**20  # one weight file stays under 15 MiB
INDEX = "model.safetensors.index.json"
STAGING_PREFIX = ".checkpoint-"
_WEIGHTS = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")  # the names save_sharded writes


def checkpoint_files(folder: Path) -> list[Path]:
    """The files of a checkpoint in `folder`: what writing a new one there replaces."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _WEIGHTS.match(p.name) or p.name in (INDEX, "config.json"))


def holds_model(folder: Path) -> bool:
    """A model or draft is there: a config.json or any weights."""
    return folder.is_dir() and ((folder / "config.json").exists() or any(folder.glob("*.safetensors")))


@contextlib.contextmanager
def staged_checkpoint(out_dir: Path) -> Iterator[Path]:
    """Yields an empty folder to write a checkpoint into; on success its files replace the checkpoint in
    `out_dir` (weights first, config.json last), and the old checkpoint's other shards go. On failure
    `out_dir` is left as it was."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(STAGING_PREFIX + "*"):  # a run killed mid-save left it
        shutil.rmtree(old, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=out_dir, prefix=STAGING_PREFIX))
    try:
        yield stage
        new = sorted(stage.iterdir(), key=lambda p: (p.name == "config.json", p.name == INDEX, p.name))
        stale = [p for p in checkpoint_files(out_dir) if not (stage / p.name).exists()]
        for path in new:
            os.replace(path, out_dir / path.name)
        for path in stale:
            path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_safetensors(path: Path, arrays: dict[str, mx.array], metadata: Optional[dict[str, str]] = None) -> None:
    """mx.save_safetensors, whose failure to write (a full disk, a folder gone) is a RuntimeError: an OSError here."""
    try:
        mx.save_safetensors(str(path), arrays, **({"metadata": metadata} if metadata else {}))
    except RuntimeError as exc:
        raise OSError(f"could not write {path.name}: {str(exc).splitlines()[0] if str(exc) else 'failed'}") from None


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
    for old in out_dir.iterdir():  # the previous weights of this layout, and nothing else
        if _WEIGHTS.match(old.name):
            old.unlink()
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]
    weight_map = {}
    for name, shard in zip(names, shards):
        write_safetensors(out_dir / name, shard, {"format": "mlx"})
        weight_map.update({k: name for k in shard})
    index = out_dir / INDEX
    if len(shards) > 1:
        total = sum(v.nbytes for v in weights.values())
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    elif index.exists():
        index.unlink()
    return names
