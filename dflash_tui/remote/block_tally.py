"""What a `dflash-tui serve` block stream has given so far, and the figures of a reply that ends without
the server's own Done (stopped with Esc): the engine's definitions (engine/conversation.py) applied to
the events received.

- cycles: the blocks with something drafted; tokens per cycle: their emitted tokens over the cycles
- acceptance: accepted over drafted tokens
- decode tok/s: the tokens after the first over the time from the first token's block to the last
  block's, the one that only ends the reply included (here, when each arrived)
- block size, mode and temperature: what the request asked (or the server's own block size when it
  named none)
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

from dflash_tui.engine.events import Block, Done, Event, Prefill, cycle_counts


class BlockTally:
    def __init__(self, mode: str, block_size: Union[int, str, None], temperature: float,
                 seed: Optional[int] = None) -> None:
        self.mode = mode  # "dflash" | "baseline"
        self.block_size = block_size
        self.temperature = temperature
        self.seed = seed
        self.prefill: Optional[Prefill] = None
        self.prefill_at: Optional[float] = None
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.first_at: Optional[float] = None  # the first token's block came
        self.last_at: Optional[float] = None  # the last block came (one that only ends the reply too)
        self.blocks: list[Block] = []

    def add(self, ev: Event, now: Optional[float] = None) -> None:
        now = time.perf_counter() if now is None else now
        if isinstance(ev, Prefill):
            self.prefill, self.prefill_at = ev, now
        elif isinstance(ev, Block):
            kept = ev.emitted[: ev.reply_tokens]
            self.tokens.extend(kept)
            self.text.append(ev.text)
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            self.blocks.append(ev)

    def stats(self, now: Optional[float] = None) -> dict[str, Any]:
        now = time.perf_counter() if now is None else now
        n = len(self.tokens)
        first, last = self.first_at, self.last_at
        c = cycle_counts(self.blocks)
        phases = {k: sum(getattr(b, k) for b in self.blocks) for k in ("draft_ms", "verify_ms", "rollback_ms")}
        stats: dict[str, Any] = {
            "mode": self.mode,
            "block_size": self.block_size if self.mode == "dflash" else 1,
            "generated_tokens": n,
            "decode_s": now - self.prefill_at if self.prefill_at is not None else 0.0,
            "decode_tps": (n - 1) / (last - first) if n > 1 and first is not None and last is not None
            and last > first else 0.0,
            "cycles": c["cycles"],
            "tokens_per_cycle": c["cycle_tokens"] / c["cycles"] if c["cycles"] else 0.0,
            "acceptance": c["accepted"] / c["drafted"] if c["drafted"] else 0.0,
            **phases,
            "temperature": self.temperature,
            "seed": self.seed,
        }
        p = self.prefill
        if p is not None:
            stats.update(prompt_tokens=p.prompt_tokens, cached_tokens=p.cached_tokens, prefill_s=p.seconds,
                         prefill_tps=(p.prompt_tokens - p.cached_tokens) / p.seconds if p.seconds > 0 else 0.0,
                         ttft_s=p.seconds)
        if stats["block_size"] is None:
            del stats["block_size"]
        return stats

    def done(self, finish_reason: str, **extra: Any) -> Done:
        return Done(list(self.tokens), "".join(self.text), finish_reason, {**self.stats(), **extra})
