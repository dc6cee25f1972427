"""Per-request speculative-decoding figures, in the shape vLLM reports them.

Field names and meanings follow vLLM's per-request acceptance metrics
(`metrics.speculative_decoding`), docs/features/speculative_decoding/acceptance_metrics.md
in vllm-project/vllm at commit 02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08
(https://docs.vllm.ai/en/stable/features/speculative_decoding/acceptance_metrics/):
mean_acceptance_length = 1 + accepted / steps (the bonus token included),
draft_acceptance_rate = accepted / drafted, acceptance_histogram[j] = steps that
accepted exactly j draft tokens (length num_spec_tokens + 1),
acceptance_histogram_by_draft_length, num_spec_steps, num_accepted_draft_tokens,
num_draft_tokens, num_spec_tokens, and with `detailed` per_step_accepted /
per_step_drafted.

One DFlash cycle is one verification step: a block with nothing drafted (the
first token after prefill, or a target-only step) is not a step, as vLLM omits
steps with no scheduled draft tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash_tui.engine.events import Block


@dataclass
class SpecTally:
    num_spec_tokens: int  # the most a step can draft: the draft's block size - 1
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def observe(self, block: Block) -> None:
        if block.drafted:
            self.per_step_accepted.append(block.accepted)
            self.per_step_drafted.append(len(block.drafted))

    @property
    def steps(self) -> int:
        return len(self.per_step_accepted)

    @property
    def accepted(self) -> int:
        return sum(self.per_step_accepted)

    @property
    def drafted(self) -> int:
        return sum(self.per_step_drafted)

    def accepted_per_position(self) -> list[int]:
        """How many steps accepted the draft token at each position (vLLM's num_accepted_tokens_per_pos)."""
        out = [0] * max([self.num_spec_tokens, *self.per_step_drafted])
        for a in self.per_step_accepted:
            for pos in range(a):
                out[pos] += 1
        return out

    def to_vllm(self, detailed: bool = False) -> dict[str, Any]:
        k = max([self.num_spec_tokens, *self.per_step_drafted])
        histogram = [0] * (k + 1)
        by_length: dict[str, list[int]] = {}
        for a, d in zip(self.per_step_accepted, self.per_step_drafted):
            histogram[a] += 1
            by_length.setdefault(str(d), [0] * (d + 1))[a] += 1
        out: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + self.accepted / self.steps if self.steps else 1.0,
            "draft_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "acceptance_histogram": histogram,
            "acceptance_histogram_by_draft_length": dict(sorted(by_length.items(), key=lambda kv: int(kv[0]))),
            "num_spec_steps": self.steps,
            "num_accepted_draft_tokens": self.accepted,
            "num_draft_tokens": self.drafted,
            "num_spec_tokens": self.num_spec_tokens,
        }
        if detailed:
            out["per_step_accepted"] = list(self.per_step_accepted)
            out["per_step_drafted"] = list(self.per_step_drafted)
        return out
