"""Typed messages the engine worker posts to the app (from its own thread)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

from textual.message import Message

from dflash_tui.engine.events import Block, Done, Prefill


class EngineLoading(Message):
    """Load progress: a stage name and a fraction in [0, 1]."""

    def __init__(self, model: str, stage: str, fraction: float) -> None:
        super().__init__()
        self.model = model
        self.stage = stage
        self.fraction = fraction


class EngineReady(Message):
    def __init__(self, target: str, draft: Optional[str], device: str, block_size: int,
                 decoder: Callable[[int], str], seconds: float, no_draft: Optional[str] = None,
                 server: Any = None, draft_quant: int = 0) -> None:
        super().__init__()
        self.draft_quant = draft_quant  # bits of the draft's linear layers (0: as shipped)
        self.server = server  # a remote engine's ServerInfo (remote/client.py); None for the local one
        self.target = target
        self.draft = draft
        self.no_draft = no_draft  # without a draft: why (the target runs alone)
        self.device = device
        self.block_size = block_size
        self.decoder = decoder  # token id -> text; pure tokenizer work, safe on the UI thread
        self.seconds = seconds


class EngineFailed(Message):
    """A load that did not work; the message is one clear line for the user. `kept`: the pair in use
    before is still loaded, its conversation with it."""

    def __init__(self, model: str, message: str, kept: bool = False) -> None:
        super().__init__()
        self.model = model
        self.message = message
        self.kept = kept


class BaselineMeasured(Message):
    """Target-only decode speed, from the probe after load or a /baseline turn."""

    def __init__(self, tokens_per_second: Optional[float], source: str) -> None:
        super().__init__()
        self.tokens_per_second = tokens_per_second
        self.source = source  # "probe" | "turn"


class ProbeMeasured(Message):
    """DFlash's decode speed on the probe's prompt (None: not measured), right after the target alone's."""

    def __init__(self, tokens_per_second: Optional[float]) -> None:
        super().__init__()
        self.tokens_per_second = tokens_per_second


class SizerPlan(Message):
    """The adaptive block size's next choice, and how many target-alone steps in a row it has taken."""

    def __init__(self, next_block: int, alone: int) -> None:
        super().__init__()
        self.next_block = next_block
        self.alone = alone


class TurnStarted(Message):
    def __init__(self, turn_id: int, user_text: Optional[str], settings: dict) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.user_text = user_text  # None for a regenerate
        self.settings = settings


class TurnPrefill(Message):
    def __init__(self, turn_id: int, event: Prefill) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.event = event


class TurnBlocks(Message):
    """Several cycles at once: the worker coalesces them so the UI re-renders a few times a second."""

    def __init__(self, turn_id: int, blocks: list[Block], elapsed_s: float) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.blocks = blocks
        self.elapsed_s = elapsed_s  # wall seconds these blocks took

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.blocks)


class TurnDone(Message):
    def __init__(self, turn_id: int, event: Done, messages: list[dict]) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.event = event
        self.messages = messages  # the conversation as the engine now holds it


class TurnFailed(Message):
    def __init__(self, turn_id: int, message: str) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.message = message


class MemorySample(Message):
    def __init__(self, active_bytes: int, peak_bytes: int, rss_bytes: int) -> None:
        super().__init__()
        self.active_bytes = active_bytes
        self.peak_bytes = peak_bytes
        self.rss_bytes = rss_bytes


class EngineNotice(Message):
    """Something the user should see that is not a turn (e.g. a conversation was restored)."""

    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity


def _shown(app) -> bool:
    """The app's first screen is up: Textual empties the stack only after it has pruned the screens'
    widgets, and a screen being pruned or closed is no longer displayed."""
    return bool(app.screen_stack) and app.screen_stack[0].display


def while_shown(handler):
    """An engine message handler that does nothing once the app's screens are being torn down:
    the engine thread may still post while the app shuts down."""
    if inspect.iscoroutinefunction(handler):
        @functools.wraps(handler)
        async def guarded_async(self, message):
            if _shown(self):
                return await handler(self, message)
        return guarded_async

    @functools.wraps(handler)
    def guarded(self, message):
        if _shown(self):
            return handler(self, message)
    return guarded
