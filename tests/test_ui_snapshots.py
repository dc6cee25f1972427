"""What a person sees: the whole app fed from a fixed recorded trace, at 80x24 and 160x48."""

from __future__ import annotations

import pytest

from ui_support import feed_trace, install_placeholders, load_trace

install_placeholders()

from dflash_tui.ui.app import DFlashApp  # noqa: E402


def _app() -> DFlashApp:
    return DFlashApp(start_engine=False)


async def _no_blink(pilot) -> None:
    pilot.app.prompt.cursor_blink = False  # a blinking cursor makes the picture depend on timing


async def _play(pilot) -> None:
    await _no_blink(pilot)
    await feed_trace(pilot.app, pilot, load_trace())
    pilot.app.prompt.focus()
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_chat_after_a_recorded_turn(snap_compare, size):
    assert snap_compare(_app(), terminal_size=size, run_before=_play)


def test_help_screen(snap_compare):
    assert snap_compare(_app(), terminal_size=(100, 36), press=["f1"], run_before=_no_blink)
