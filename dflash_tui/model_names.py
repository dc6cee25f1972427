"""What to call a model in a list, an export or a title bar: its name, never where it is installed.

A hub id stays whole ("mlx-community/Qwen3-8B-4bit"); a local folder is called
by its folder name, or by the hub id a Hugging Face cache folder was made for;
the bundled demo pair is "demo (offline)".
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Optional

from dflash_tui.demo import DEMO_NAME, is_demo_path

_HF_CACHE = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or "\\" in name or len(PurePath(name).parts) > 2


def model_label(name: Optional[str]) -> str:
    """The name to show for a model given as a hub id or a path (recorded as it was given)."""
    if not name:
        return "—"
    name = name.rstrip("/")
    if not _looks_like_path(name):
        return name
    if is_demo_path(name):
        return DEMO_NAME
    parts = PurePath(name).parts
    for i, part in enumerate(parts):  # <cache>/models--org--name/snapshots/<hash>
        m = _HF_CACHE.match(part)
        if m and (i == len(parts) - 1 or parts[i + 1] == "snapshots"):
            return f"{m['org']}/{m['name']}"
    return parts[-1] if parts else name


def draft_label(target: Optional[str], draft: str) -> str:
    """The draft's name, or "its draft" where it would only repeat the target's (the demo pair)."""
    label = model_label(draft)
    return "its draft" if label == model_label(target) else label
