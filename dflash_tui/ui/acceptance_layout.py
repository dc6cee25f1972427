"""Lays the acceptance pane's rows and bars out to the width it has: nothing runs past its right edge.

A cycle's row that does not fit on one line goes on over more lines, indented under its first cell. Where
it is narrow, what matters less goes first: the cycle number, then the proposals the cycle left unused
(counted instead of shown); a token cell is cut (with an ellipsis) only where it alone is wider than a
line.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment

Unit = list[Segment]  # cells that stay together on a line: a token, or a rejected proposal and the target's
MIN_ROOM = 12  # fewer columns than this beside the cycle number: the number is left out
FULL_LINES = 2  # a row that would take more lines than this counts its unused proposals instead
# the narrowest terminal in which the pane beside the meter (38 or 40 columns) keeps 24: 20 inside its border
# and padding, its 15 bars beside their label; narrower, the pane has the side panes' row alone
SIDE_BY_SIDE_MIN = 64


def _width(segments: list[Segment]) -> int:
    return sum(cell_len(s.text) for s in segments)


def _cut(text: str, width: int) -> str:
    """`text` in at most `width` columns, an ellipsis where it is cut."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1).rstrip() + "…" if width > 1 else "…"


def _fit(unit: Unit, room: int) -> Unit:
    """The unit shortened to `room` columns: its widest cell is cut first, no cell below one column."""
    unit = list(unit)
    while _width(unit) > room:
        k = max(range(len(unit)), key=lambda i: cell_len(unit[i].text))
        text = unit[k].text
        wanted = cell_len(text) - (_width(unit) - room)
        if cell_len(text) <= 1 or wanted >= cell_len(text):
            break  # nothing left to shorten
        unit[k] = Segment(_cut(text, max(1, wanted)), unit[k].style)
    return unit


def _lay(head: list[Segment], units: list[Unit], width: int) -> list[list[Segment]]:
    gap = Segment(" ")
    if _width(head) + sum(_width(u) + 1 for u in units) - 1 <= width:
        return [head + [s for u in units for s in (*u, gap)]]
    indent = _width(head) if width - _width(head) >= 4 else 0
    room = max(1, width - indent)
    lines: list[list[Segment]] = [list(head)]
    used, fresh = _width(head), True  # fresh: no cell on this line yet
    for unit in units:
        unit = _fit(unit, room)
        w = _width(unit)
        if used + (0 if fresh else 1) + w > width and (not fresh or used > indent):
            lines.append([Segment(" " * indent)] if indent else [])
            used, fresh = indent, True
        if not fresh:
            lines[-1].append(gap)
            used += 1
        lines[-1].extend(unit)
        used += w
        fresh = False
    return lines


def wrap_row(head: list[Segment], units: list[Unit], unused: list[Unit], width: int) -> list[list[Segment]]:
    """One row over as many lines as `width` needs: `head` (the cycle number, then its count), the cells,
    then the proposals left unused, which are counted instead ("9 unused") where they would take the row
    past two lines. A gap (one column) follows every unit, left out at a line's end."""
    if len(head) > 1 and width - _width(head) < MIN_ROOM:
        head = head[1:]
    lines = _lay(head, units + unused, width)
    if len(lines) > FULL_LINES and unused:
        lines = _lay(head, units + [[Segment(f"{len(unused)} unused", unused[0][0].style)]], width)
    return lines


def bar_chunks(n: int, head: int, width: int) -> list[tuple[int, int]]:
    """Ranges of `n` bars, one per line, beside a label `head` columns wide (continued under it)."""
    lines = max(1, -(-n // max(1, width - head)))
    ends = [n * k // lines for k in range(lines + 1)]  # as many on each line, not full lines and a stray bar
    return list(zip(ends, ends[1:]))
