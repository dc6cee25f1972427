"""Pieces shared by the trainers: learning-rate schedule, progress lines, sharded saves."""

from __future__ import annotations

import math
import sys
import time
from typing import Optional, TextIO

import mlx.core as mx



def lr_at(step: int, total: int, peak: float, warmup: int, final_fraction: float = 0.1) -> float:
    """Linear warm-up to `peak`, then cosine decay to `final_fraction * peak` at `total`."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


class Progress:
    """A progress bar on a terminal, plain periodic lines otherwise (logs, pipes)."""

    def __init__(self, phase: str, total: int, every_s: float = 5.0, stream: Optional[TextIO] = None):
        self.phase = phase
        self.total = max(1, total)
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last = -1e9

    def update(self, step: int, force: bool = False, **values: float) -> None:
        now = time.perf_counter()
        if not force and not self.tty and now - self._last < self.every_s:
            return
        if not force and self.tty and now - self._last < 0.2:
            return
        self._last = now
        frac = min(1.0, step / self.total)
        fields = " ".join(f"{k} {v:.4g}" for k, v in values.items())
        elapsed = now - self.start
        if self.tty:
            bar = "#" * int(frac * 24)
            self.stream.write(f"\r[{self.phase}] [{bar:<24}] {step}/{self.total} {fields} {elapsed:.0f}s ")
        else:
            self.stream.write(f"[{self.phase}] {step}/{self.total} {fields} {elapsed:.0f}s\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def compiled_or_plain(compiled, plain, name: str):
    """Use the compiled step; if its first call fails to trace, fall back to the plain one."""
    chosen = {"fn": compiled, "tried": False}

    def call(*args):
        if chosen["tried"]:
            return chosen["fn"](*args)
        chosen["tried"] = True
        try:
            out = compiled(*args)
            mx.eval(out)
            return out
        except Exception as exc:  # an MLX backend that cannot compile this graph: slower, still right
            log(f"[{name}] compile failed ({type(exc).__name__}: {str(exc).splitlines()[0]}); running uncompiled")
            chosen["fn"] = plain
            return plain(*args)

    return call


class StepBudget:
    """A step count fitted to a wall-clock budget, re-fitted as the pace settles.

    The first steps pay for compiling (once per new shape), so the pace is
    measured over the most recent window, not from the start.
    """

    def __init__(self, seconds: Optional[float], steps: Optional[int], window: int = 50, first_fit: int = 30):
        self.seconds = seconds
        self.fixed = steps
        self.total = steps if steps is not None else 10**9
        self.window = window
        self.first_fit = first_fit
        self._marks: list[tuple[int, float]] = []
        self._ticks = 0

    def tick(self, step: int, elapsed: float) -> bool:
        """Record that `step` steps are done after `elapsed` seconds of this run; True once the time is up."""
        if self.seconds is None:
            return False
        self._ticks += 1
        if self.fixed is None:
            self._marks = (self._marks + [(step, elapsed)])[-(self.window + 1):]
            if self._ticks >= self.first_fit and (self._ticks == self.first_fit or self._ticks % self.window == 0):
                (s0, t0), (s1, t1) = self._marks[0], self._marks[-1]
                pace = max(t1 - t0, 1e-6) / max(1, s1 - s0)
                self.total = max(step + 1, step + int((self.seconds - elapsed) / pace))
        return elapsed > self.seconds

    @property
    def fitted(self) -> bool:
        return self.fixed is not None or self.total < 10**9
