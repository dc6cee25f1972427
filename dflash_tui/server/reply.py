"""One request's reply, built from the engine's events: text (cut at a stop string), counts, figures."""

from __future__ import annotations

import time
from typing import Any, Optional

from dflash_tui.engine.events import Block, Done, Error, Event, Prefill
from dflash_tui.server.spec_tally import SpecTally


class StopMatcher:
    """Releases text as it comes, holding back only what could still become a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string was found: nothing after it is sent)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Reply:
    """Feed it every engine event of a job; it knows the text released so far and the final figures."""

    def __init__(self, arrived: float, prompt_tokens: int, num_spec_tokens: int, stops: list[str]) -> None:
        self.arrived = arrived
        self.prompt_tokens = prompt_tokens
        self.tally = SpecTally(num_spec_tokens)
        self.matcher = StopMatcher(stops)
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.text = ""  # what the client has been given
        self.engine_text = ""  # what the engine produced, before the stop cut
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.queue_s = 0.0
        self.first_at: Optional[float] = None
        self.last_at: Optional[float] = None
        self.decode_tps = 0.0
        self.cut = False  # a stop string ended the reply: the engine is told to stop

    def on_event(self, ev: Event) -> str:
        """The text to send the client for this event (may be empty)."""
        now = time.perf_counter()
        if isinstance(ev, Prefill):
            self.cached_tokens = ev.cached_tokens
            self.queue_s = max(0.0, now - ev.seconds - self.arrived)
            return ""
        if isinstance(ev, Block):
            self.tally.observe(ev)
            self.completion_tokens += ev.reply_tokens
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            return self._release(ev.text)
        if isinstance(ev, Done):
            self.completion_tokens = len(ev.tokens)
            self.decode_tps = float(ev.stats.get("decode_tps") or 0.0)
            # the detokenizer's last bytes arrive only with Done
            tail = ev.text[len(self.engine_text):] if ev.text.startswith(self.engine_text) else ""
            out = self._release(tail)
            if not self.cut:
                rest = self.matcher.flush()
                self.text += rest
                out += rest
                self.finish_reason = ev.finish_reason
            return out
        if isinstance(ev, Error):
            self.error = ev.message
        return ""

    def _release(self, text: str) -> str:
        self.engine_text += text
        out, hit = self.matcher.feed(text)
        self.text += out
        if hit:
            self.cut = True
            self.finish_reason = "stop"
        return out

    def metrics(self, level: str) -> dict[str, Any]:
        """vLLM's per-request metrics object: timing, and `speculative_decoding` unless level is none."""
        first = None if self.first_at is None else (self.first_at - self.arrived) * 1000
        gen = 0.0 if self.first_at is None or self.last_at is None else (self.last_at - self.first_at) * 1000
        out: dict[str, Any] = {"time_to_first_token_ms": first, "generation_time_ms": gen,
                               "queue_time_ms": self.queue_s * 1000, "tokens_per_second": self.decode_tps}
        if level != "none":
            out["speculative_decoding"] = self.tally.to_vllm(detailed=level == "detailed")
        return out
