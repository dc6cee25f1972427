"""The acceptance view: what the draft proposed each cycle and what the target kept.

One row per cycle: the drafted tokens as cells, the accepted prefix
highlighted, the first rejected proposal struck through with the target's own
token right after it, and the proposals after it dimmed. Reading the
highlighted cells left to right gives the text the cycle emitted. Above the
rows: running figures for the turn.

Rows are drawn through the line API (only the visible lines are rendered, each
row's strip is cached) and blocks arrive in batches, so fast generation costs
a few repaints a second, never one per token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from textual.widgets import Static

from dflash_tui.engine.block_sizer import EXPLORE
from dflash_tui.engine.events import Block
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
ALONE_SHOWN = 4  # target-alone steps in a row before the pane says drafting does not pay
ALONE_NOTE = f"drafting does not pay here: target alone, re-checking every {EXPLORE} steps"
REMOTE_WAIT = "this server streams text only: its speculative figures, if it reports any, come when the reply ends"
REMOTE_NONE = "this server reports no speculative decoding"


@dataclass
class CountRow:
    """One verification step a server reported as counts only: no token is known, none is invented."""

    index: int
    accepted: int
    drafted: int


def text_only(b: Block) -> bool:
    """A streamed piece of a server's text: text with no token ids and nothing drafted; not a row.
    (An engine block with no tokens has no text either: a step cut at the token limit, shown as the end.)"""
    return bool(b.text) and not b.drafted and not b.emitted and not b.eos


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


# -- running figures ---------------------------------------------------------------
@dataclass
class AcceptanceStats:
    """Running figures over the blocks seen since the last reset (pure, no Textual)."""

    cycles: int = 0  # blocks with something drafted
    target_steps: int = 0  # steps the target ran alone for a token: blocks with nothing drafted after the first
    drafted: int = 0
    accepted: int = 0
    cycle_tokens: int = 0  # tokens emitted by the DFlash cycles
    position_drafted: list[int] = field(default_factory=list)  # [k-1]: cycles that drafted position k
    position_accepted: list[int] = field(default_factory=list)  # [k-1]: cycles that accepted position k
    accepted_lengths: list[int] = field(default_factory=list)  # [a]: cycles that accepted exactly a
    alone_run: int = 0  # target-alone steps in a row after the first token (the block sizer's choice)
    drafted_run: int = 0  # drafted cycles in a row
    # the sizer runs the target alone: set after ALONE_SHOWN such steps, cleared once two drafted cycles in
    # a row show drafting pays again (its single re-checks in between leave it set)
    sizer_alone: bool = False

    def add(self, blocks: Iterable[Block]) -> None:
        for b in blocks:
            n = len(b.drafted)
            if n == 0 and text_only(b):
                continue
            if n == 0:
                if b.index > 0:  # block 0 is the prefill's token, not a step
                    self.target_steps += bool(b.emitted)  # a step cut at the token limit gave nothing
                    self.alone_run, self.drafted_run = self.alone_run + 1, 0
                    self.sizer_alone = self.sizer_alone or self.alone_run >= ALONE_SHOWN
                continue
            self.alone_run, self.drafted_run = 0, self.drafted_run + 1
            if self.drafted_run >= 2:
                self.sizer_alone = False
            self._step(b.accepted, n, len(b.emitted))

    def add_steps(self, steps: Iterable[tuple[int, int]]) -> None:
        """Steps known only as (accepted, drafted) counts; each also gave the target's own token."""
        for accepted, n in steps:
            if n > 0:
                self._step(min(accepted, n), n, min(accepted, n) + 1)

    def add_totals(self, steps: int, accepted: int, drafted: Optional[int]) -> None:
        """A server's totals for a reply, without its steps: the running figures, no profile."""
        self.cycles += steps
        self.accepted += accepted
        self.drafted += drafted if drafted is not None else 0
        self.cycle_tokens += steps + accepted

    def _step(self, accepted: int, n: int, emitted: int) -> None:
        self.cycles += 1
        self.drafted += n
        self.accepted += accepted
        self.cycle_tokens += emitted
        _grow(self.position_drafted, n)
        _grow(self.position_accepted, n)
        _grow(self.accepted_lengths, n + 1)
        for k in range(n):
            self.position_drafted[k] += 1
        for k in range(min(accepted, n)):
            self.position_accepted[k] += 1
        self.accepted_lengths[min(accepted, n)] += 1

    @property
    def tokens_per_cycle(self) -> Optional[float]:
        return self.cycle_tokens / self.cycles if self.cycles else None

    @property
    def acceptance(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    def position_rates(self) -> list[Optional[float]]:
        """How often position k (1-based, index k-1) of the block was accepted."""
        return [a / d if d else None for a, d in zip(self.position_accepted, self.position_drafted)]


def _grow(values: list[int], n: int) -> None:
    if len(values) < n:
        values.extend([0] * (n - len(values)))


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
        return 3

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
        s = self.stats
        label = self.get_component_rich_style("figures--label")
        value = self.get_component_rich_style("figures--value")
        bars = self.get_component_rich_style("figures--bar")
        axis = self.get_component_rich_style("figures--axis")
        text = Text(no_wrap=True, overflow="ellipsis")
        # the longest labels with which the whole line fits (a figure is never cut off)
        level = 1 if self.size.width < 50 else 0
        first = self._first_line(level)
        while level < 2 and sum(len(part) for part, _ in first) > self.size.width:
            level += 1
            first = self._first_line(level)
        narrow = level > 0
        for part, kind in first:
            text.append(part, value if kind == "value" else label)
        text.append("\n")
        head = 13 if not narrow else 5
        rates = s.position_rates()
        text.append("per position".ljust(head) if not narrow else "pos".ljust(head), label)

        def axis_text(n: int, scale: str) -> str:  # the axis only where it does not cut the bars
            return scale if head + n + len(scale) <= self.size.width else ""

        if rates:
            text.append("".join(bar(r) for r in rates), bars)
            text.append(axis_text(len(rates), f" 1…{len(rates)}"), axis)
        else:
            text.append("no cycles yet", axis)
        text.append("\n")
        text.append("kept length".ljust(head) if not narrow else "len".ljust(head), label)
        lengths = s.accepted_lengths
        if lengths and max(lengths):
            top = max(lengths)
            text.append("".join(bar(c / top) if c else " " for c in lengths), bars)
            text.append(axis_text(len(lengths), f" 0…{len(lengths) - 1}"), axis)
        else:
            text.append("no cycles yet", axis)
        return text


# -- the rows -------------------------------------------------------------------------
class AcceptanceRows(ScrollView):
    """One line per cycle, newest at the bottom; follows the end while you are there."""

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
        self._dropped = 0  # rows pushed out at the top; keys the strip cache by absolute row number
        self._cache: dict[int, Strip] = {}
        self._lines: dict[tuple[int, int, int], Strip] = {}  # cropped to the view: (row, scroll x, width)
        self._width = 0
        self._follow = True  # keep the newest row in view (until the user scrolls up)

    def set_decoder(self, fn: Optional[Decoder]) -> None:
        self.decoder = fn
        self._relayout()

    def clear(self) -> None:
        self.rows.clear()
        self._dropped = 0
        self._cache.clear()
        self._lines.clear()
        self._width = 0
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
                self._cache.pop(self._dropped, None)  # its cropped lines age out with the size cap below
                self._dropped += 1
            self.rows.append(b)
            if self.is_mounted:  # component styles exist only once mounted; on_mount measures the rest
                self._width = max(self._width, self._row_strip(self._dropped + len(self.rows) - 1).cell_length)
        self.virtual_size = Size(self._width, len(self.rows))
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

    def _relayout(self) -> None:
        self._cache.clear()
        self._lines.clear()
        self._width = max((self._row_strip(self._dropped + i).cell_length for i in range(len(self.rows))), default=0)
        self.virtual_size = Size(self._width, len(self.rows))
        self.refresh()

    def _text(self, token: int) -> str:
        if self.decoder is None:
            return f"#{token}"
        try:
            return visible_token(self.decoder(token))
        except Exception:  # a decoder that does not know an id: show the id
            return f"#{token}"

    def _row_strip(self, number: int) -> Strip:
        strip = self._cache.get(number)
        if strip is None:
            strip = self._cache[number] = self._build(self.rows[number - self._dropped])
        return strip

    def _build(self, b: Union[Block, CountRow]) -> Strip:
        st = self.get_component_rich_style
        gap = Segment(" ")
        segs = [Segment(f"{b.index:>4} ", st("acceptance--index"))]
        if isinstance(b, CountRow):  # counts only: one blank cell per drafted position, nothing to read
            segs.append(Segment(f"{b.accepted:>2}/{b.drafted:<2} ", st("acceptance--count")))
            cells = [Segment("   ", st("acceptance--accepted"))] * b.accepted
            if b.accepted < b.drafted:
                cells.append(Segment(" ✗ ", st("acceptance--rejected")))
            cells.append(Segment(" + ", st("acceptance--target")))  # the target's own token, unknown here
            cells += [Segment(" · ", st("acceptance--dimmed"))] * max(0, b.drafted - b.accepted - 1)
            return Strip(segs + [c for cell in cells for c in (cell, gap)])
        n = len(b.drafted)
        if n == 0:
            segs.append(Segment("   · ", st("acceptance--count")))
            if b.emitted and not b.eos:
                segs += self._cells(b.emitted[:1], st("acceptance--target"))
            else:
                segs.append(Segment("⏹", st("acceptance--end")))  # the step that met EOS
            return Strip(segs)
        segs.append(Segment(f"{b.accepted:>2}/{n:<2} ", st("acceptance--count")))
        accepted = min(b.accepted, n)
        cells: list[Segment] = []
        cells += self._cells(b.drafted[:accepted], st("acceptance--accepted"))
        if b.eos and len(b.emitted) <= accepted:  # the reply ended inside the kept run (an EOS the draft got right):
            cells += [Segment("⏹", st("acceptance--end")), gap]  # nothing after it was rejected, only unused
            return Strip(segs + cells + self._cells(b.drafted[accepted:], st("acceptance--dimmed")))
        own = b.emitted[accepted] if len(b.emitted) > accepted else None
        if own is not None and b.eos and accepted == len(b.emitted) - 1:
            own = None  # the target's own token ended the reply: shown as the end mark
        if accepted < n:
            cells += self._cells(b.drafted[accepted:accepted + 1], st("acceptance--rejected"))
        if own is not None:
            if accepted < n:
                cells.pop()  # the target's token sits right against the rejected one
            cells += self._cells([own], st("acceptance--target"))
        else:
            cells += [Segment("⏹", st("acceptance--end")), gap]  # cut at EOS or the token limit
        if accepted + 1 < n:
            cells += self._cells(b.drafted[accepted + 1:], st("acceptance--dimmed"))
        return Strip(segs + cells)

    def _cells(self, tokens: list[int], style: Style) -> list[Segment]:
        out = []
        for t in tokens:
            out.append(Segment(self._text(t), style))
            out.append(Segment(" "))
        return out

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        number = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if number >= len(self.rows):
            return Strip.blank(width, base)
        key = (self._dropped + number, scroll_x, width)
        line = self._lines.get(key)
        if line is None:
            if len(self._lines) > 4 * MAX_ROWS:
                self._lines.clear()
            strip = self._row_strip(key[0]).apply_style(base)
            line = self._lines[key] = strip.crop_extend(scroll_x, scroll_x + width, base).simplify()
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
        self._paint_figures = Throttle(self.figures.refresh, figures_interval, self._later)

    def _later(self, delay: float, callback):
        return self.set_timer(delay, callback) if self.is_attached else None

    def compose(self) -> ComposeResult:
        yield self.figures
        yield self.note
        yield self.rows

    def on_mount(self) -> None:
        if not self.border_subtitle:
            self.border_subtitle = LEGEND

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
