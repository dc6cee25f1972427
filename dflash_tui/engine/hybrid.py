"""Hybrid targets (Qwen3.5/3.6: Gated DeltaNet + full attention): rollback of recurrent state.

Placeholder until the tape-based rollback lands: refuses to roll back a
partial accept, so a wrong answer can never come out silently.
"""

from __future__ import annotations

from typing import Any

from dflash_tui.engine.target import Target


class HybridTarget(Target):
    def rollback(self, cache: list[Any], keep: int, block_len: int) -> None:
        if keep < block_len:
            raise NotImplementedError("rollback of Gated DeltaNet state is not implemented yet")
        super().rollback(cache, keep, block_len)
