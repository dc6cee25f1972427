"""The acceptance view: what the draft proposed each cycle and what the target kept.

One row per cycle: the drafted tokens as cells, the accepted prefix
highlighted, the first rejected proposal struck through with the target's own
token right after it, and the proposals after it dimmed. Reading the
highlighted cells left to right gives the text the cycle emitted. A row goes on
over as many lines as the pane's width needs (acceptance_layout.py). Above the
rows: running figures for the turn.

Rows are drawn through the line API (only the visible lines are rendered, each
row's lines are cached) and blocks arrive in batches, so fast generation costs
a few repaints a second, never one per token.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Callable, Optional, Union

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from textual.widgets import Static

from dflash_tui.engine.block_sizer import EXPLORE
from dflash_tui.engine.events import Block
from dflash_tui.ui.acceptance_layout import Unit, bar_chunks, wrap_row
from dflash_tui.ui.acceptance_stats import AcceptanceStats, text_only
from dflash_tui.ui.throttle import Throttle

MAX_ROWS = 500
CELL_CHARS = 10  # longer token texts are cut with an ellipsis
BARS = " ▁▂▃▄▅▆▇█"
_VISIBLE = {" ": "·", "\n": "⏎", "\t": "→", "\r": "␍"}
_VISIBLE.update({chr(c): chr(0x2400 + c) for c in range(0x20) if chr(c) not in _VISIBLE})
_VISIBLE["\x7f"] = "␡"
_VISIBLE.update({chr(c): "\ufffd" for c in range(0x80, 0xA0)})  # C1: no pictures, and never raw

Decoder = Callable[[int], str]
# each coloured swatch padded and set apart, so the four words never run together
LEGEND = ("[$text on $success 30%] kept [/] [$text-muted strike on $error 35%] rejected [/] "
          "[$text bold on $accent 45%] target [/] [$text-disabled]unused[/]")
# narrower panes: short words, then without "unused" (the dimmed cells need no swatch), then none
LEGENDS = (LEGEND, LEGEND.replace(" rejected ", " rej ").replace(" target ", " tgt "),
           LEGEND.replace(" rejected ", " rej ").replace(" target ", " tgt ").replace(" [$text-disabled]unused[/]", ""))
ALONE_NOTE = f"drafting does not pay here: target alone, re-checking every {EXPLORE} steps"
REMOTE_WAIT = "this server streams text only: its speculative figures, if it reports any, come when the reply ends"
REMOTE_NONE = "this server reports no speculative decoding"


@dataclass
class CountRow:
    """One verification step a server reported as counts only: no token is known, none is invented."""

    index: int
    accepted: int
    drafted: int


def reported_note(stats: dict[str, Any]) -> Optional[str]:
    """What the pane says about a remote reply's figures (None: not a remote reply without blocks)."""
    source = stats.get("spec_source")
    if source is None:
        return None
    if source == "none":
        return REMOTE_NONE
    steps = stats.get("cycles") or 0
    how = "per-step counts" if stats.get("spec_steps") else f"totals over {steps} steps, no per-step rows"
    return f"from {source}: {how} (counts only, no tokens)"


