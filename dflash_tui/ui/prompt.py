"""The prompt box: several lines, Enter sends, up/down walk the history at the edges, `/` completes commands.

Terminals differ in what a modified Enter sends, so shift+enter, alt+enter and
ctrl+j (a bare line feed, what many terminals send for shift+enter) all insert
a new line. A paste keeps every line.
"""

from __future__ import annotations

import re
from typing import Iterable

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

HISTORY_LIMIT = 500
NEWLINE_KEYS = frozenset({"shift+enter", "alt+enter", "ctrl+j"})
PLACEHOLDER = "Message · Enter sends · shift+enter new line · / commands · F1 help"
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")


def message_text(text: str) -> str:
    """What a prompt sends: trailing whitespace and leading blank lines dropped, the first line's indent kept."""
    return _LEADING_BLANK_LINES.sub("", text.rstrip())


class PromptBox(TextArea):
    BINDINGS = [
        Binding("ctrl+e", "compose", "Editor", show=False),  # TextArea's line end stays on End
        Binding("ctrl+y", "app.copy_reply", "Copy reply", show=False),  # not TextArea's redo: the app's copy
    ]

    class Send(Message):
        """The user pressed Enter on some text."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class ComposeRequested(Message):
        """ctrl+e: the app hands the text to $EDITOR (it owns the terminal)."""

    def __init__(self, suggestions: Iterable[str] = (), **kwargs) -> None:
        super().__init__(soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                         placeholder=PLACEHOLDER, **kwargs)
        self.suggestions = sorted(suggestions)
        self.sent_history: list[str] = []  # TextArea's own `history` is its undo stack
        self._index = 0  # == len(history): editing a new message
        self._draft = ""

    # -- the text ------------------------------------------------------------------
    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        """Replace the text, the cursor at its end."""
        self.load_text(text)
        self.move_cursor(self.document.end)

    def update_suggestion(self) -> None:
        """A slash command completes with →, as long as its name is being typed."""
        text = self.text
        if not text.startswith("/") or len(text) > 32 or " " in text or "\n" in text:
            self.suggestion = ""
            return
        match = next((s for s in self.suggestions if s.startswith(text.lower()) and s != text.lower()), "")
        self.suggestion = match[len(text):] if match else ""

    # -- keys ----------------------------------------------------------------------
    async def _on_key(self, event: events.Key) -> None:
        # runs before TextArea's own handler, which would insert a new line for Enter
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
        elif event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.replace("\n", *self.selection)
        elif event.key in ("up", "down"):
            # here, not as a binding: a binding's action runs after the keys already queued, so a fast
            # "up, up, x" would type x before the cursor moved
            event.stop()
            event.prevent_default()
            self.action_history_or_up(-1 if event.key == "up" else 1)

    def action_history_or_up(self, step: int) -> None:
        """Up on the first line and down on the last walk the history; elsewhere they move the cursor."""
        edge = (self.navigator.is_first_wrapped_line(self.cursor_location) if step < 0
                else self.navigator.is_last_wrapped_line(self.cursor_location))
        if not edge or not self.sent_history or self.selection.start != self.selection.end:
            (self.action_cursor_up if step < 0 else self.action_cursor_down)()
            return
        if self._index == len(self.sent_history):
            self._draft = self.text  # keep what was being typed
        index = max(0, min(len(self.sent_history), self._index + step))
        if index == self._index:
            return
        self._index = index
        self.value = self.sent_history[index] if index < len(self.sent_history) else self._draft

    def action_compose(self) -> None:
        self.post_message(self.ComposeRequested())

    # -- sending -------------------------------------------------------------------
    def remember(self, text: str) -> None:
        if text and (not self.sent_history or self.sent_history[-1] != text):
            self.sent_history.append(text)
            del self.sent_history[:-HISTORY_LIMIT]
        self._index = len(self.sent_history)
        self._draft = ""

    def submit(self) -> None:
        text = message_text(self.text)
        if not text:
            return
        self.remember(text)
        self.value = ""
        self.post_message(self.Send(text))
