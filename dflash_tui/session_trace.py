"""A reply's trace: its engine events, each with "t" = seconds since the turn started.

`TraceRecorder` times the events as the UI gets them; `timed_trace` gives
times to a trace recorded without them (the first session layout).
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable, Optional

from dflash_tui.engine.events import Block, Event


def without_time(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "t"}


def _cycle_seconds(entry: dict[str, Any]) -> float:
    return sum(float(entry.get(k) or 0.0) for k in ("draft_ms", "verify_ms", "rollback_ms")) / 1000.0


def timed_trace(trace: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copy of a trace where every entry has a non-decreasing "t".

    Entries recorded without one get it from the engine's own timings: prefill
    seconds, then each cycle's draft + verify + rollback time.
    """
    out: list[dict[str, Any]] = []
    t = 0.0
    for entry in trace:
        entry = dict(entry)
        given = entry.get("t")
        if isinstance(given, (int, float)) and not isinstance(given, bool) and math.isfinite(given):
            t = max(t, float(given))
        elif entry.get("type") == "prefill":
            t = max(t, float(entry.get("seconds") or 0.0))
        elif entry.get("type") == "block":
            t += _cycle_seconds(entry)
        elif entry.get("type") == "done":
            stats = entry.get("stats") or {}
            t = max(t, float(stats.get("prefill_s") or 0.0) + float(stats.get("decode_s") or 0.0))
        entry["t"] = round(t, 6)
        out.append(entry)
    return out


class TraceRecorder:
    """Turns the events of one reply into a trace with per-event times.

    Blocks often arrive in batches (the UI coalesces them); a batch that took
    `elapsed_s` is spread over that time in proportion to each cycle's own
    draft + verify + rollback time, so replay shows them one by one again.
    """

    def __init__(self, clock=time.perf_counter) -> None:
        self._clock = clock
        self._start = clock()
        # events as they came, turned into dicts only when the trace is read: while a reply
        # streams, the UI thread does as little as it can
        self._entries: list[tuple[float, Event]] = []

    @property
    def trace(self) -> list[dict[str, Any]]:
        from dflash_tui.engine.events import event_to_dict

        return [{"t": round(t, 6), **event_to_dict(event)} for t, event in self._entries]

    def _now(self, now: Optional[float]) -> float:
        return (self._clock() if now is None else now) - self._start

    def _last_t(self) -> float:
        return self._entries[-1][0] if self._entries else 0.0

    def add(self, event: Event, now: Optional[float] = None) -> None:
        self._entries.append((max(self._last_t(), self._now(now)), event))

    def add_blocks(self, blocks: list[Block], elapsed_s: float, now: Optional[float] = None) -> None:
        end = max(self._last_t(), self._now(now))
        begin = max(self._last_t(), end - max(0.0, elapsed_s))
        weights = [max((b.draft_ms + b.verify_ms + b.rollback_ms) / 1000.0, 1e-6) for b in blocks]
        total, acc = sum(weights), 0.0
        for block, w in zip(blocks, weights):
            acc += w
            self._entries.append((begin + (end - begin) * acc / total, block))
