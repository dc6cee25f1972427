"""One streamed response, read in a thread of its own so that the turn can end at once.

The engine thread takes the stream's data lines from a queue, waiting at most the silence it allows
(long before the reply starts: a queue, a long prefill; short once it streams). Any other thread can
`abort()` it: the waiting engine thread wakes at once, and the socket is shut down so the server
sees the client go (`dflash-tui serve` then stops the generation within a cycle).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any, Callable, Iterator, Optional

from dflash_tui.remote.sse import data_lines


class Silence(Exception):
    """The server sent nothing for `seconds`."""

    def __init__(self, seconds: float, replying: bool) -> None:
        super().__init__(seconds)
        self.seconds = seconds
        self.replying = replying


class Refused(Exception):
    """The server answered with an error status; `body` is the start of what it said."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


_LINE, _END, _FAILED, _ABORTED = "line", "end", "failed", "aborted"


class LiveStream:
    """`open_stream()` returns httpx's stream context manager; `lines()` yields its SSE data lines."""

    def __init__(self, open_stream: Callable[[], Any], first_wait_s: float, stall_s: float) -> None:
        self._open = open_stream
        self.first_wait_s = first_wait_s
        self.stall_s = stall_s
        self.replying = False  # set by the reader of `lines()` once the reply's first piece came
        self._items: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self._response: Any = None
        self._aborted = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="dflash-remote-stream", daemon=True)

    def start(self) -> "LiveStream":
        self._thread.start()
        return self

    def _read(self) -> None:
        try:
            with self._open() as r:
                with self._lock:
                    self._response = r
                if self._aborted.is_set():
                    self._shut(r)
                    return
                if r.status_code != 200:
                    self._items.put((_FAILED, Refused(r.status_code, r.read()[:65536])))
                    return
                for line in data_lines(r.iter_bytes()):
                    if self._aborted.is_set():
                        return
                    self._items.put((_LINE, line))
            self._items.put((_END, None))
        except Exception as exc:  # handed to the engine thread, which says it in one line
            self._items.put((_FAILED, exc))

    def lines(self, should_cancel: Callable[[], bool], idle_s: Optional[float] = None) -> Iterator[Optional[str]]:
        """The data lines as they come, and None after each `idle_s` without one (so that the reader can
        show what it holds); ends early when aborted or `should_cancel()`, raises Silence, Refused or the
        reader's exception."""
        quiet_since = time.monotonic()
        while not should_cancel():
            limit = self.stall_s if self.replying else self.first_wait_s
            left = limit - (time.monotonic() - quiet_since)
            if left <= 0:
                self.abort()
                raise Silence(limit, self.replying)
            try:
                kind, value = self._items.get(timeout=min(left, idle_s) if idle_s else left)
            except queue.Empty:
                if idle_s:
                    yield None
                continue
            quiet_since = time.monotonic()
            if kind == _LINE:
                yield value
            elif kind == _FAILED:
                raise value
            else:  # the end of the stream, or aborted
                return

    def abort(self) -> None:
        """From any thread: end `lines()` now and hang up on the server."""
        self._aborted.set()
        self._items.put((_ABORTED, None))
        with self._lock:
            response = self._response
        if response is not None:
            self._shut(response)

    @staticmethod
    def _shut(response: Any) -> None:
        # closing a socket does not wake a thread blocked reading it; shutting it down does
        stream = getattr(response, "extensions", {}).get("network_stream")
        sock: Optional[socket.socket] = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by the other side
                pass
