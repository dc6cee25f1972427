"""One request's reply, built from the engine's events: text (cut at a stop string), counts, figures."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Optional

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
    """Feed it every engine event of a job; it knows the text released so far, the blocks that may
    be sent (`released`, after each event) and the final figures.

    A block is sent once all of its text is released, so the block stream never shows text the reply
    holds back as a possible stop string. When a stop string cuts the reply, the block it cuts is
    trimmed as the text is (its text ends at the cut, its emitted tokens with the last one that gives
    the kept text a character), the blocks past the cut are dropped, and `cut_done` ends the block
    stream with a Done of what was sent. Every count (usage, figures) is of the blocks sent.
    """

    def __init__(self, arrived: float, prompt_tokens: int, num_spec_tokens: int, stops: list[str],
                 token_texts: Callable[[list[int]], list[str]] = lambda ids: [""] * len(ids)) -> None:
        self.arrived = arrived
        self.prompt_tokens = prompt_tokens
        self.tally = SpecTally(num_spec_tokens)
        self.matcher = StopMatcher(stops)
        self.token_texts = token_texts
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.tokens: list[int] = []  # the reply's tokens, as sent
        self.cycle_tokens = 0  # tokens the drafting cycles sent gave (for tokens per cycle)
        self.released: list[Block] = []  # the blocks to send after the last event, in order
        self._held: list[tuple[int, Block]] = []  # (where its text starts in engine_text, block) not sent yet
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
        self.released = []
        if isinstance(ev, Prefill):
            self.cached_tokens = ev.cached_tokens
            self.queue_s = max(0.0, now - ev.seconds - self.arrived)
            return ""
        if isinstance(ev, Block):
            self._held.append((len(self.engine_text), ev))
            out = self._release(ev.text)
            self.released = self._settle()
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            return out
        if isinstance(ev, Done):
            self.decode_tps = float(ev.stats.get("decode_tps") or 0.0)
            # the detokenizer's last bytes arrive only with Done
            tail = ev.text[len(self.engine_text):] if ev.text.startswith(self.engine_text) else ""
            out = self._release(tail)
            if not self.cut:
                rest = self.matcher.flush()
                self.text += rest
                out += rest
                self.finish_reason = ev.finish_reason
            self.released = self._settle(everything=not self.cut)
            if not self.cut:
                self.completion_tokens = len(ev.tokens)
            return out
        if isinstance(ev, Error):
            self.error = ev.message
        return ""

    def _settle(self, everything: bool = False) -> list[Block]:
        """The held blocks that can go now: those whose text is all released; after a cut, the one it
        cuts, trimmed (the rest are dropped)."""
        sent_to = len(self.text)
        out = []
        while self._held:
            start, block = self._held[0]
            if self.cut:
                if start < sent_to:
                    out.append(self._trimmed(block, sent_to - start))
                self._held.pop(0)
                continue
            if not everything and start + len(block.text) > sent_to:
                break
            out.append(block)
            self._held.pop(0)
        for block in out:
            self.tally.observe(block)
            self.completion_tokens += block.reply_tokens
            self.tokens += block.emitted[: block.reply_tokens]
            if block.drafted:
                self.cycle_tokens += len(block.emitted)
        return out

    def _trimmed(self, block: Block, room: int) -> Block:
        """`block` cut to its first `room` characters of text, and the emitted tokens that give them."""
        if room >= len(block.text):
            return block
        keep, at = 0, 0
        for text in self.token_texts(block.emitted):
            if at >= room:
                break
            keep, at = keep + 1, at + len(text)
        # as the engine does for an EOS inside a block: what was not emitted was not accepted
        return replace(block, emitted=block.emitted[:keep], accepted=min(block.accepted, keep),
                       text=block.text[:room], eos=False)

    def cut_done(self, engine_stats: dict[str, Any]) -> Done:
        """The block stream's Done for a reply a stop string cut: what was sent, finished by "stop".
        The engine's timings stay (it may have run a cycle past the cut); its counts are the sent blocks'."""
        t = self.tally
        stats = {**engine_stats, "generated_tokens": len(self.tokens), "cycles": t.steps,
                 "tokens_per_cycle": self.cycle_tokens / t.steps if t.steps else 0.0,
                 "acceptance": t.accepted / t.drafted if t.drafted else 0.0}
        return Done(list(self.tokens), self.text, "stop", stats)

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
