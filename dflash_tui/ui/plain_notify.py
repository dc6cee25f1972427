"""Notifications that show their text as it is.

Toasts carry file names, session titles, model names and error text: parsed
as markup, a `[/]` in any of them raises MarkupError and ends the app; raw,
an ESC in them reaches the terminal. Mixed into the apps and screens here,
every `notify` shows plain, neutralised text.
"""

from __future__ import annotations

from typing import Any, Optional

from dflash_tui.printable import one_line, printable


class PlainNotify:
    """Mix in before App or Screen: `notify` never parses markup (none of ours uses any)."""

    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: Optional[float] = None, markup: bool = False) -> None:
        extra = {} if timeout is None else {"timeout": timeout}
        return super().notify(printable(str(message)), title=one_line(str(title)),  # type: ignore[misc]
                              severity=severity, markup=False, **extra)

    def action_help_quit(self) -> None:
        """ctrl+c where nothing copies: Textual's own hint is markup, which `notify` here would show raw."""
        for key, active in getattr(self, "active_bindings", {}).items():
            if active.binding.action in ("quit", "app.quit"):
                self.notify(f"Press {key} to quit the app", title="Do you want to quit?")
                return
