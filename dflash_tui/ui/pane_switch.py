"""Too few columns for the acceptance pane beside the meter (under 64): one of them has the side row, and a
key switches it between the two.

The pane shows first. What the user last chose stays through resizes: going wide shows both again, going
narrow again shows the one they chose. The visible one's border title names the other and the key.
"""

from __future__ import annotations

from textual.widget import Widget

from dflash_tui.ui.acceptance_layout import SIDE_BY_SIDE_MIN
from dflash_tui.ui.keys import SWITCH_PANE_KEY as SWITCH_KEY

SLIM = "-slim"  # under SIDE_BY_SIDE_MIN columns: one pane in the side row (app.tcss, the replay's CSS)
METER_CHOSEN = "-slim-meter"  # the meter is the one: kept on the screen while it is wide too
HIDING = ("-chat-only", "-tiny")  # the side row is not shown at all (app.tcss)
ACCEPTANCE_TITLE = "acceptance"


def pane_titles(slim: bool, meter_title: str) -> tuple[str, str]:
    """The acceptance pane's and the meter's border titles; where only one shows, each names the other and
    the key that brings it."""
    if not slim:
        return ACCEPTANCE_TITLE, meter_title
    return f"{ACCEPTANCE_TITLE} · {SWITCH_KEY} system", f"{meter_title} · {SWITCH_KEY} {ACCEPTANCE_TITLE}"


class PaneSwitching:
    """The chat app's and the replay screen's part: `fit_panes` on each resize, `action_switch_pane` for the
    key. Each gives the screen the classes go on, its acceptance pane, its meter and the meter's title."""

    meter_title = "system"

    @property
    def pane_screen(self) -> Widget:
        raise NotImplementedError

    @property
    def acceptance(self) -> Widget:
        raise NotImplementedError

    @property
    def meter(self) -> Widget:
        raise NotImplementedError

    def fit_panes(self, width: int) -> None:
        """Lay the side panes out for a screen `width` columns wide, their titles with them."""
        slim = width < SIDE_BY_SIDE_MIN
        self.pane_screen.set_class(slim, SLIM)
        self.acceptance.border_title, self.meter.border_title = pane_titles(slim, self.meter_title)
        self.refresh_bindings()  # the key is live only while slim

    def can_switch_pane(self) -> bool:
        """Only where one pane has the row: wide, both show and the key does nothing (nor is it offered); nor
        where the side row is hidden (f2, or too few rows)."""
        screen = self.pane_screen
        return screen.has_class(SLIM) and not any(screen.has_class(c) for c in HIDING)

    def action_switch_pane(self) -> None:
        if self.can_switch_pane():
            self.pane_screen.toggle_class(METER_CHOSEN)
