"""What a replay hands the system meter: a reply's recorded events, as the live meter took them.

A jump shows the replies before it whole; the meter must then read as it did
once the live app had finished the last of them (its prefill, graph, speedup
and the target-alone figure it divided by), so each reply on the branch in view
is fed to it again, event by event, as playing it does.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from dflash_tui.engine.events import Block, Done, Error, Prefill
from dflash_tui.sessions import Message
from dflash_tui.ui.meter import SystemMeter


def timed_batches(timed: Iterable[tuple[float, Block]], since: float,
                  window_s: float) -> list[tuple[list[Block], float]]:
    """Blocks at their recorded times as batches of at most `window_s` recorded seconds, each with the
    seconds since the batch before (the first: since `since`): what playing them in real time hands the
    meter, one graph sample a batch, however many come at once (instant, a jump)."""
    groups: list[tuple[list[Block], float, float]] = []  # (blocks, first at, last at)
    for at, block in timed:
        if groups and at - groups[-1][1] < window_s:
            blocks, first, _ = groups[-1]
            blocks.append(block)
            groups[-1] = (blocks, first, at)
        else:
            groups.append(([block], at, at))
    batches = []
    for blocks, _, end in groups:
        batches.append((blocks, max(0.0, end - since)))
        since = end
    return batches


def feed_reply(meter: SystemMeter, reply: Message, window_s: float,
               baseline_of: Callable[[Done], None]) -> Optional[Done]:
    """Give the meter a recorded reply's events in order, as playing it does: its prefill, its cycles in
    batches, then its Done (after `baseline_of` it, the target-alone figure its speedup divided by) or its
    error (the figures before it come back); a trace broken off with neither counts as failed."""
    pending: list[tuple[float, Block]] = []
    since = 0.0

    def flush() -> None:
        nonlocal pending, since
        if pending:
            meter.on_batches(timed_batches(pending, since, window_s))
            since, pending = pending[-1][0], []

    done = None
    for entry, ev in zip(reply.trace or [], reply.events()):
        at = float(entry.get("t", 0.0))
        if isinstance(ev, Block):
            pending.append((at, ev))
            continue
        flush()
        if isinstance(ev, Prefill):
            meter.on_prefill(ev)
            since = at
        elif isinstance(ev, Done):
            baseline_of(ev)
            meter.on_done(ev)
            done = ev
        elif isinstance(ev, Error):
            meter.on_failed()
    flush()
    if meter.state.generating:  # no Done, no error: the reply did not finish, so it measured nothing
        meter.on_failed()
    return done
