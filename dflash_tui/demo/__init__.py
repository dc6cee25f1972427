"""The bundled offline demo pair: a small Python-writing target and its DFlash draft.

Built by `python -m dflash_tui.training.build_demo`; see dflash_tui/training/.
"""

from __future__ import annotations

from pathlib import Path

from dflash_tui.errors import UserError

_HERE = Path(__file__).resolve().parent


def _checked(path: Path, what: str) -> Path:
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise UserError(
            f"the demo {what} weights are missing from {path}; rebuild them with "
            "`python -m dflash_tui.training.build_demo`, or pass --model/--draft"
        )
    return path


def demo_target_path() -> Path:
    """Directory of the demo target (an mlx-lm `qwen3` model with its tokenizer)."""
    return _checked(_HERE / "target", "target")


def demo_draft_path() -> Path:
    """Directory of the demo DFlash draft (z-lab checkpoint format)."""
    return _checked(_HERE / "draft", "draft")
