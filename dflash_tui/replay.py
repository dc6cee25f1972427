"""Recorded traces back into the same events, at the recorded timing.

A pure-Python player: the UI asks it, on its own timer, what is due now
(`poll`), and drives it with pause, step, speed and jumps. Nothing here
imports Textual or MLX, so a replay never loads a model.

The whole session lies on one recorded timeline: each message starts after the
previous one ends plus a short gap; an assistant reply's events sit at their
recorded offsets from the start of the turn.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from dflash_tui.engine.events import Block, Event
from dflash_tui.sessions import Message, Session

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
MESSAGE_GAP_S = 0.5  # recorded seconds between messages, so a turn boundary reads as one


@dataclass(frozen=True)
class Cue:
    """Something the UI shows at recorded time `at`.

    kind: "message" (a message shown whole), "start" (an assistant reply
    begins streaming), "event" (an engine event of that reply), "end" (the
    reply is complete; `text` is its final text).
    """

    at: float
    message: int
    kind: str
    event: Optional[Event] = None
    text: str = ""


def build_cues(messages: Sequence[Message], gap_s: float = MESSAGE_GAP_S) -> tuple[list[Cue], list[float]]:
    """All cues in time order, and the recorded time at which each message starts."""
    cues: list[Cue] = []
    starts: list[float] = []
    t = 0.0
    for i, m in enumerate(messages):
        if i:
            t += gap_s
        starts.append(t)
        if m.role != "assistant" or not m.trace:
            cues.append(Cue(t, i, "message", text=m.content))
            continue
        cues.append(Cue(t, i, "start"))
        end = t
        for entry, event in zip(m.trace, m.events()):
            end = max(end, t + float(entry.get("t", 0.0)))
            cues.append(Cue(end, i, "event", event))
        cues.append(Cue(end, i, "end", text=m.content))
        t = end
    return cues, starts


def recorded_events(session: Session) -> list[list[Event]]:
    """Each assistant reply's events, as recorded (what a replay feeds back)."""
    return [m.events() for m in session.messages if m.role == "assistant" and m.trace]


class Player:
    """A cursor over a session's cues, with a clock that runs at `speed` × wall time."""

    def __init__(self, session_or_messages, speed: float = 1.0, paused: bool = False,
                 gap_s: float = MESSAGE_GAP_S) -> None:
        messages = session_or_messages.messages if isinstance(session_or_messages, Session) else session_or_messages
        self.messages: list[Message] = list(messages)
        self.cues, self.starts = build_cues(self.messages, gap_s)
        self.duration = self.cues[-1].at if self.cues else 0.0
        self.position = 0.0  # recorded seconds
        self.cursor = 0  # the next cue to hand out
        self.speed = clamp_speed(speed)
        self.instant = math.isinf(speed)
        self.paused = paused
        self._message = 0  # the message being shown
        self._last_wall: Optional[float] = None

    # -- where we are ------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.cursor >= len(self.cues)

    @property
    def current_message(self) -> int:
        """The message being shown (or about to be, right after a jump)."""
        return self._message

    def seconds_to_next(self) -> Optional[float]:
        """Wall seconds until the next cue is due (None: paused or finished)."""
        if self.finished or self.paused:
            return None
        if self.instant:
            return 0.0
        return max(0.0, (self.cues[self.cursor].at - self.position) / self.speed)

    # -- time --------------------------------------------------------------------
    def poll(self, now: Optional[float] = None) -> list[Cue]:
        """Cues due at wall time `now` (time.monotonic() by default)."""
        now = time.monotonic() if now is None else now
        dt = 0.0 if self._last_wall is None else max(0.0, now - self._last_wall)
        self._last_wall = now
        return self.advance(dt)

    def advance(self, wall_s: float) -> list[Cue]:
        """Let `wall_s` seconds of wall time pass; returns the cues that became due."""
        if self.paused or self.finished:
            return []
        if self.instant:
            self.position = self.duration
        else:
            self.position = min(self.duration, self.position + wall_s * self.speed)
        return self._take_until(self.position)

    def _take_until(self, position: float) -> list[Cue]:
        out = []
        while self.cursor < len(self.cues) and self.cues[self.cursor].at <= position + 1e-9:
            out.append(self.cues[self.cursor])
            self.cursor += 1
        if out:
            self._message = out[-1].message
        return out

    # -- controls ------------------------------------------------------------------
    def toggle_pause(self) -> bool:
        self.paused = not self.paused
        self._last_wall = None  # the time spent paused does not count
        return self.paused

    def step(self) -> list[Cue]:
        """Pause, and hand out everything up to and including the next cycle."""
        self.paused = True
        out = []
        while self.cursor < len(self.cues):
            cue = self.cues[self.cursor]
            out.append(cue)
            self.cursor += 1
            self._message = cue.message
            self.position = max(self.position, cue.at)
            if cue.kind == "event" and isinstance(cue.event, Block):
                break
        return out

    def set_speed(self, speed: float) -> float:
        self.instant = math.isinf(speed)
        self.speed = clamp_speed(speed)
        return self.speed

    def faster(self) -> float:
        self.instant = False
        return self.set_speed(next((s for s in SPEEDS if s > self.speed), SPEEDS[-1]))

    def slower(self) -> float:
        self.instant = False
        return self.set_speed(next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0]))

    def toggle_instant(self) -> bool:
        self.instant = not self.instant
        return self.instant

    def jump(self, message: int) -> int:
        """Go to the start of `message`: the UI shows messages before it whole and plays on from there."""
        if not self.messages:
            return 0
        message = max(0, min(message, len(self.messages) - 1))
        self.cursor = next(i for i, c in enumerate(self.cues) if c.message == message)
        self.position = self.starts[message]
        self._message = message
        self._last_wall = None
        return message

    def next_message(self) -> Optional[int]:
        """Jump to the next message; None when already at the last one."""
        target = self._message + 1
        if target >= len(self.messages):
            return None
        return self.jump(target)

    def previous_message(self) -> int:
        """Restart the message being shown, or go to the one before when it has just started.

        Once the replay has finished, the last message restarts paused: played on (at 8×, or instant)
        it would be over again at once, and `p` would seem to do nothing; a second `p` goes further back."""
        current = self._message
        if self.finished and self.messages:
            self.paused = True
            self._last_wall = None
        started = self.position > self.starts[current] + 1e-9
        return self.jump(current if started else current - 1)


def clamp_speed(speed: float) -> float:
    if math.isinf(speed) or math.isnan(speed):
        return SPEEDS[-1]
    return max(SPEEDS[0], min(SPEEDS[-1], float(speed)))


def speed_label(player: Player) -> str:
    if player.instant:
        return "instant"
    return f"{player.speed:g}×"


def play(player: Player, sink: Callable[[list[Cue]], None], clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep, max_wait_s: float = 0.02) -> float:
    """Drive a player in real time until it finishes; returns the wall seconds it took."""
    start = clock()
    cues = player.poll(start)
    if cues:
        sink(cues)
    while not player.finished:
        wait = player.seconds_to_next()
        if wait is None:  # paused: nothing will come
            break
        if wait > 0:
            sleep(min(wait, max_wait_s))
        cues = player.poll(clock())
        if cues:
            sink(cues)
    return clock() - start


def events_of(cues: Iterable[Cue]) -> list[Event]:
    return [c.event for c in cues if c.kind == "event" and c.event is not None]
