"""Counts and sizes read from a model's config.json, checked: whole numbers within bounds. Doctor and the
draft loader read them alike, so what doctor passes loads, and a hostile value (10**18 layers, "384",
null) is one line naming the key rather than a list as long as the value or a TypeError."""

from __future__ import annotations

import json
from typing import Any


class ConfigValueError(ValueError):
    """Config values out of bounds; the message names each key (for the user)."""


LIMITS = {
    "num_hidden_layers": (1, 10_000),
    "hidden_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 16),
    "num_key_value_heads": (1, 1 << 16),
    "head_dim": (1, 1 << 16),
    "global_head_dim": (1, 1 << 16),
    "num_global_key_value_heads": (1, 1 << 16),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 32),
    "sliding_window": (1, 1 << 32),
    "num_kv_shared_layers": (0, 10_000),
    "full_attention_interval": (1, 10_000),
    "linear_num_key_heads": (1, 1 << 16),
    "linear_num_value_heads": (1, 1 << 16),
    "linear_key_head_dim": (1, 1 << 16),
    "linear_value_head_dim": (1, 1 << 16),
    "linear_conv_kernel_dim": (1, 1 << 10),
    "intermediate_size": (1, 1 << 24),
    "block_size": (1, 1 << 16),
    "max_window_layers": (0, 10_000),
    "mask_token_id": (0, 1 << 24),
    "num_target_layers": (1, 10_000),
}


REQUIRED = object()


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def shorten(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: Any) -> str:
    """A config value as JSON writes it, short."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return f"{json.dumps(value[:40])} (a string)"
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    return shorten(value, 40)


class ConfigReader:
    """Reads counts and sizes from a config dict, checked: a whole number (not a string, a fraction,
    null or true) within LIMITS. Every problem is kept, and a safe stand-in returned in its place so
    the reading goes on: `problems` then names each key that is wrong."""

    def __init__(self, cfg: dict[str, Any], where: str = "config.json"):
        self.cfg = cfg
        self.where = where
        self.problems: list[str] = []

    def int(self, key: str, default: Any = REQUIRED, unset: tuple = ()) -> Any:
        """`default` when the key is absent or its value is in `unset` (None, 0: what the models read
        as "not given"); a missing key without a default is a problem."""
        lo, hi = LIMITS.get(key, (1, 1 << 32))
        value = self.cfg.get(key)
        if key not in self.cfg or (value is None and None in unset) or (is_whole(value) and value == 0 and 0 in unset):
            if default is REQUIRED:
                return self.note(f"no {key}", lo)
            return default
        if not is_whole(value):
            return self.note(f"{key} is {shown(value)}, not a whole number", lo)
        if not lo <= value <= hi:
            return self.note(f"{key} is {shorten(value, 40)}, out of range ({lo} to {hi})", lo)
        return value

    def note(self, problem: str, stand_in: int) -> int:
        if problem not in self.problems:
            self.problems.append(problem)
        return stand_in

    def check(self) -> None:
        if self.problems:
            raise ConfigValueError(f"{self.where}: " + "; ".join(self.problems))
