"""Rank 0's requests, handed to the other ranks through mx.distributed collectives.

Under `serve --distributed` only rank 0 hears the clients. Before each request
it sends the other ranks what they need to run the same turn: the prompt's
token ids and the generation settings (the seed fixed by rank 0, so sampling
draws the same on every rank). Every message is two all_sums on small int32
arrays: a header (kind, payload length), then the payload's bytes; the
followers add zeros, so the sum is rank 0's message on every rank.

While no request comes, rank 0 sends a heartbeat every `heartbeat_s`: a
follower's watchdog then also catches a rank 0 that hangs between requests,
and rank 0 learns of a dead follower before the next client does.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional

import mlx.core as mx

from dflash_tui.engine.distributed import DistributedError, Ranks, rank_lost

if TYPE_CHECKING:
    from dflash_tui.engine.conversation import Conversation, GenerationSettings

HEARTBEAT, REQUEST, SHUTDOWN = 0, 1, 2


@dataclass
class Request:
    prompt: list[int]
    settings: "GenerationSettings"


class Channel:
    """The same call on every rank, in the same order: `send_*` on rank 0, `receive` on the others."""

    def __init__(self, ranks: Ranks, heartbeat_s: Optional[float] = None) -> None:
        self.ranks = ranks
        # well inside the followers' watchdog timeout
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else max(0.5, min(5.0, ranks.timeout_s / 4 or 5.0))
        self.last_sent = time.monotonic()

    def _sum(self, values: list[int]) -> list[int]:
        try:
            out = mx.distributed.all_sum(mx.array(values, dtype=mx.int32), group=self.ranks.group, stream=mx.cpu)
            mx.eval(out)
        except RuntimeError as exc:
            raise rank_lost(exc) from None
        return out.tolist()

    def _exchange(self, kind: int, payload: bytes) -> tuple[int, bytes]:
        leader = self.ranks.is_leader
        kind, size = self._sum([kind, len(payload)] if leader else [0, 0])
        data = b""
        if size:
            data = bytes(self._sum(list(payload) if leader else [0] * size))
        self.last_sent = time.monotonic()
        self.ranks.beat()
        return kind, data

    # -- rank 0 ---------------------------------------------------------------------------
    def send_request(self, prompt: list[int], settings: "GenerationSettings") -> Request:
        """Hand a request to every rank; returns it as every rank will run it (the seed fixed)."""
        if settings.seed is None and settings.temperature > 0:
            settings = replace(settings, seed=random.getrandbits(30))
        body = json.dumps({"prompt": [int(t) for t in prompt], "settings": settings.to_dict()}).encode()
        self._exchange(REQUEST, body)
        return decode(body)

    def heartbeat_due(self) -> bool:
        return time.monotonic() - self.last_sent >= self.heartbeat_s

    def heartbeat(self) -> None:
        self._exchange(HEARTBEAT, b"")

    def shutdown(self) -> None:
        self._exchange(SHUTDOWN, b"")

    # -- the others -----------------------------------------------------------------------
    def receive(self) -> Optional[Request]:
        """The next request from rank 0 (heartbeats skipped); None when rank 0 shuts down."""
        while True:
            kind, data = self._exchange(HEARTBEAT, b"")
            if kind == REQUEST:
                return decode(data)
            if kind == SHUTDOWN:
                return None
            if kind != HEARTBEAT:
                raise DistributedError(f"rank 0 sent an unknown message kind {kind}; stopping")


def decode(body: bytes) -> Request:
    from dflash_tui.engine.conversation import GenerationSettings

    data = json.loads(body)
    return Request(prompt=[int(t) for t in data["prompt"]], settings=GenerationSettings(**data["settings"]))


def follow(conversation: "Conversation", channel: Channel) -> None:
    """A follower's whole life: run every request rank 0 sends, output discarded, until it shuts
    down; a turn that failed midway (the ranks out of step) ends it with DistributedError."""
    ranks = channel.ranks
    while True:
        request = channel.receive()
        if request is None:
            return
        for _ in conversation.generate_tokens(request.prompt, request.settings):
            pass
        if ranks.broken is not None:
            raise DistributedError(ranks.broken)
