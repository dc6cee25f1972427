"""Ctrl+C (SIGINT) and SIGTERM reach the engine at once, not after uvicorn's grace period.

uvicorn answers the signal by closing the listening socket and waiting up to its
`timeout_graceful_shutdown` for open requests, then cancels them: a reply that is
still generating was cut with a traceback in the log, a 500 or a dropped stream,
and the process waited out the whole grace period. Chaining a callback in front of
the handler uvicorn installs lets the engine stop the running generation within a
cycle, so each open request ends with its own short error ("the server is shutting
down") and uvicorn finds nothing left to wait for.

The callback is chained from the event loop's thread when a request arrives (the
handler in force then is uvicorn's); uvicorn puts its predecessors back when it
stops, which drops this one with it, and re-raises the signal itself, so Ctrl+C
still ends the process as it did before.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any, Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def chain_exit_signals(callback: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
    """Run `callback` on `loop` as soon as SIGINT or SIGTERM arrives, then the handler in force.
    Idempotent; a no-op off the main thread (only it may set handlers) and where no Python
    handler is in force (SIG_DFL or SIG_IGN: nothing to chain to)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if not callable(current) or getattr(current, "dflash_exit_callback", None) is callback:
            continue
        signal.signal(sig, _chained(callback, loop, current))


def _chained(callback: Callable[[], None], loop: asyncio.AbstractEventLoop, then: Callable[[int, Any], Any]):
    def handler(signum: int, frame: Any) -> Any:
        try:  # the handler runs between two bytecodes of the loop's thread: the callback waits for the loop
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed
            pass
        return then(signum, frame)

    handler.dflash_exit_callback = callback  # type: ignore[attr-defined]
    return handler
