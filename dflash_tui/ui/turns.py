"""Streaming a turn: the engine gets the request once its messages are drawn, batches of cycles
go to the reply and the panes, and the UI paces the engine's batches by what drawing them cost.

Mixed into the app (ui/app.py), whose chat, panes, prompt and engine it uses.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from dataclasses import replace
from typing import Any, Optional

from dflash_tui.figure_rules import reply_summary
from dflash_tui.sessions import TraceRecorder
from dflash_tui.ui import messages as msg
from dflash_tui.ui.chat_view import AssistantHandle, AssistantMessage, Note, UserMessage
from dflash_tui.ui.messages import while_shown
from dflash_tui.ui.worker import Generate

TURN_SWITCH_INTERVAL_S = 0.0005  # the GIL switch interval while a reply streams (Python's default: 5 ms)
UI_BUDGET = 0.03  # while a reply streams, the UI thread aims to use at most this share of the time
MAX_HOLD_S = 1.0  # however costly a batch was to draw, the next one comes within this
SETTLE_FRAMES = 3  # drawn frames between a turn's start and the engine getting it
SETTLE_TIMEOUT_S = 0.5  # however long the drawing takes, the engine gets the turn within about this
QUIT_WAIT_S = 5.0  # ctrl+q while a reply streams: the longest the app waits for it to stop and be saved


# a reply's settings its recorded stats keep beside the engine's own (which has temperature and seed)
REPLY_SETTINGS = ("max_tokens", "top_p", "top_k", "min_p")


class TurnStreaming:
    """The turn's part of the app: start, stream, finish."""

    def init_turns(self) -> None:
        self.generating = False
        self.turn_id = 0
        self._handle: Optional[AssistantHandle] = None
        self._queued_turn: Optional[Generate] = None  # the turn the engine gets once its messages are drawn
        self._switch_interval: Optional[float] = None  # the interpreter's own, while a turn runs with ours
        self._painted_cpu = 0.0  # the UI thread's CPU time when the last batch was painted
        self._blink: Optional[bool] = None  # the prompt's cursor blink, while a turn turns it off
        self._turn_user_text: Optional[str] = None
        self._turn_edit: Optional[str] = None  # the id of the message the turn's text replaces (a fork)
        # the turn's message and reply on screen: they get their session ids once recorded
        self._turn_blocks: tuple[Optional[UserMessage], Optional[AssistantMessage]] = (None, None)
        self._recorder: Optional[TraceRecorder] = None  # the turn's events, timed, for the session file
        self._turn_settings: dict[str, Any] = {}  # what the turn's request asked for
        self._held_for_panes: list[tuple[list, float]] = []  # batches the panes have not shown yet
        self._quitting = False  # ctrl+q came while a reply streamed: quit once it is saved
        # the last turn failed: its message, that message on screen, and the note saying why (for ctrl+r)
        self._failed_turn: Optional[tuple[str, UserMessage, Note]] = None

    async def action_quit(self) -> None:
        """ctrl+q: a reply still streaming stops after its cycle and is saved first, as Esc keeps it;
        a second ctrl+q, or an engine that has not stopped within QUIT_WAIT_S, quits at once."""
        if self._quitting:
            self.exit()
            return
        if not self.generating:
            self.leave_conversation(self.exit)
            return
        self._quitting = True
        self.action_stop()
        self.notify("Saving the reply, then quitting… (ctrl+q again quits now)", timeout=QUIT_WAIT_S)
        self.set_timer(QUIT_WAIT_S, self.exit)

    def _quit_if_asked(self) -> None:
        if self._quitting:
            self.leave_conversation(self.exit)  # the reply it waited for may not have been saved

    def start_turn(self, text: Optional[str], edit_of: Optional[str] = None) -> None:
        """Send `text` (None: regenerate the last reply, or, after a failed turn, send its message again);
        `edit_of`: the message it replaces, in a fork."""
        retry = self._failed_message() if text is None and edit_of is None else None
        self._failed_turn = None
        self.turn_id += 1
        self.generating = True
        if retry is not None:  # the question shown last gets the reply, and is saved with it as any turn
            text, user_block, note = retry
            note.remove()  # the failed reply is gone (ctrl+r removed it): so is what said why it failed
        else:
            user_block = self.chat.add_user(text) if text is not None else None
        self._turn_user_text = text
        self._turn_edit = edit_of
        self._recorder = TraceRecorder()
        self._held_for_panes = []
        self._handle = self.chat.start_assistant()
        self._turn_blocks = (user_block, self._handle.message)
        self.chat.follow()  # scrolled up, or a message focused up there: the new turn is what matters
        self.acceptance.reset(self.acceptance_mode())
        self.meter.set_settings(self.meter_settings())
        self._turn_settings = self.generation_settings()  # a change mid-reply is for the next one
        self._queued_turn = Generate(self.turn_id, text, self._turn_settings)
        self._blink = self.prompt.cursor_blink if self._blink is None else self._blink
        self.prompt.cursor_blink = False  # a blink is a repaint twice a second, taken from the decode
        self.refresh_bindings()
        # the engine starts once the new messages and the footer are mounted and drawn: that burst
        # of layout would otherwise land in the first cycles and slow the decode
        self.run_worker(self._submit_when_drawn(self._handle), group="turn-start", exit_on_error=False)

    def _failed_message(self) -> Optional[tuple[str, UserMessage, Note]]:
        """The failed turn to send again: its message is still the last one of yours on screen (not
        after /new, another session or a message sent since); the engine never kept it."""
        failed = self._failed_turn
        if failed is None or not failed[1].is_attached:
            return None
        users = [b for b in self.chat.messages() if isinstance(b, UserMessage)]
        return failed if users and users[-1] is failed[1] else None

    async def _submit_when_drawn(self, handle: AssistantHandle) -> None:
        try:
            await asyncio.wait_for(handle.mounted(), SETTLE_TIMEOUT_S)
            for _ in range(SETTLE_FRAMES):  # the footer's keys and the message's parts mount over a few frames
                drawn = asyncio.get_running_loop().create_future()
                self.call_after_refresh(lambda: drawn.done() or drawn.set_result(None))
                await asyncio.wait_for(drawn, SETTLE_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass  # never hold a turn back for the drawing
        finally:
            self._submit_turn()

    def _submit_turn(self) -> None:
        request, self._queued_turn = self._queued_turn, None
        if request is not None and request.turn_id == self.turn_id and self.generating:
            # a full collection walks every widget and holds the GIL the engine needs; until the
            # turn ends it skips what exists now (gc.unfreeze hands those objects back)
            gc.freeze()
            # the GIL changes hands sooner, so the engine thread waits less behind a repaint
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(TURN_SWITCH_INTERVAL_S)
            self._painted_cpu = time.thread_time()
            self.engine.submit(request)

    def _current(self, turn_id: int) -> bool:
        return turn_id == self.turn_id and self._handle is not None

    @while_shown
    def on_turn_prefill(self, message: msg.TurnPrefill) -> None:
        if self._current(message.turn_id):
            self.meter.on_prefill(message.event)
            self._recorder.add(message.event)

    @while_shown
    async def on_turn_blocks(self, message: msg.TurnBlocks) -> None:
        self.call_after_refresh(self._blocks_painted)  # ask for the next batch once this one is painted
        if not self._current(message.turn_id):
            return
        handle = self._handle
        self._recorder.add_blocks(message.blocks, message.elapsed_s)
        self._held_for_panes.append((message.blocks, message.elapsed_s))
        with self.batch_update():  # the rows, the meter and the reply in one frame, not three
            if handle.showing:
                self._show_in_panes()
            # else: the batch that puts the reply's first words up draws them alone, at once (the
            # smallest frame, when the decode is fastest); the panes show its cycles with the next one
            handle.append(message.text)
            await handle.written()

    def _show_in_panes(self) -> None:
        held, self._held_for_panes = self._held_for_panes, []
        if held:
            self.acceptance.add_blocks([b for blocks, _ in held for b in blocks])
            self.meter.on_batches(held)

    def _blocks_painted(self) -> None:
        # what the UI thread spent since the last batch was painted sets how long the next one waits:
        # on this core it competes with the engine (the GIL), so drawing less often keeps decoding fast
        now = time.thread_time()
        spent, self._painted_cpu = now - self._painted_cpu, now
        if self._handle is not None and not self._handle.showing:
            self.engine.blocks_shown(0.0)  # nothing of the reply on screen yet: its first words go at once
            return
        self.engine.blocks_shown(min(MAX_HOLD_S, spent / UI_BUDGET))

    @while_shown
    def on_turn_done(self, message: msg.TurnDone) -> None:
        if not self._current(message.turn_id):
            return
        ev = message.event
        self._show_in_panes()
        self.meter.on_done(ev)
        # with the settings it ran with and the target-alone figure its speedup divided by: replay shows the same
        ran = {k: self._turn_settings[k] for k in REPLY_SETTINGS if k in self._turn_settings}
        self._recorder.add(replace(ev, stats={**ev.stats, **ran, **({"baseline_tps": self.baseline_tps}
                                                                    if self.baseline_tps else {})}))
        self._handle.finish(ev.text, reply_summary(ev))
        self.acceptance.show_reported(ev.stats)
        self.acceptance.show_figures()
        self._end_turn()
        self._record_turn(ev.text)
        self._quit_if_asked()

    @while_shown
    def on_turn_failed(self, message: msg.TurnFailed) -> None:
        if not self._current(message.turn_id):
            return
        self._show_in_panes()
        self.meter.on_failed()  # a failed reply's speed is not a measurement: the figures before it stay
        self._handle.finish(None, "failed")
        self.acceptance.show_figures()
        note = self.chat.add_note(message.message, "error")
        user_block = self._turn_blocks[0]
        if self._turn_user_text is not None and self._turn_edit is None and user_block is not None:
            self._failed_turn = (self._turn_user_text, user_block, note)  # ctrl+r sends it again
        self._turn_blocks = (None, None)
        self._end_turn()
        self.after_failed_turn(message.message)
        self._quit_if_asked()

    def after_failed_turn(self, reason: str) -> None:
        """Hook: what else a failed turn undoes (an edit, in ui/branching.py)."""

    def _end_turn(self) -> None:
        gc.unfreeze()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        self.generating = False
        self._handle = None
        if self._blink is not None:
            self.prompt.cursor_blink, self._blink = self._blink, None
        self.refresh_bindings()
