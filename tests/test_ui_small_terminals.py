"""Too few rows for the side panes and a conversation both: the conversation keeps the screen (at 40×12
it got no row at all, the panes all of them); from 18 rows the panes are back."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from dflash_tui.ui.app import DFlashApp  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("size", [(40, 12), (80, 17), (30, 8)])
async def test_a_short_narrow_terminal_shows_the_conversation_not_the_panes(size):
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert app.chat.region.height >= size[1] // 2, app.chat.region
        assert app.query_one("#side").region.height == 0
        assert app.prompt.region.height >= 1


async def test_from_18_rows_the_panes_are_back_under_the_conversation():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(80, 18)) as pilot:
        await pilot.pause()
        assert app.query_one("#side").region.height > 0 and app.chat.region.height >= 4
