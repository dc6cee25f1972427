"""Words the system meter puts beside its figures: where a speedup comes from, and whether more text fits."""

from __future__ import annotations

from typing import Any, Optional, Protocol

from rich.text import Text


class Sized(Protocol):
    """The meter's text widget, as far as these words need it (its content region's width)."""

    @property
    def content_region(self) -> Any: ...


class SpeedupFacts(Protocol):
    """What the meter's state tells about the speedup shown: the settings in force, the block size the last
    full reply ran at, and whether that reply is the last one."""

    settings: dict[str, Any]
    kept_block: Optional[Any]
    kept_is_last: bool
    generating: bool


def fits(t: Text, more: str, w: Sized) -> bool:
    """Whether `more` fits after the last line of `t` within the meter's width."""
    return len(t.plain.rsplit("\n", 1)[-1]) + len(more) <= max(w.content_region.width, 1)


def speedup_source(s: SpeedupFacts, source: str) -> str:
    """What follows the speedup to say whose it is: "(probe)", nothing for the reply in view (or streaming),
    "(last full reply)" for the one before a stopped or short reply, and the block size that reply ran at
    where the settings now say another ("(last full reply, block 16)" after `/block 4`)."""
    if source == "probe":
        return " (probe)"
    if source == "live":
        return ""
    block = s.settings.get("block_size")
    if s.kept_block is not None and block is not None and s.settings.get("mode") != "baseline" and block != s.kept_block:
        return f" (last full reply, block {s.kept_block})"  # not the size in force: a figure of that size
    # a reply streaming, not yet 16 tokens: the figure shown is still the last full reply's
    return "" if s.kept_is_last and not s.generating else " (last full reply)"
