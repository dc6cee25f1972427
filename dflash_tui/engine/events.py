"""Typed events the engine yields: the contract between engine, UI, sessions and replay."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Union


@dataclass
class Prefill:
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    type: str = field(default="prefill", init=False)


@dataclass
class Block:
    """One cycle. `emitted` = accepted proposals + the target's own token, up to the end of
    the reply: `drafted[:accepted] == emitted[:accepted]` always. With `eos`, the cycle
    ended the reply and the last of `emitted` is the end-of-sequence token, which is not
    part of the reply's tokens or `text`.

    A block with nothing drafted is a plain target step (the first token after
    prefill, or every token in baseline mode).
    """

    index: int
    drafted: list[int]
    accepted: int
    emitted: list[int]
    text: str
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    rollback_ms: float = 0.0
    eos: bool = False
    type: str = field(default="block", init=False)

    @property
    def reply_tokens(self) -> int:
        """How many of `emitted` belong to the reply (the EOS does not)."""
        return len(self.emitted) - (1 if self.eos else 0)


@dataclass
class Done:
    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: dict[str, Any] = field(default_factory=dict)
    type: str = field(default="done", init=False)


@dataclass
class Error:
    message: str
    type: str = field(default="error", init=False)


Event = Union[Prefill, Block, Done, Error]

_TYPES = {"prefill": Prefill, "block": Block, "done": Done, "error": Error}


def event_to_dict(event: Event) -> dict[str, Any]:
    return asdict(event)


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from `event_to_dict` output; raises ValueError on foreign data."""
    if not isinstance(data, dict) or data.get("type") not in _TYPES:
        raise ValueError(f"not an engine event: {data!r:.80}")
    cls = _TYPES[data["type"]]
    fields = {k: v for k, v in data.items() if k != "type"}
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"bad {data['type']} event: {exc}") from None


def cycle_counts(events: list[Any]) -> dict[str, int]:
    """The cycles among a reply's events, counted as the engine counts them for its stats: a block that
    drafted is a cycle, and its emitted tokens (the end-of-sequence that ended the reply included) are
    what it gave."""
    counts = {"cycles": 0, "cycle_tokens": 0, "drafted": 0, "accepted": 0}
    for b in events:
        if isinstance(b, Block) and b.drafted:
            counts["cycles"] += 1
            counts["cycle_tokens"] += len(b.emitted)
            counts["drafted"] += len(b.drafted)
            counts["accepted"] += b.accepted
    return counts
