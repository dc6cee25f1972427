"""How the figures are written on screen: rates, sizes (binary units, named so), times, sampling, model names.
No Textual, no MLX: the meter and the model picker share them."""

from __future__ import annotations

from typing import Any, Optional

from dflash_tui.model_names import model_label


def fmt_rate(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def fmt_bytes(n: Optional[float], short: bool = False) -> str:
    if n is None:
        return "—"
    units = ("B", "K", "M", "G", "T") if short else ("B", "KiB", "MiB", "GiB", "TiB")
    x, i = float(n), 0
    while abs(x) >= 1024 and i < len(units) - 1:
        x /= 1024
        i += 1
    number = f"{x:.0f}" if i == 0 or x >= 100 else f"{x:.1f}"
    return number + ("" if short else " ") + units[i]


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "—"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def short_name(name: Optional[str]) -> str:
    """What the meter calls a model: its name, never where it is installed (model_names)."""
    return model_label(name)


def sampling_label(settings: dict[str, Any]) -> str:
    temp = settings.get("temperature") or 0.0
    if temp <= 0:
        return "greedy"
    parts = [f"temp {temp:g}"]
    if settings.get("top_p") not in (None, 1, 1.0):
        parts.append(f"top-p {settings['top_p']:g}")
    if settings.get("top_k"):
        parts.append(f"top-k {settings['top_k']}")
    if settings.get("min_p"):
        parts.append(f"min-p {settings['min_p']:g}")
    if settings.get("seed") is not None:
        parts.append(f"seed {settings['seed']}")
    return " ".join(parts)
