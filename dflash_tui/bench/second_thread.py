"""A forward whose mid-forward launches run on a second thread (a benchmark variant, not the engine's).

A verify on MLX CUDA is bound by the host (docs/gpu-cycle.md): Python builds the graph, then
MLX launches it, one after the other. `Target.forward` already launches each group of
`flush_every` layers as soon as it is built (`mx.async_eval`), but on the same thread, so the
next group's Python waits for that launch. MLX releases the GIL while it launches, so a second
thread can launch group n while Python builds group n + 1. The graph is built on a stream any
thread may evaluate (`mx.new_thread_unsafe_stream`); the launches stay in order (one thread, one
queue), and the caller's own evaluation waits until the queue is empty, so only one thread
launches at a time.
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import mlx.core as mx


class Launcher:
    """One daemon thread that launches (`mx.async_eval`) what it is handed, in order."""

    def __init__(self) -> None:
        self._launch = mx.async_eval
        self._queue: "queue.Queue[list[Any]]" = queue.Queue()
        self.launched = 0
        self.error: "BaseException | None" = None
        threading.Thread(target=self._run, name="dflash-launcher", daemon=True).start()

    def _run(self) -> None:
        while True:
            arrays = self._queue.get()
            try:
                self._launch(arrays)
                self.launched += 1
            except BaseException as exc:  # noqa: BLE001 (handed to the caller by wait())
                self.error = exc
            finally:
                self._queue.task_done()

    def submit(self, *arrays: Any) -> None:
        self._queue.put(list(arrays))

    def wait(self) -> None:
        """Until everything handed over is launched; re-raises a launch's failure."""
        self._queue.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


@contextmanager
def launching_from(launcher: Launcher, stream: mx.Stream) -> Iterator[None]:
    """Inside: graphs are built on `stream` and every `mx.async_eval` goes to `launcher`; on leaving,
    waits for its launches (the caller may then evaluate on this thread)."""
    original = mx.async_eval
    mx.async_eval = launcher.submit
    try:
        with mx.stream(stream):
            yield
    finally:
        mx.async_eval = original
        launcher.wait()


def launch_forwards_from_thread(target: Any) -> Callable[[], None]:
    """Make `target.forward` launch its mid-forward groups from a second thread wherever it launches
    mid-forward at all (cycle_cost's `second-thread` setup); returns the undo. Everything this thread
    builds from now on goes on a stream any thread may evaluate (a verify's inputs, such as the
    draft's proposals, are still lazy when its first group is launched)."""
    from dflash_tui.engine.target import PIPELINE_TOKENS

    launcher, stream = Launcher(), mx.new_thread_unsafe_stream(mx.default_device())
    before = mx.default_stream(mx.default_device())
    mx.set_default_stream(stream)
    plain = target.forward

    def forward(tokens: mx.array, cache: list[Any], last_only: bool = False) -> Any:
        if target.flush_every and tokens.shape[1] <= PIPELINE_TOKENS:
            with launching_from(launcher, stream):
                return plain(tokens, cache, last_only=last_only)
        return plain(tokens, cache, last_only=last_only)

    target.forward = forward
    target.launcher = launcher  # how many groups it launched, for whoever checks

    def undo() -> None:
        target.__dict__.pop("forward", None)
        target.__dict__.pop("launcher", None)
        mx.set_default_stream(before)
    return undo
