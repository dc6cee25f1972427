"""The bundled offline demo pair: a small Python-writing target and its DFlash draft.

Built by `python -m dflash_tui.training.build_demo`; see dflash_tui/training/.
`DFLASH_TUI_DEMO_DIR` (a directory holding target/ and draft/) points at
another build, e.g. a fresh one before it is bundled.
"""

from __future__ import annotations

import os
from pathlib import Path

from dflash_tui.errors import UserError

_HERE = Path(__file__).resolve().parent


def _root() -> Path:
    override = os.environ.get("DFLASH_TUI_DEMO_DIR")
    return Path(override).expanduser() if override else _HERE


def _checked(path: Path, what: str) -> Path:
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise UserError(
            f"the demo {what} weights are missing from {path}; build them with "
            "`python -m dflash_tui.training.build_demo`, or pass --model/--draft"
        )
    return path


def demo_target_path() -> Path:
    """Directory of the demo target (an mlx-lm `qwen3` model with its tokenizer)."""
    return _checked(_root() / "target", "target")


def demo_draft_path() -> Path:
    """Directory of the demo DFlash draft (z-lab checkpoint format)."""
    return _checked(_root() / "draft", "draft")


def demo_prompts_path() -> Path:
    """Eight requests from the demo corpus's held-out split (JSONL, a "prompt" each), for `bench --prompts`."""
    return _HERE / "heldout_prompts.jsonl"


DEMO_NAME = "demo (offline)"


def is_demo_path(name: str) -> bool:
    """True when `name` is the demo target's or draft's folder: this install's (or DFLASH_TUI_DEMO_DIR's),
    or a dflash_tui/demo/ folder of another install (a session recorded before an upgrade)."""
    path = Path(os.path.expanduser(name))  # os.path: an unknown ~user stays as it is, never raises
    if path.parts[-3:-1] == ("dflash_tui", "demo") and path.name in ("target", "draft"):
        return True
    root = os.path.normpath(_root())
    return os.path.normpath(path.parent) == root and path.name in ("target", "draft")
