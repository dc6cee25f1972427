"""Saving the conversation, and not leaving one that could not be saved without asking.

When the session file cannot be written (a full disk, a read-only data folder) the conversation
lives only in memory: a new conversation, another session opened, another pair loaded or quitting
would drop it for good, so each asks first.
"""

from __future__ import annotations

from typing import Any, Callable, Optional


class SessionSaving:
    """The app's part: `save_session`, and `leave_conversation` around whatever replaces the conversation."""

    _unsaved: Optional[str] = None  # why the last save failed; None once saved (or nothing to save)

    def save_session(self, announce: bool = True) -> None:
        if self.session is None:
            if announce:
                self.notify("Nothing to save yet", severity="warning")
            return
        try:
            path = self._store().save(self.session)
        except OSError as exc:
            self._unsaved = str(exc)
            self.notify(f"could not save the session: {exc}. The conversation stays in memory.",
                        title="session not saved", severity="error", timeout=10)
            return
        self._unsaved = None
        if announce:
            self.notify(f"Session saved{f' to {path}' if path else ''}", timeout=3)

    def leave_conversation(self, then: Callable[[], Any]) -> None:
        """Run `then`, which replaces the conversation on screen; if it was not saved, once the user agrees."""
        if self.session is None or self._unsaved is None:
            self._unsaved = None  # what was not saved of another conversation is moot once this one goes
            then()
            return
        from dflash_tui.ui.sessions_screen import ConfirmScreen

        def answered(yes: Optional[bool]) -> None:
            if yes:
                self._unsaved = None
                then()

        question = (f"This conversation is not saved: {self._unsaved}.\n\nLeave it and it is lost. To keep it, "
                    "stay and /export it to a place that can be written, or free some room and /save.")
        self.push_screen(ConfirmScreen(question, yes="Leave it (y)", no="Stay (n)"), answered)
