"""Replay a saved session: the conversation, the acceptance view and the meter, at the recorded timing.

No model is loaded: everything shown comes from the session file (its events,
timings, figures and the recorded text of each token id).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from dflash_tui.engine.events import Block, Done, Error, Prefill
from dflash_tui.figure_rules import measures_target_alone, reply_summary
from dflash_tui.model_names import model_label
from dflash_tui.printable import one_line, plain
from dflash_tui.replay import Cue, Player, speed_label
from dflash_tui.sessions import Message, Session
from dflash_tui.ui.acceptance import AcceptanceView
from dflash_tui.ui.chat_view import AssistantHandle, ChatView
from dflash_tui.ui.keys import SWITCH_PANE_KEY
from dflash_tui.ui.meter import SystemMeter
from dflash_tui.ui.pane_switch import PaneSwitching
from dflash_tui.ui.replay_meter import feed_reply, timed_batches
from dflash_tui.ui.plain_notify import PlainNotify
from dflash_tui.ui.turns import REPLY_SETTINGS

TICK_S = 1 / 30  # the screen asks the player what is due this often


class ReplayBar(Static):
    """One line: playing or paused, speed, which message, recorded time."""

    DEFAULT_CSS = """
    ReplayBar { height: 1; padding: 0 1; background: $boost; color: $text-muted; }
    """


class ReplayScreen(PaneSwitching, PlainNotify, Screen[None]):
    # its own layout (the chat screen's, in short): conversation left, decoder panes right; stacked when narrow
    DEFAULT_CSS = """
    ReplayScreen { layout: vertical; }
    ReplayScreen #replay-main { height: 1fr; }
    ReplayScreen #replay-chat { width: 1fr; height: 100%; border: round $panel-lighten-2; border-title-color: $text-muted; padding: 0 1; scrollbar-size-vertical: 1; }
    ReplayScreen #replay-side { width: 62; height: 100%; }
    ReplayScreen #replay-acceptance { height: 1fr; border: round $panel-lighten-2; border-title-color: $text-muted; }
    ReplayScreen #replay-meter { height: auto; border: round $panel-lighten-2; border-title-color: $text-muted; }
    ReplayScreen.-wide #replay-side { width: 45%; }
    ReplayScreen.-narrow #replay-main { layout: vertical; }
    ReplayScreen.-narrow #replay-chat { height: 1fr; }
    ReplayScreen.-narrow #replay-side { width: 100%; height: 11; layout: horizontal; }
    ReplayScreen.-narrow #replay-acceptance { width: 1fr; height: 100%; }
    ReplayScreen.-narrow #replay-meter { width: 40; height: 100%; }
    ReplayScreen.-narrow.-short #replay-side { height: 10; }
    ReplayScreen.-narrow.-slim #replay-meter { display: none; }
    ReplayScreen.-narrow.-slim.-slim-meter #replay-meter { display: block; width: 1fr; }
    ReplayScreen.-narrow.-slim.-slim-meter #replay-acceptance { display: none; }
    """
    # priority: the focused conversation pane must not take space or → for its own scrolling
    BINDINGS = [
        Binding("space", "toggle_pause", "Play/pause", priority=True),
        Binding("right", "step", "Step", priority=True),
        Binding("escape,q", "close", "Close"),  # early: a narrow footer keeps the way out
        Binding("plus,equals_sign", "faster", "Speed", key_display="+/-", priority=True),  # one footer key for two
        Binding("minus,underscore", "slower", "Slower", priority=True, show=False),
        Binding("n", "next_message", "Next msg", priority=True),
        Binding("p", "previous_message", "Prev msg", priority=True),
        Binding("i", "instant", "Instant", priority=True),
        # under 64 columns: the pane or the meter (ui/pane_switch.py); their border title says the key
        Binding(SWITCH_PANE_KEY, "switch_pane", "Meter/pane", show=False),
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    meter_title = "system · recorded"

    def __init__(self, session: Session, speed: float = 1.0, paused: bool = False, tick_s: float = TICK_S) -> None:
        super().__init__()
        self.session = session
        self.player = Player(session, speed=speed, paused=paused)
        self.tick_s = tick_s
        self._handle: Optional[AssistantHandle] = None
        self._last_event_at = 0.0  # recorded time of the last event fed to the meter
        self._busy = False  # a jump is rebuilding the views
        self._status = ""
        self._pending_text = ""  # reply text not yet handed to the chat view
        self._figures_from: Optional[Message] = None  # the reply whose Done the meter's turn figures are from
        # the app saves with each reply the target-alone figure its speedup divided by, and none where it had
        # none; a file from before that has none at all, and the session's own figure stands in
        self._baseline_per_reply = any(d is not None and d.stats.get("baseline_tps")
                                       for d in (m.done() for m in session.replies()))

    def compose(self) -> ComposeResult:
        with Horizontal(id="replay-main"):
            yield ChatView(id="replay-chat")
            with Vertical(id="replay-side"):
                yield AcceptanceView(id="replay-acceptance")
                yield SystemMeter(id="replay-meter")
        yield ReplayBar(id="replay-bar")
        yield Footer(compact=True, show_command_palette=False)  # eight keys: ctrl+p still opens it

    @property
    def chat(self) -> ChatView:
        return self.query_one(ChatView)

    @property
    def acceptance(self) -> AcceptanceView:
        return self.query_one(AcceptanceView)

    @property
    def meter(self) -> SystemMeter:
        return self.query_one(SystemMeter)

    @property
    def pane_screen(self) -> Screen:
        return self

    def on_resize(self, event: events.Resize) -> None:
        self.fit_panes(event.size.width)  # too narrow for both: the pane or the meter alone (f4)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        return self.can_switch_pane() if action == "switch_pane" else True

    def on_mount(self) -> None:
        s = self.session
        self.chat.border_title = plain(f"replay · {s.title or 'untitled'}")  # Text: a title is data, not markup
        self.fit_panes(self.size.width)
        self.acceptance.set_decoder(s.decode)
        draft = one_line(model_label(s.draft)) if s.draft else None  # names, never install paths
        self.meter.set_pair(one_line(model_label(s.target)), draft, one_line(s.device or "recorded"),
                            where=one_line(s.server) if s.server else None)
        self.meter.set_settings(recorded_settings(s))
        self.meter.set_baseline_tps(recorded_baseline(s))
        self.set_interval(self.tick_s, self._tick)
        self._show_status()

    # -- playing ------------------------------------------------------------------
    def _tick(self) -> None:
        if self._busy:
            return
        self._play(self.player.poll(time.monotonic()))
        self._append("")
        self._show_status()

    def _play(self, cues: list[Cue]) -> None:
        """Feed cues to the widgets; consecutive blocks go in together, to the meter in batches of what
        one tick at 1× holds (so that many at once, instant or after a wait, still draw the reply's graph)."""
        batch: list[tuple[float, Block]] = []

        def flush() -> None:
            nonlocal batch
            if batch:
                blocks = [b for _, b in batch]
                self.acceptance.add_blocks(blocks)
                self.meter.on_batches(timed_batches(batch, self._last_event_at, TICK_S))
                self._last_event_at = batch[-1][0]
                self._append("".join(b.text for b in blocks))
                batch = []

        for cue in cues:
            if cue.kind == "event" and isinstance(cue.event, Block):
                batch.append((cue.at, cue.event))
                continue
            flush()
            self._cue(cue)
        flush()

    def _cue(self, cue: Cue) -> None:
        message = self.session.messages[cue.message]
        if cue.kind == "message":
            self._add_whole(cue.message)
            if message.role == "assistant":
                self._say_whose(message)  # a reply recorded without its events: no figures of its own
        elif cue.kind == "start":
            self._handle = self.chat.start_assistant(markdown_interval=None)  # no engine to make room for
            self._pending_text = ""
            self.acceptance.reset()
            self._say_whose(None)  # the reply in view is this one, its figures streaming
            done = message.done()
            self.meter.set_settings(reply_settings(self.session, message))  # those this reply ran with
            if done is not None:
                self._baseline_of(done)
                self._peak_of(done)
            self._last_event_at = cue.at
        elif cue.kind == "event":
            ev = cue.event
            if isinstance(ev, Prefill):
                self.meter.on_prefill(ev)
                self._last_event_at = cue.at
            elif isinstance(ev, Done):
                self._baseline_of(ev)
                self.meter.on_done(ev)
                self._figures_from = message
                self._say_whose(message)
                self.acceptance.show_reported(ev.stats)  # a remote reply's figures, as it showed them
            elif isinstance(ev, Error):
                self.chat.add_note(ev.message, "error")
                # as the live meter: a failed reply measured nothing, so the figures before it stay, with
                # the settings of the reply they are from (as a jump to here shows them)
                self.meter.on_failed()
                self.meter.set_settings(reply_settings(self.session, self._figures_from))
                self.acceptance.show_figures()
                self._say_whose(message)
        elif cue.kind == "end":
            if self._handle is not None:
                self._handle.finish(cue.text, footer_of(message))
                self._handle = None
                self._pending_text = ""

    def _say_whose(self, reply: Optional[Message]) -> None:
        """Under the meter, where the reply in view has no figures of its own (it failed, or was recorded
        without them), that the figures shown are those before it, or that there are none."""
        words = ""
        if reply is not None and reply.done() is None:
            failed = any(e.get("type") == "error" for e in reply.trace or [])
            if self._figures_from is not None:
                words = ("reply failed" if failed else "none recorded") + ": figures from before"
            else:
                words = "reply failed: no figures" if failed else "no figures recorded"
        self.meter.border_subtitle = words

    def _baseline_of(self, done: Done) -> None:
        """The target-alone figure the live meter divided by at this reply (none: it had none, so no
        speedup), never the session's, which may be a later reply's or another branch's."""
        if self._baseline_per_reply:  # else (an older file) the session's figure stays
            self.meter.set_baseline_tps(done.stats.get("baseline_tps"))

    def _peak_of(self, done: Done) -> None:
        """From a reply's start, the peak the live meter showed once it was done: the peak since load
        (the engine's sampler keeps the highest), so this reply's recorded peak and those before it."""
        peak = done.stats.get("peak_memory")
        if peak:
            s = self.meter.state
            self.meter.set_memory(s.active_bytes, max(s.peak_bytes or 0, int(peak)), s.rss_bytes)

    def _append(self, text: str) -> None:
        # held back until the reply widget is mounted: text streamed before that is shown twice
        self._pending_text += text
        if self._handle is not None and self._handle.message.is_mounted and self._pending_text:
            self._handle.append(self._pending_text)
            self._pending_text = ""

    def _add_whole(self, index: int) -> None:
        m = self.session.messages[index]
        if m.role == "user":
            self.chat.add_user(m.content)
        elif m.role == "system":
            self.chat.add_system(m.content)
        else:
            self.chat.add_assistant(m.content, footer_of(m))

    async def _jump(self, index: Optional[int]) -> None:
        """Show the messages before `index` whole and play on from its start."""
        if index is None:
            self.notify("That was the last message", timeout=2)
            return
        self._busy = True
        try:
            if self._handle is not None:
                await self._handle.finish()  # ends its stream before the message goes
            self._handle = None
            self._pending_text = ""
            await self.chat.clear()
            self.acceptance.reset()
            self.meter.reset_turns()
            self.meter.set_baseline_tps(recorded_baseline(self.session))  # as at the start: none of a later reply's
            shown = None  # the last reply whose figures the meter shows: its settings go beside them
            in_view = None  # the last reply shown, figures or not
            for i in range(index):
                self._add_whole(i)
                m = self.session.messages[i]
                in_view = m if m.role == "assistant" else in_view
                if m.role == "assistant" and m.trace:  # the meter as the live one read after it (this branch)
                    self.meter.set_settings(reply_settings(self.session, m))
                    if feed_reply(self.meter, m, TICK_S, self._baseline_of) is not None:
                        shown = m
            self.meter.set_settings(reply_settings(self.session, shown))
            self._figures_from = shown
            self._say_whose(in_view)
        finally:
            self._busy = False
        self._show_status()

    def _show_status(self) -> None:
        p = self.player
        if p.finished:
            state = "■ finished"
        elif p.paused:
            state = "‖ paused"
        else:
            state = "▶ playing"
        total = len(self.session.messages)
        shown = min(p.current_message + 1, total) if total else 0
        text = (f"{state} · {speed_label(p)} · message {shown}/{total} · "
                f"{p.position:.1f} / {p.duration:.1f} s recorded")
        if text != self._status:
            self._status = text
            self.query_one(ReplayBar).update(text)

    # -- controls ------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        if self.player.finished:
            self.call_later(self._restart)
            return
        self.player.toggle_pause()
        self._show_status()

    async def _restart(self) -> None:
        await self._jump(self.player.jump(0))
        self.player.paused = False

    def action_step(self) -> None:
        self._play(self.player.step())
        self._show_status()

    def action_faster(self) -> None:
        self.player.faster()
        self._show_status()

    def action_slower(self) -> None:
        self.player.slower()
        self._show_status()

    def action_instant(self) -> None:
        self.player.toggle_instant()
        self._show_status()

    async def action_next_message(self) -> None:
        await self._jump(self.player.next_message())

    async def action_previous_message(self) -> None:
        await self._jump(self.player.previous_message())

    def action_close(self) -> None:
        self.dismiss(None)


def footer_of(message) -> str:
    """A reply's footer in the live chat's words (figure_rules.reply_summary), from its recorded Done."""
    return reply_summary(message.done())


def recorded_settings(session: Session) -> dict:
    """The session's settings, its block size as the run used it: no size set meant the draft's own,
    which the replies recorded (the live meter showed that number, not "auto")."""
    settings = dict(session.settings)
    if settings.get("block_size") is None:
        for m in session.replies():
            done = m.done()
            size = done.stats.get("block_size") if done is not None and done.stats.get("mode") == "dflash" else None
            if size is not None:
                settings["block_size"] = size
                break
    return settings


def reply_settings(session: Session, message) -> dict:
    """The settings a reply ran with, as its Done recorded them (block size, baseline or not, sampling,
    max tokens); what it did not record (a reply stopped during its prefill has no block size), or a
    reply with no Done at all (None: no reply), the session's."""
    settings = recorded_settings(session)
    done = message.done() if message is not None else None
    if done is None:
        return settings
    stats = done.stats
    mode = stats.get("mode")
    ran = {k: stats[k] for k in ("temperature", *REPLY_SETTINGS) if stats.get(k) is not None}
    size = 1 if mode == "baseline" else stats.get("block_size")
    return {**settings, **ran, "mode": mode, "block_size": settings.get("block_size") if size is None else size}


def recorded_baseline(session: Session) -> Optional[float]:
    """Target-only tok/s measured in the recorded run: the session's probe, else its last baseline turn."""
    if session.baseline_tps:
        return session.baseline_tps
    for m in reversed(session.replies()):
        done = m.done()
        if done is not None and measures_target_alone(done):
            return float(done.stats["decode_tps"])
    return None


class ReplayApp(PlainNotify, App[None]):
    """`dflash-tui replay`: the replay screen on its own (app.tcss styles the messages as in the chat)."""

    CSS_PATH = str(Path(__file__).with_name("app.tcss"))
    TITLE = "dflash-tui replay"

    def __init__(self, session: Session, speed: float = 1.0, paused: bool = False, theme: Optional[str] = None) -> None:
        super().__init__()
        self.session = session
        self.speed = speed
        self.start_paused = paused
        self.wanted_theme = theme  # None: the one in config.toml

    def on_mount(self) -> None:
        self._setup_theme()
        self.push_screen(ReplayScreen(self.session, self.speed, self.start_paused), lambda _: self.exit())

    def _setup_theme(self) -> None:
        try:
            from dflash_tui.config import load_config
            from dflash_tui.ui.themes import load_themes

            themes, _ = load_themes()
            for theme in themes:
                self.register_theme(theme)
            wanted = self.wanted_theme or load_config().config.theme
            if wanted in self.available_themes:
                self.theme = wanted
        except Exception:  # a theme problem must not stop a replay; the default theme is fine
            pass
