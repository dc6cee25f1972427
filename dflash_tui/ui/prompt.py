"""The prompt box: one line, Enter sends, up/down walk the history, `/` completes commands."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import Input

from dflash_tui.ui.commands import slash_suggestions

HISTORY_LIMIT = 500


class PromptBox(Input):
    BINDINGS = [
        Binding("up", "history(-1)", "Previous", show=False),
        Binding("down", "history(1)", "Next", show=False),
    ]

    class Send(Message):
        """The user pressed Enter on some text."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(
            placeholder="Message  (Enter sends · / for commands · ctrl+p palette)",
            suggester=SuggestFromList(slash_suggestions(), case_sensitive=False),
            **kwargs,
        )
        self.history: list[str] = []
        self._index = 0  # == len(history): editing a new line
        self._draft = ""

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        if self._index == len(self.history):
            self._draft = self.value  # keep what was being typed
        self._index = max(0, min(len(self.history), self._index + step))
        self.value = self.history[self._index] if self._index < len(self.history) else self._draft
        self.cursor_position = len(self.value)

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
            del self.history[:-HISTORY_LIMIT]
        self._index = len(self.history)
        self._draft = ""

    async def action_submit(self) -> None:
        text = self.value.strip()
        if not text:
            return
        self.remember(text)
        self.value = ""
        self.post_message(self.Send(text))
