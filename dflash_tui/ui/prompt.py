"""The prompt box: several lines, Enter sends, up/down walk the history at the edges, `/` completes commands.

Editing a message of the conversation loads its text here, and the border
says so ("editing message N — Enter forks, Esc cancels"): Enter posts `EditSent`
instead of `Send`, Esc puts back what was being typed before. A slash command
typed while editing is still a command (`Send`): it runs, and the edit stays, the
message's text back in the prompt (the app ends the edit if the command took the
message out of view, as /new does).

Terminals differ in what a modified Enter sends, so shift+enter, alt+enter and
ctrl+j (a bare line feed, what many terminals send for shift+enter) all insert
a new line. A paste keeps every line and every character, except that a control
character (ESC, BEL, ...) becomes its visible symbol (ESC -> ␛): the prompt never
writes one to the terminal, and what it shows is what is sent. The same holds for
text put in the prompt any other way ($EDITOR, editing a message). A paste holding
an ESC reaches the prompt whole because the driver reads it with
ui/paste_parser.py; text in [brackets] is shown as typed, never read as markup.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from dflash_tui.printable import printable
from dflash_tui.ui.commands import parse as parse_command

HISTORY_LIMIT = 500
NEWLINE_KEYS = frozenset({"shift+enter", "alt+enter", "ctrl+j"})
PLACEHOLDER = "Message · Enter sends · shift+enter new line · / commands · F1 help"
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")
_CARRIAGE_RETURNS = re.compile(r"\r\n?")  # what many terminals paste for a line break


def prompt_text(text: str) -> str:
    """`text` as the prompt holds it: line breaks as \\n, tabs kept, other control characters as symbols."""
    return printable(_CARRIAGE_RETURNS.sub("\n", text), lines=True)


def message_text(text: str) -> str:
    """What a prompt sends: trailing whitespace and leading blank lines dropped, the first line's indent kept."""
    return _LEADING_BLANK_LINES.sub("", text.rstrip())


class PromptBox(TextArea):
    BINDINGS = [
        Binding("ctrl+e", "compose", "Editor", show=False),  # TextArea's line end stays on End
        Binding("ctrl+y", "app.copy_reply", "Copy reply", show=False),  # not TextArea's redo: the app's copy
        Binding("escape", "cancel_edit", "Cancel edit"),  # only while editing; else Esc is the app's
    ]

    class Send(Message):
        """The user pressed Enter on some text."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class EditSent(Message):
        """Enter while editing: `text` replaces the message `message_id` (a fork)."""

        def __init__(self, message_id: str, text: str) -> None:
            super().__init__()
            self.message_id = message_id
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
        self.editing: Optional[str] = None  # the id of the message being edited
        self._before_edit = ""  # what was being typed when the edit began
        self._edit_text = ""  # the edited message's text, back in the prompt after a slash command

    # -- the text ------------------------------------------------------------------
    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        """Replace the text, the cursor at its end."""
        self.load_text(prompt_text(text))
        self.move_cursor(self.document.end)

    def update_suggestion(self) -> None:
        """A slash command completes with →, as long as its name is being typed."""
        text = self.text
        if not text.startswith("/") or len(text) > 32 or " " in text or "\n" in text:
            self.suggestion = ""
            return
        match = next((s for s in self.suggestions if s.startswith(text.lower()) and s != text.lower()), "")
        self.suggestion = match[len(text):] if match else ""

    # -- keys and pastes ---------------------------------------------------------------
    async def _on_paste(self, event: events.Paste) -> None:
        # runs before TextArea's own handler, which inserts the event's text as it is
        event.text = prompt_text(event.text)

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

    # -- editing a message -----------------------------------------------------------
    def begin_edit(self, message_id: str, number: int, text: str) -> None:
        """Load message `number`'s text for editing; Enter forks the conversation there, Esc cancels."""
        if self.editing is None:
            self._before_edit = self.text
        self.editing = message_id
        self._edit_text = text
        self.value = text
        self.border_title = f"editing message {number} — Enter forks, Esc cancels"
        self.add_class("-editing")
        self.refresh_bindings()

    def end_edit(self, restore: bool = False) -> None:
        """Leave the editing state: the prompt empty, or (`restore`) with what was typed before the edit."""
        if self.editing is None:
            return
        self.editing = None
        self.value = self._before_edit if restore else ""
        self._before_edit = ""
        self.border_title = None
        self.remove_class("-editing")
        self.refresh_bindings()

    def action_cancel_edit(self) -> None:
        self.end_edit(restore=True)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action == "cancel_edit":
            return self.editing is not None
        return super().check_action(action, parameters)

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
            self.value = ""  # only blanks: nothing to send, and nothing left to send by mistake later
            return
        if self.editing is not None:
            if parse_command(text) is None:
                self.post_message(self.EditSent(self.editing, text))  # the app ends the edit once it forks
                return
            # a slash command, not the message's new text: it runs, and the edit stays with the message's text
            self.remember(text)
            self.value = self._edit_text
            self.post_message(self.Send(text))
            return
        self.remember(text)
        self.value = ""
        self.post_message(self.Send(text))
