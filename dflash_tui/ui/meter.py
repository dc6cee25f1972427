"""The system meter: speed, tokens per cycle, measured speedup, prefill, memory, the pair and settings.

It never imports MLX: the caller passes numbers (live from the engine worker,
or recorded ones in replay). Below 60 columns it switches to short labels so
it fits the stacked 80×24 layout.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Sparkline

from dflash_tui.engine.events import Block, Done, Prefill
from dflash_tui.model_names import draft_label
from dflash_tui.figure_rules import MIN_TIMED_TOKENS
from dflash_tui.ui.figure_text import fmt_bytes, fmt_rate, fmt_seconds, sampling_label, short_name
from dflash_tui.ui.meter_words import fits as _fits, speedup_source
from dflash_tui.ui.throttle import Throttle

SPARK_SAMPLES = 90
# what a turn changes before its Done: a failed turn (no Done) puts these back as they were before it
TURN_FIGURES = ("generating", "last_block", "prompt_tokens", "cached_tokens", "prefill_tps", "ttft_s", "turn_tokens",
                "turn_seconds", "turn_cycles", "turn_cycle_tokens", "live", "samples")
LIVE_WINDOW_S = 1.0  # live tok/s averages the batches of about the last second
MIN_SAMPLE_S = 0.05  # less time than this says little about speed
COMPACT_BELOW = 60


# -- the state (pure) --------------------------------------------------------------------
@dataclass
class MeterState:
    target: Optional[str] = None
    last_block: Optional[int] = None  # block size of the latest drafting cycle
    draft: Optional[str] = None
    no_draft: Optional[str] = None  # why the pair has no draft (the target runs alone)
    device: Optional[str] = None
    where: Optional[str] = None  # a remote engine's server (its URL): the memory is there, not here
    settings: dict[str, Any] = field(default_factory=dict)
    baseline_tps: Optional[float] = None
    probe_tps: Optional[float] = None  # DFlash on the probe's prompt, measured right after the target alone
    kept_tps: Optional[float] = None  # DFlash decode tok/s of the last full reply (not stopped, not short)
    kept_is_last: bool = True  # False while the last reply was stopped or short, so it is not the one shown
    kept_block: Any = None  # the block size that last full reply ran at (its Done's: a number or "auto")
    next_block: Optional[int] = None  # the adaptive block size's next choice, from the engine
    active_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None
    rss_bytes: Optional[int] = None
    prompt_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    prefill_tps: Optional[float] = None  # only from a prefill of MIN_TIMED_TOKENS new tokens or more
    ttft_s: Optional[float] = None
    generating: bool = False
    turn_mode: Optional[str] = None  # "dflash" | "baseline" from the last Done
    turn_tokens: int = 0
    turn_seconds: float = 0.0
    turn_cycles: int = 0
    turn_cycle_tokens: int = 0
    turn_tps: Optional[float] = None  # the finished turn's decode tok/s (the engine's own figure)
    turn_tokens_per_cycle: Optional[float] = None
    turns: list[float] = field(default_factory=list)  # decode tok/s of each finished turn
    live: deque = field(default_factory=deque)  # (tokens, seconds) of recent batches
    samples: deque = field(default_factory=lambda: deque(maxlen=SPARK_SAMPLES))
    # a distributed engine's (ranks, parallelism, agreement-check ms per check) from its last Done
    ranks: Optional[tuple[int, str, float]] = None
    # the turn figures as they were before the turn streaming now (None once it is done)
    before_turn: Optional[dict[str, Any]] = field(default=None, repr=False, compare=False)

    @property
    def live_tps(self) -> Optional[float]:
        seconds = sum(s for _, s in self.live)
        return sum(t for t, _ in self.live) / seconds if seconds > 0 else None

    @property
    def tps(self) -> Optional[float]:
        """This turn's speed: live while it runs, the engine's figure once done."""
        if self.generating:
            return self.turn_tokens / self.turn_seconds if self.turn_seconds > 0 else None
        return self.turn_tps

    @property
    def tokens_per_cycle(self) -> Optional[float]:
        if self.generating:
            return self.turn_cycle_tokens / self.turn_cycles if self.turn_cycles else None
        return self.turn_tokens_per_cycle

    @property
    def mode(self) -> str:
        if self.generating or self.turn_mode is None:
            return str(self.settings.get("mode") or "dflash")
        return self.turn_mode

    @property
    def speedup_figure(self) -> Optional[tuple[float, str]]:
        """(DFlash tok/s over the target alone's, where the DFlash figure comes from): "live" (this reply,
        once it has MIN_TIMED_TOKENS tokens), "turn" (the last reply that was neither stopped nor short)
        or "probe"; None without a measured baseline."""
        if not self.baseline_tps or self.no_draft or self.mode == "baseline":
            return None
        if self.generating and self.turn_tokens >= MIN_TIMED_TOKENS and self.tps:
            return self.tps / self.baseline_tps, "live"
        if self.kept_tps:
            return self.kept_tps / self.baseline_tps, "turn"
        if self.probe_tps:
            return self.probe_tps / self.baseline_tps, "probe"
        return None

    @property
    def speedup(self) -> Optional[float]:
        figure = self.speedup_figure
        return figure[0] if figure else None

    def _keep_before_turn(self) -> None:
        self.before_turn = {k: getattr(self, k) for k in TURN_FIGURES}
        self.before_turn["live"], self.before_turn["samples"] = deque(self.live), deque(self.samples, SPARK_SAMPLES)

    def on_prefill(self, ev: Prefill) -> None:
        self._start_turn()
        self.prompt_tokens, self.cached_tokens = ev.prompt_tokens, ev.cached_tokens
        new = ev.prompt_tokens - ev.cached_tokens
        # a prefill of a few tokens times the forward's fixed cost, not a speed
        self.prefill_tps = new / ev.seconds if ev.seconds > 0 and new >= MIN_TIMED_TOKENS else None
        self.ttft_s = ev.seconds  # the first token comes out of the prefill forward

    def on_blocks(self, blocks: list[Block], elapsed_s: float) -> None:
        if not self.generating:  # blocks without a prefill first (a replay that jumped in)
            self._start_turn()
        # as the engine's tok/s: the tokens after the first (block 0, the prefill's) over the time since it
        tokens = sum(b.reply_tokens for b in blocks if b.index > 0 or b.drafted)
        for b in blocks:
            if b.drafted:
                self.last_block = len(b.drafted) + 1  # the size the engine chose for this cycle
                self.turn_cycles += 1
                self.turn_cycle_tokens += len(b.emitted)
            elif b.index > 0 and self.mode == "dflash":
                self.last_block = 1  # the block sizer chose a target-alone step (block 0 is the prefill's token)
        self.turn_tokens += tokens
        if elapsed_s > 0 and tokens:  # the first token alone (block 0) times the prefill, not a speed
            self.turn_seconds += elapsed_s
            self.live.append((tokens, elapsed_s))
            while len(self.live) > 1 and sum(s for _, s in list(self.live)[1:]) >= LIVE_WINDOW_S:
                self.live.popleft()
        # the sparkline plots the windowed rate: one quick batch must not dwarf the rest
        if sum(s for _, s in self.live) >= MIN_SAMPLE_S:
            self.samples.append(self.live_tps)

    def _start_turn(self) -> None:
        self._keep_before_turn()
        self.generating = True
        self.turn_tokens, self.turn_seconds = 0, 0.0
        self.turn_cycles = self.turn_cycle_tokens = 0
        self.live.clear()
        self.samples.clear()  # the graph is this reply's (a failed one gets the last back: before_turn)

    def on_failed(self) -> None:
        """The turn failed (no Done): a failed reply's speed, prefill and cycles are not a measurement,
        so every figure goes back to what it was before the turn (a stopped or short reply's rule, and more)."""
        before, self.before_turn = self.before_turn, None
        for k, v in (before or {}).items():
            setattr(self, k, v)
        self.generating = False
        self.live.clear()

    def on_done(self, ev: Done) -> None:
        s = ev.stats
        self.before_turn = None
        self.generating = False
        self.live.clear()
        self.turn_mode = s.get("mode")
        # the engine's figure (0 for a reply of one token: nothing after the first to time), else the live one
        tps = s["decode_tps"] if "decode_tps" in s else (self.turn_tokens / self.turn_seconds if self.turn_seconds else None)
        self.turn_tps = tps or None
        self.turn_tokens_per_cycle = s.get("tokens_per_cycle") if s.get("cycles") else None
        new = (s.get("prompt_tokens") or 0) - (s.get("cached_tokens") or 0)
        if s.get("prefill_tps") and new >= MIN_TIMED_TOKENS:
            self.prefill_tps = s["prefill_tps"]
        if self.turn_mode == "dflash":
            # a stopped or short reply times its start-up, not the pair: the figure before it stays
            full = ev.finish_reason != "cancelled" and s.get("generated_tokens", len(ev.tokens)) >= MIN_TIMED_TOKENS
            if full and self.turn_tps:
                self.kept_tps, self.kept_block = self.turn_tps, s.get("block_size")
            self.kept_is_last = full
        if s.get("ttft_s") is not None:
            self.ttft_s = s["ttft_s"]
        if s.get("peak_memory"):
            self.peak_bytes = max(self.peak_bytes or 0, int(s["peak_memory"]))
        if self.turn_tps:
            self.turns.append(self.turn_tps)
        if s.get("ranks"):
            checks = s.get("agreement_checks") or 0
            self.ranks = (int(s["ranks"]), str(s.get("parallel") or "?"), s.get("sync_ms", 0.0) / checks if checks else 0.0)


# -- the widget --------------------------------------------------------------------------
class MeterText(Widget):
    """Lines of the meter, rebuilt from the state on each refresh."""

    COMPONENT_CLASSES = {"meter--label", "meter--value", "meter--big", "meter--good", "meter--warn", "meter--muted"}
    DEFAULT_CSS = """
    MeterText { height: auto; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    MeterText > .meter--label { color: $text-muted; }
    MeterText > .meter--value { color: $text; }
    MeterText > .meter--big { color: $accent; text-style: bold; }
    MeterText > .meter--good { color: $success; text-style: bold; }
    MeterText > .meter--warn { color: $warning; text-style: bold; }
    MeterText > .meter--muted { color: $text-disabled; }
    /* on a light background the plain colours can be too pale to read (textual-light: 1.5:1) */
    MeterText:light > .meter--big { color: $text-accent; }
    MeterText:light > .meter--good { color: $text-success; }
    MeterText:light > .meter--warn { color: $text-warning; }
    """

    def __init__(self, build: Callable[["MeterText", bool], Text], lines: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self._build = build
        self._lines = lines  # fixed, so the meter never jumps in height

    def style(self, name: str) -> Style:
        return self.get_component_rich_style(f"meter--{name}")

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self._lines

    def render(self) -> Text:
        return self._build(self, self.size.width < COMPACT_BELOW)


class SystemMeter(Widget):
    DEFAULT_CSS = """
    SystemMeter { layout: vertical; height: auto; }
    SystemMeter > Sparkline { height: 1; margin: 0 1; }
    SystemMeter.-wide > Sparkline { height: 2; }
    """

    def __init__(self, repaint_interval: float = 0.0, **kwargs) -> None:
        """`repaint_interval`: while a reply streams, repaint at most this often (0: on every update)."""
        super().__init__(**kwargs)
        self.state = MeterState()
        self._head = MeterText(self._head_lines, 1, classes="meter-head")
        self._spark = Sparkline([], summary_function=max)
        self._body = MeterText(self._body_lines, 6, classes="meter-body")  # 6: a narrow meter may give tokens per cycle a line
        self._paint = Throttle(self._repaint, repaint_interval, self._later)
        self._spark_due = False

    def _later(self, delay: float, callback):
        return self.set_timer(delay, callback) if self.is_attached else None

    def compose(self) -> ComposeResult:
        yield self._head
        yield self._spark
        yield self._body

    def on_resize(self) -> None:
        self.set_class(self.size.width >= COMPACT_BELOW, "-wide")

    # -- the agreed calls -------------------------------------------------------------
    def on_prefill(self, ev: Prefill) -> None:
        self.state.on_prefill(ev)
        # the reply's first batch follows within a cycle and draws these figures in its own frame
        self._paint.reset()
        self._paint.defer()

    def on_blocks(self, blocks: list[Block], elapsed_s: float) -> None:
        self.on_batches([(blocks, elapsed_s)])

    def on_batches(self, batches: list[tuple[list[Block], float]]) -> None:
        """Several batches (blocks, wall seconds) at once: each its own sample, one repaint."""
        for blocks, elapsed_s in batches:
            self.state.on_blocks(blocks, elapsed_s)
        self._update(spark=True)

    def on_done(self, ev: Done) -> None:
        self.state.on_done(ev)
        self._update()

    def on_failed(self) -> None:
        """The turn ended in an error: the figures are those from before it."""
        self.state.on_failed()
        self._update(spark=True)

    def set_pair(self, target: Optional[str], draft: Optional[str], device: Optional[str],
                 no_draft: Optional[str] = None, where: Optional[str] = None) -> None:
        """`no_draft`: why a loaded target has no draft; the meter then says it runs alone. `where`: the
        server a remote engine runs on."""
        self.state.target, self.state.draft, self.state.device = target, draft, device
        self.state.where = where
        self.state.no_draft = no_draft if draft is None else None
        self._update()

    def set_settings(self, settings: dict[str, Any]) -> None:
        self.state.settings = dict(settings)
        self._update()

    def set_baseline_tps(self, tps: Optional[float]) -> None:
        self.state.baseline_tps = tps if tps and tps > 0 else None
        self._update()

    def set_probe_tps(self, tps: Optional[float]) -> None:
        """DFlash's speed on the probe's prompt: with the target alone's, a speedup before any reply."""
        self.state.probe_tps = tps if tps and tps > 0 else None
        self._update()

    def set_sizer_plan(self, next_block: int) -> None:
        self.state.next_block = next_block
        self._update()

    def reset_pair(self) -> None:
        """A new pair: none of the figures of the one before stays (the settings do)."""
        self.state = MeterState(settings=self.state.settings)
        self._update(spark=True)

    def set_memory(self, active_bytes: Optional[int], peak_bytes: Optional[int], rss_bytes: Optional[int]) -> None:
        s = self.state
        s.active_bytes, s.peak_bytes, s.rss_bytes = active_bytes, peak_bytes, rss_bytes
        if not s.generating:  # while a reply streams, the next batch's repaint shows it: no frame of its own
            self._paint.now()

    def reset_turns(self, keep_speedup: bool = False) -> None:
        """Forget the turn figures (a replay that jumps), keeping the pair and settings; with `keep_speedup`
        (another conversation opened), the last full reply's speedup too: it is the pair's, from this run."""
        s = self.state
        keep = MeterState(target=s.target, draft=s.draft, no_draft=s.no_draft, device=s.device, where=s.where,
                          settings=s.settings, baseline_tps=s.baseline_tps, probe_tps=s.probe_tps, next_block=s.next_block)
        if keep_speedup and s.kept_tps:
            keep.kept_tps, keep.kept_block, keep.kept_is_last = s.kept_tps, s.kept_block, False  # not the one in view
        self.state = keep
        self._update(spark=True)

    def _update(self, spark: bool = False) -> None:
        self._spark_due = self._spark_due or spark
        if self.state.generating:
            self._paint()  # the state is current; the drawing may wait for a later batch
        else:
            self._paint.now()

    def _repaint(self) -> None:
        spark, self._spark_due = self._spark_due, False
        if spark or not self._spark.data:
            samples = list(self.state.samples)
            self._spark.data = samples or [0.0]
            # a sparkline of one flat value draws solid bars: keep the row, show nothing
            self._spark.styles.visibility = "visible" if len(samples) > 1 else "hidden"
        self._head.refresh()  # fixed heights: a repaint, never a relayout
        self._body.refresh()

    # -- the lines ------------------------------------------------------------------------
    def _head_lines(self, w: MeterText, compact: bool) -> Text:
        s = self.state
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(fmt_rate(s.tps), w.style("big"))
        t.append(" tok/s", w.style("label"))
        t.append(" this turn" if s.generating and not compact else " last turn" if not compact else " turn", w.style("label"))
        live = s.live_tps if s.generating else None
        if live is not None:
            t.append(" · live ", w.style("label"))
            t.append(fmt_rate(live), w.style("value"))
        elif s.turns and not compact and len(s.turns) > 1:
            t.append(" · turns ", w.style("label"))
            t.append(" ".join(fmt_rate(x) for x in s.turns[-4:]), w.style("value"))
        return t

    def _body_lines(self, w: MeterText, compact: bool) -> Text:
        s = self.state
        label, value, muted = w.style("label"), w.style("value"), w.style("muted")
        t = Text(no_wrap=True, overflow="ellipsis")

        # speedup and tokens per cycle
        figure = s.speedup_figure
        if s.no_draft:
            t.append("target only", value)
            t.append(f" (no draft: {s.no_draft})", label)
        elif s.mode == "baseline":
            t.append("target only" + (" (baseline)" if not compact else ""), value)
        elif figure is not None:
            speedup, source = figure
            slower = round(speedup, 2) < 1  # as shown: 0.995 reads 1.00×, not slower
            t.append(f"{speedup:.2f}×", w.style("warn" if slower else "good"))  # slower than alone: a warning
            where = speedup_source(s, source)  # whose figure: the probe's, this reply's, or an earlier one
            if compact:  # the longest words that fit a narrow meter's line; where the figure is from stays
                words = ([f"{where}: slower than target alone", f"{where}: slower than alone", f"{where}: slower"]
                         if slower else [f" speedup{where}", where])
                t.append(next((x for x in words if _fits(t, x, w)), words[-1]), label)
            else:
                t.append(f" vs {fmt_rate(s.baseline_tps)} tok/s target alone{where}", label)
                if slower:
                    words = ": drafting is slower here"
                    t.append(words if _fits(t, words, w) else ": slower", w.style("warn"))
        else:
            t.append("—", value)
            why = " (DFlash not measured yet)" if s.baseline_tps else \
                " (the server reports no target-alone speed)" if s.where else " (no baseline measured yet)"
            t.append(" speedup" + ("" if compact else why), label)
        tpc = f"{s.tokens_per_cycle:.2f}" if s.tokens_per_cycle is not None else "—"
        tpc_label = " tok/cyc" if compact else " tokens/cycle"
        # narrow: on the speedup's line where it fits (else its own), never cut off
        own_line = not compact or not _fits(t, f" · {tpc}{tpc_label}", w)
        if not (compact and s.no_draft):  # no cycles without a draft: the reason gets the room
            t.append("\n" if own_line else " · ", label)
            t.append(tpc, value)
            t.append(tpc_label, label)

        # prefill: wide, after tokens per cycle where it fits (else on the line the body keeps spare)
        p = Text()
        p.append("prefill " if not compact else "pre ", label)
        new = (s.prompt_tokens or 0) - (s.cached_tokens or 0)
        if s.prefill_tps is None and s.cached_tokens and s.cached_tokens > new:
            p.append("cached", value)  # too few new tokens to time: the prompt came from the cache
            p.append(" · ttft ", label)
        else:
            p.append(fmt_rate(s.prefill_tps), value)
            p.append(" tok/s · ttft " if not compact else " t/s · ttft ", label)
        p.append(fmt_seconds(s.ttft_s), value)
        if not compact and s.prompt_tokens is not None:
            p.append(f" · {s.prompt_tokens} prompt", label)
        cached = f" ({s.cached_tokens} cached)" if not compact and s.prompt_tokens is not None and s.cached_tokens else ""
        t.append(" · " if not compact and _fits(t, f" · {p.plain}{cached}", w) else "\n", label)
        t.append_text(p)
        if _fits(t, cached, w):  # the detail that goes first where nothing else fits
            t.append(cached, label)

        # memory (a remote engine's is on its server)
        t.append("\n")
        if s.where:
            t.append("engine on " if not compact else "on ", label)
            t.append(s.where, value)
        else:
            self._memory_line(t, w, compact)

        # pair and device
        t.append("\n")
        if not s.target:
            t.append("no model loaded", muted)
        elif compact:
            t.append(short_name(s.target), value)
            t.append(" · " + (s.device or "—"), label)
        else:
            names = [short_name(s.target), draft_label(s.target, s.draft) if s.draft else "no draft"]
            if not _fits(t, f"{names[0]} ← {names[1]} · {s.device or '—'}", w):  # the device stays in sight
                names = [n.rsplit("/", 1)[-1] for n in names]
            t.append(names[0], value)
            t.append(" ← ", label)
            t.append(names[1], value if s.draft else muted)
            t.append(" · " + (s.device or "—"), label)
        if s.ranks:  # sync: the per-cycle agreement all_sum, not the sharded model's own all-reduces
            n, kind, sync = s.ranks
            t.append(f" · {n}×{kind}" if compact else f" · {n} ranks {kind} parallel · sync {sync:.2f} ms/cycle", label)
        self._settings_line(t, w, compact)
        return t

    def _memory_line(self, t: Text, w: MeterText, compact: bool) -> None:
        s = self.state
        label, value = w.style("label"), w.style("value")
        t.append("mem " if compact else "MLX ", label)
        t.append(fmt_bytes(s.active_bytes, compact), value)
        t.append(" active · " if not compact else " · pk ", label)
        t.append(fmt_bytes(s.peak_bytes, compact), value)
        t.append(" peak · RSS " if not compact else " · rss ", label)
        t.append(fmt_bytes(s.rss_bytes, compact), value)

    def _settings_line(self, t: Text, w: MeterText, compact: bool) -> None:
        s = self.state
        label, value = w.style("label"), w.style("value")
        t.append("\n")
        st = s.settings
        block = st.get("block_size")
        if st.get("mode") == "baseline" or s.no_draft:
            t.append("target only", value)
        else:
            t.append("block " if not compact else "B ", label)
            t.append(str(block) if block else "auto", value)
            top = st.get("max_block") or None
            if block == "auto" and (s.next_block or s.last_block):
                # the engine's next choice where it says; else the size of the last cycle
                size, word = (s.next_block, "next") if s.next_block else (s.last_block, "now")
                size = min(size, top) if top else size
                if compact:  # narrow: "auto→N", the settings line must still show sampling and max
                    t.append(f"→{size}" + (" alone" if size == 1 else ""), label)
                else:
                    t.append(f" ({word} {size}" + (": target alone)" if size == 1 else ")"), label)
            elif block == 1:
                t.append(" (target only)", label)
        t.append(" · ", label)
        t.append(sampling_label(st), value)
        if st.get("max_tokens"):
            t.append(" · max " if not compact else " · ≤", label)
            t.append(str(st["max_tokens"]), value)
