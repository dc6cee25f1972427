"""The acceptance pane's running figures over a reply's cycles: pure, no Textual."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from dflash_tui.engine.events import Block

ALONE_SHOWN = 4  # target-alone steps in a row before the pane says drafting does not pay


def text_only(b: Block) -> bool:
    """A streamed piece of a server's text: text with no token ids and nothing drafted; not a row.
    (An engine block with no tokens has no text either: a step cut at the token limit, shown as the end.)"""
    return bool(b.text) and not b.drafted and not b.emitted and not b.eos


@dataclass
class AcceptanceStats:
    """Running figures over the blocks seen since the last reset (pure, no Textual)."""

    cycles: int = 0  # blocks with something drafted
    target_steps: int = 0  # steps the target ran alone for a token: blocks with nothing drafted after the first
    drafted: int = 0
    accepted: int = 0
    cycle_tokens: int = 0  # tokens emitted by the DFlash cycles
    position_drafted: list[int] = field(default_factory=list)  # [k-1]: cycles that drafted position k
    position_accepted: list[int] = field(default_factory=list)  # [k-1]: cycles that accepted position k
    accepted_lengths: list[int] = field(default_factory=list)  # [a]: cycles that accepted exactly a
    alone_run: int = 0  # target-alone steps in a row after the first token (the block sizer's choice)
    drafted_run: int = 0  # drafted cycles in a row
    # the sizer runs the target alone: set after ALONE_SHOWN such steps, cleared once two drafted cycles in
    # a row show drafting pays again (its single re-checks in between leave it set)
    sizer_alone: bool = False

    def add(self, blocks: Iterable[Block]) -> None:
        for b in blocks:
            n = len(b.drafted)
            if n == 0 and text_only(b):
                continue
            if n == 0:
                if b.index > 0:  # block 0 is the prefill's token, not a step
                    self.target_steps += bool(b.emitted)  # a step cut at the token limit gave nothing
                    self.alone_run, self.drafted_run = self.alone_run + 1, 0
                    self.sizer_alone = self.sizer_alone or self.alone_run >= ALONE_SHOWN
                continue
            self.alone_run, self.drafted_run = 0, self.drafted_run + 1
            if self.drafted_run >= 2:
                self.sizer_alone = False
            self._step(b.accepted, n, len(b.emitted))

    def add_steps(self, steps: Iterable[tuple[int, int]]) -> None:
        """Steps known only as (accepted, drafted) counts; each also gave the target's own token."""
        for accepted, n in steps:
            if n > 0:
                self._step(min(accepted, n), n, min(accepted, n) + 1)

    def add_totals(self, steps: int, accepted: int, drafted: Optional[int]) -> None:
        """A server's totals for a reply, without its steps: the running figures, no profile."""
        self.cycles += steps
        self.accepted += accepted
        self.drafted += drafted if drafted is not None else 0
        self.cycle_tokens += steps + accepted

    def _step(self, accepted: int, n: int, emitted: int) -> None:
        self.cycles += 1
        self.drafted += n
        self.accepted += accepted
        self.cycle_tokens += emitted
        _grow(self.position_drafted, n)
        _grow(self.position_accepted, n)
        _grow(self.accepted_lengths, n + 1)
        for k in range(n):
            self.position_drafted[k] += 1
        for k in range(min(accepted, n)):
            self.position_accepted[k] += 1
        self.accepted_lengths[min(accepted, n)] += 1

    @property
    def tokens_per_cycle(self) -> Optional[float]:
        return self.cycle_tokens / self.cycles if self.cycles else None

    @property
    def acceptance(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    def position_rates(self) -> list[Optional[float]]:
        """How often position k (1-based, index k-1) of the block was accepted."""
        return [a / d if d else None for a, d in zip(self.position_accepted, self.position_drafted)]


def _grow(values: list[int], n: int) -> None:
    if len(values) < n:
        values.extend([0] * (n - len(values)))
