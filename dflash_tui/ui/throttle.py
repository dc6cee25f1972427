"""A repaint that runs at most once per interval: panes that change on every batch need not draw on every batch.

While a reply streams, the UI thread competes with the engine thread for the CPU
and the GIL, so every repaint it skips is decode time given back.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

Scheduler = Callable[[float, Callable[[], Any]], Any]  # (delay in seconds, callback) -> a handle, or None if it cannot


class Throttle:
    """Call `fn` at most once per `interval` seconds (0: on every call).

    A call within the interval is folded into one trailing call at the interval's end
    (through `later`, when given), so the last state is always drawn; `now()` draws at once.
    """

    def __init__(self, fn: Callable[[], Any], interval: float = 0.0, later: Optional[Scheduler] = None) -> None:
        self.fn = fn
        self.interval = interval
        self.later = later
        self.pending = False  # a call was folded: what is shown lags the state
        self._scheduled = False
        self._last = float("-inf")

    def __call__(self) -> None:
        wait = self.interval - (time.monotonic() - self._last)
        if wait <= 0:
            self.now()
            return
        self.pending = True
        if self.later is not None and not self._scheduled:
            self._scheduled = self.later(wait, self._trailing) is not None  # None: could not be scheduled

    def _trailing(self) -> None:
        self._scheduled = False
        if self.pending:
            self.now()

    def reset(self) -> None:
        """Forget the last run: the next call runs at once (a new reply's first batch)."""
        self._last = float("-inf")

    def defer(self) -> None:
        """The state changed: draw it with the next call (or `now`), not in a frame of its own."""
        self.pending = True

    def now(self) -> None:
        """Run at once (a final state)."""
        self.pending = False
        self._last = time.monotonic()
        self.fn()