def visible_token(text: str, limit: int = CELL_CHARS) -> str:
    """Token text with whitespace and control characters made visible, cut to `limit` characters."""
    if text == "":
        return "∅"
    shown = "".join(_VISIBLE.get(ch, ch) for ch in text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def bar(fraction: Optional[float]) -> str:
    """One block character for a fraction in [0, 1]; blank for no data."""
    if fraction is None:
        return " "
    fraction = max(0.0, min(1.0, fraction))
    return BARS[max(1, round(fraction * (len(BARS) - 1)))] if fraction > 0 else "▁"


class AcceptanceFigures(Widget):
    """Tokens per cycle, acceptance rate, the per-position profile and the accepted-length histogram."""

    COMPONENT_CLASSES = {"figures--label", "figures--value", "figures--bar", "figures--axis"}
    DEFAULT_CSS = """
    AcceptanceFigures { height: auto; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    AcceptanceFigures > .figures--label { color: $text-muted; }
    AcceptanceFigures > .figures--value { color: $text; text-style: bold; }
    AcceptanceFigures > .figures--bar { color: $success; }
    AcceptanceFigures > .figures--axis { color: $text-disabled; }
    """

    def __init__(self, stats: AcceptanceStats, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stats = stats

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._text(width).plain.split("\n"))

    def _first_line(self, level: int) -> list[tuple[str, str]]:
        """Tokens per cycle, acceptance, cycles and target-only steps, as (text, "value" | "label"); level 0:
        in words, 1: short labels, 2: symbols (τ, c), for a pane of about 20 columns."""
        s, tpc, acc, n = self.stats, self.stats.tokens_per_cycle, self.stats.acceptance, self.stats.target_steps
        cycles = (" cycle" if s.cycles == 1 else " cycles", " cyc", "c")[level]
        alone = (f"  +{n} target-only", f" +{n} alone", f" +{n}")[level] if n else ""
        tpc_label, acc_label = ((" tok/cycle  ", " accepted  "), (" tok/cyc ", " acc "), ("τ ", " "))[level]
        return [(f"{tpc:.2f}" if tpc is not None else "—", "value"), (tpc_label, "label"),
                (f"{100 * acc:.0f}%" if acc is not None else "—", "value"), (acc_label, "label"),
                (str(s.cycles), "value"), (cycles + alone, "label")]

    def render(self) -> Text:
        return self._text(self.size.width)

    def repaint(self) -> None:
        """Redraw; lay the pane out again where the bars now take more or fewer lines."""
        self.refresh(layout=len(self.render().plain.split("\n")) != self.size.height)

    def _text(self, width: int) -> Text:
        s = self.stats
        label = self.get_component_rich_style("figures--label")
        value = self.get_component_rich_style("figures--value")
        bars = self.get_component_rich_style("figures--bar")
        axis = self.get_component_rich_style("figures--axis")
        text = Text(no_wrap=True, overflow="ellipsis")
        # the longest labels with which the whole line fits (a figure is never cut off)
        level = 1 if width < 50 else 0
        first = self._first_line(level)
        while level < 2 and sum(len(part) for part, _ in first) > width:
            level += 1
            first = self._first_line(level)
        for part, kind in first:
            text.append(part, value if kind == "value" else label)
        head = 13 if level == 0 else 5
        lengths = s.accepted_lengths
        top = max(lengths, default=0)
        profiles = [("per position", "pos", "".join(bar(r) for r in s.position_rates()), "1"),
                    ("kept length", "len", "".join(bar(c / top) if c else " " for c in lengths) if top else "", "0")]
        for name, short, shown, first_mark in profiles:
            text.append("\n")
            text.append((name if level == 0 else short).ljust(head), label)
            if not shown:
                text.append("no cycles yet", axis)
                continue
            chunks = bar_chunks(len(shown), head, width)  # bars that do not fit beside the label go on under it
            for i, (a, b) in enumerate(chunks):
                text.append(("\n" + " " * head if i else "") + shown[a:b], bars)
            scale = f" {first_mark}…{len(shown) - 1 + int(first_mark)}"
            if len(chunks) == 1 and head + len(shown) + len(scale) <= width:  # the axis only where it is whole
                text.append(scale, axis)
        return text


# -- the rows -------------------------------------------------------------------------
class AcceptanceRows(ScrollView):
    """One cycle per row, newest at the bottom, over as many lines as the width needs; follows the end while you
    are there."""

    COMPONENT_CLASSES = {
        "acceptance--index",
        "acceptance--count",
        "acceptance--accepted",
        "acceptance--rejected",
        "acceptance--target",
        "acceptance--dimmed",
        "acceptance--end",
    }
    DEFAULT_CSS = """
    AcceptanceRows { height: 1fr; scrollbar-size-vertical: 1; scrollbar-size-horizontal: 0; }
    AcceptanceRows > .acceptance--index { color: $text-disabled; }
    AcceptanceRows > .acceptance--count { color: $text-muted; }
    AcceptanceRows > .acceptance--accepted { background: $success 30%; color: $text; }
    AcceptanceRows > .acceptance--rejected { background: $error 35%; color: $text-muted; text-style: strike; }
    AcceptanceRows > .acceptance--target { background: $accent 45%; color: $text; text-style: bold; }
    AcceptanceRows > .acceptance--dimmed { color: $text-disabled; }
    AcceptanceRows > .acceptance--end { color: $text-muted; }
    """

    def __init__(self, max_rows: int = MAX_ROWS, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: deque[Union[Block, CountRow]] = deque(maxlen=max_rows)
        self.decoder: Optional[Decoder] = None
        self._dropped = 0  # rows pushed out at the top; keys the caches by absolute row number
        self._cache: dict[int, list[Strip]] = {}  # a row's lines, laid out to self._wrap columns
        self._lines: dict[tuple[int, int, int], Strip] = {}  # a line as drawn: (row, line, width)
        self._heights: deque[int] = deque()  # lines per row, in step with self.rows
        self._starts: list[int] = [0]  # each row's first line, then the total
        self._wrap = 0
        self._follow = True  # keep the newest row in view (until the user scrolls up)

    def set_decoder(self, fn: Optional[Decoder]) -> None:
        self.decoder = fn
        self._relayout()

    def clear(self) -> None:
        self.rows.clear()
        self._heights.clear()
        self._starts = [0]
        self._dropped = 0
        self._cache.clear()
        self._lines.clear()
        self.virtual_size = Size(0, 0)
        self._follow = True
        if self.is_mounted:
            self.scroll_to(0, 0, animate=False, immediate=True)
        self.refresh()

    def add(self, blocks: list[Union[Block, CountRow]]) -> None:
        blocks = [b for b in blocks if isinstance(b, CountRow) or not text_only(b)]
        if not blocks:
            return
        for b in blocks:
            if len(self.rows) == self.rows.maxlen:
                self._cache.pop(self._dropped, None)  # its drawn lines age out with the size cap below
                self._heights.popleft()
                self._dropped += 1
            self.rows.append(b)
            # component styles exist only once mounted; on_mount lays out the rest
            self._heights.append(len(self._row_lines(self._dropped + len(self.rows) - 1)) if self.is_mounted else 1)
        self._count_lines()
        if self._follow and self.is_mounted:
            self._to_end()
        self.refresh()

    def _to_end(self) -> None:
        """Show the newest row in this frame (scroll_end waits for the next layout: a frame more)."""
        self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True, force=True)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y:
            self._follow = True  # back at the newest row (or clamped there)
        elif new_value < old_value and old_value <= self.max_scroll_y:
            self._follow = False  # the user scrolled up: stay put (a clamp after a resize is not the user)

    def on_resize(self) -> None:
        if self._wrap_width() != self._wrap:
            self._relayout()
        if self._follow:
            self._to_end()

    def watch_show_vertical_scrollbar(self, shown: bool) -> None:
        if shown:  # the rows were scrolled before the layout that shows it: its thumb starts there
            self.vertical_scrollbar.position = self.scroll_y

    def on_mount(self) -> None:
        self._relayout()
        self.scroll_end(animate=False, x_axis=False)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()  # a theme change recolours every row
        self._lines.clear()

    def _wrap_width(self) -> int:
        # one column kept for the scrollbar, shown or not, so that it coming never lays the rows out again
        return max(1, self.size.width - 1) if self.size.width else 1 << 16

    def _relayout(self) -> None:
        self._cache.clear()
        self._lines.clear()
        self._wrap = self._wrap_width()
        self._heights.clear()
        self._heights.extend(len(self._row_lines(self._dropped + i)) for i in range(len(self.rows)))
        self._count_lines()
        self.refresh()

    def _count_lines(self) -> None:
        self._starts = [0, *accumulate(self._heights)]
        self.virtual_size = Size(min(self._wrap, self.size.width), self._starts[-1])

    def _text(self, token: int) -> str:
        if self.decoder is None:
            return f"#{token}"
        try:
            return visible_token(self.decoder(token))
        except Exception:  # a decoder that does not know an id: show the id
            return f"#{token}"

    def _row_lines(self, number: int) -> list[Strip]:
        lines = self._cache.get(number)
        if lines is None:
            lines = self._cache[number] = [Strip(line) for line in wrap_row(*self._build(number), self._wrap)]
        return lines

    def _build(self, number: int) -> tuple[list[Segment], list[Unit], list[Unit]]:
        """Row `number`'s cycle number and count, its cells, and the proposals it left unused; a rejected
        proposal and the target's token are one unit, drawn against each other."""
        b, st = self.rows[number - self._dropped], self.get_component_rich_style
        head = [Segment(f"{b.index:>4} ", st("acceptance--index"))]
        if isinstance(b, CountRow):  # counts only: one blank cell per drafted position, nothing to read
            head.append(Segment(f"{b.accepted:>2}/{b.drafted:<2} ", st("acceptance--count")))
            units = [[Segment("   ", st("acceptance--accepted"))] for _ in range(b.accepted)]
            if b.accepted < b.drafted:
                units.append([Segment(" ✗ ", st("acceptance--rejected"))])
            units.append([Segment(" + ", st("acceptance--target"))])  # the target's own token, unknown here
            return head, units, [[Segment(" · ", st("acceptance--dimmed"))] for _ in range(b.drafted - b.accepted - 1)]
        n = len(b.drafted)
        end = [Segment("⏹", st("acceptance--end"))]
        if n == 0:
            head.append(Segment("   · ", st("acceptance--count")))
            if b.emitted and not b.eos:
                return head, self._cells(b.emitted[:1], st("acceptance--target")), []
            return head, [end], []  # the step that met EOS
        head.append(Segment(f"{b.accepted:>2}/{n:<2} ", st("acceptance--count")))
        accepted = min(b.accepted, n)
        units = self._cells(b.drafted[:accepted], st("acceptance--accepted"))
        if b.eos and len(b.emitted) <= accepted:  # the reply ended inside the kept run (an EOS the draft got right):
            return head, units + [end], self._cells(b.drafted[accepted:], st("acceptance--dimmed"))  # none rejected
        own = b.emitted[accepted] if len(b.emitted) > accepted else None
        if own is not None and b.eos and accepted == len(b.emitted) - 1:
            own = None  # the target's own token ended the reply: shown as the end mark
        if accepted < n:
            units += self._cells(b.drafted[accepted:accepted + 1], st("acceptance--rejected"))
        if own is not None:
            target = self._cells([own], st("acceptance--target"))[0]
            if accepted < n:  # the target's token sits right against the rejected one
                target = units.pop() + target
            units.append(target)
        else:
            units.append(end)  # cut at EOS or the token limit
        return head, units, self._cells(b.drafted[accepted + 1:], st("acceptance--dimmed"))

    def _cells(self, tokens: list[int], style: Style) -> list[Unit]:
        return [[Segment(self._text(t), style)] for t in tokens]

    def render_line(self, y: int) -> Strip:
        number = self.scroll_offset.y + y
        width = self.size.width
        base = self.rich_style
        if number >= self._starts[-1]:
            return Strip.blank(width, base)
        row = bisect_right(self._starts, number) - 1
        key = (self._dropped + row, number - self._starts[row], width)
        line = self._lines.get(key)
        if line is None:
            if len(self._lines) > 4 * MAX_ROWS:
                self._lines.clear()
            strip = self._row_lines(key[0])[key[1]].apply_style(base)
            line = self._lines[key] = strip.crop_extend(0, width, base).simplify()
        return line


# -- the widget -----------------------------------------------------------------------
class AcceptanceView(Widget):
    """Running figures over the rows of the current turn."""

    DEFAULT_CSS = """
    AcceptanceView { layout: vertical; height: 1fr; }
    AcceptanceView > AcceptanceFigures { background: $boost; margin-bottom: 0; }
    AcceptanceView > .acceptance-note { height: auto; padding: 0 1; color: $warning; background: $boost; display: none; }
    AcceptanceView > .acceptance-note.-shown { display: block; }
    """

    def __init__(self, max_rows: int = MAX_ROWS, figures_interval: float = 0.0, **kwargs) -> None:
        """`figures_interval`: repaint the running figures at most this often (0: on every batch)."""
        super().__init__(**kwargs)
        self.stats = AcceptanceStats()
        self.figures = AcceptanceFigures(self.stats)
        self.rows = AcceptanceRows(max_rows)
        self.note = Static("", markup=False, classes="acceptance-note")
        self.mode = "dflash"  # "baseline": nothing is drafted on purpose; "remote": a server that streams text only
        self.message: Optional[str] = None  # what the pane says about a remote reply's figures
        self._note_text = ""
        self._paint_figures = Throttle(self.figures.repaint, figures_interval, self._later)

    def _later(self, delay: float, callback):
        return self.set_timer(delay, callback) if self.is_attached else None

    def compose(self) -> ComposeResult:
        yield self.figures
        yield self.note
        yield self.rows

    def on_resize(self) -> None:
        room = self.outer_size.width - 6  # what Textual leaves a border label: corners and blanks kept
        self.border_subtitle = next((k for k in LEGENDS if Content.from_markup(k).cell_length <= room), "")

    def add_blocks(self, blocks: list[Block]) -> None:
        """Add a batch of cycles: one repaint for the whole batch."""
        if not blocks:
            return
        self.stats.add(blocks)
        self.rows.add(list(blocks))
        self._show_note()
        self._paint_figures()

    def show_figures(self) -> None:
        """Repaint the figures now (the reply is over: its final figures, not a throttled lag)."""
        self._paint_figures.now()

    def show_reported(self, stats: dict[str, Any]) -> None:
        """A remote reply's end: the server's figures as count rows or totals, or that it reported none."""
        note = reported_note(stats)
        if note is None:
            return
        steps = stats.get("spec_steps")
        if isinstance(steps, list) and steps and self.stats.cycles == 0:
            rows = [CountRow(i + 1, int(a), int(d)) for i, (a, d) in enumerate(steps)]
            self.stats.add_steps((r.accepted, r.drafted) for r in rows)
            self.rows.add(rows)
        elif stats.get("cycles") and self.stats.cycles == 0:
            self.stats.add_totals(int(stats["cycles"]), int(stats.get("spec_accepted") or 0),
                                  stats.get("spec_drafted"))
        self.message = note
        self._show_note()
        self._paint_figures.now()

    def _show_note(self) -> None:
        text = self.message or (ALONE_NOTE if self.stats.sizer_alone and self.mode == "dflash" else "")
        if text != self._note_text:
            self._note_text = text
            self.note.update(text)
            self.note.set_class(bool(text), "-shown")

    def reset(self, mode: str = "dflash") -> None:
        """Start over for a reply whose cycles are `mode`'s ("dflash" or "baseline")."""
        self.mode = mode
        self.message = REMOTE_WAIT if mode == "remote" else None
        self.stats.__init__()  # the figures widget holds this same object
        self._show_note()
        self.rows.clear()
        self._paint_figures.now()
        self._paint_figures.reset()  # the next reply's first batch draws its figures at once

    def set_decoder(self, fn: Optional[Decoder]) -> None:
        """Token id -> its text; rows already shown are redrawn with it."""
        self.rows.set_decoder(fn)
