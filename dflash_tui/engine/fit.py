"""Does a draft fit a target? Every check with its verdict, for `load_pair` and `doctor` alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dflash_tui.engine.draft import DraftConfig


@dataclass
class Check:
    """One check: its name, whether it passed (None: could not be made), and what was seen."""

    name: str
    ok: Optional[bool]
    detail: str


def fit_checks(draft: DraftConfig, hidden_size: int, vocab_size: int, num_layers: int) -> list[Check]:
    """The draft's shapes against the target's: hidden size, vocabulary (the draft embeds
    and reads out through the target's), the layers it reads features from, its mask token."""
    c = draft
    bad_ids = [i for i in c.target_layer_ids if not 0 <= i < num_layers]
    mask_ok = 0 <= c.mask_token_id < vocab_size
    # each detail reads on its own: load_pair's error joins the failed ones
    return [
        Check("hidden size", c.hidden_size == hidden_size,
              f"hidden size {c.hidden_size} " + ("= target's" if c.hidden_size == hidden_size else f"!= target's {hidden_size}")),
        Check("vocab size", c.vocab_size == vocab_size,
              f"vocab size {c.vocab_size} " + ("= target's" if c.vocab_size == vocab_size else f"!= target's {vocab_size}")),
        Check("target layers", True, "num_target_layers not given (some published configs lack it)")
        if c.num_target_layers is None else
        Check("target layers", c.num_target_layers == num_layers,
              f"num_target_layers {c.num_target_layers} " + ("=" if c.num_target_layers == num_layers else "!=")
              + f" target's {num_layers} layers"),
        Check("layer ids", not bad_ids,
              f"target_layer_ids {bad_ids} out of range for {num_layers} layers" if bad_ids
              else f"target_layer_ids {c.target_layer_ids} within the target's {num_layers} layers"),
        Check("mask token", mask_ok,
              f"mask_token_id {c.mask_token_id} " + ("in" if mask_ok else "not in") + f" the target's vocab ({vocab_size})"),
    ]


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.ok is False]
