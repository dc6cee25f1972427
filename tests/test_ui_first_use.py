"""What a first-time user meets, on the real app: F1 says how to focus a message and Tab reaches the latest one
first, the palette offers the slash commands with values (and Stop only while a reply streams), and a message of
only blanks is cleared, never sent."""

from __future__ import annotations

import pytest
from textual.command import CommandList, CommandPalette
from textual.widgets import Markdown

from ui_support import install_placeholders

install_placeholders()

from dflash_tui.ui.app import DFlashApp  # noqa: E402
from dflash_tui.ui.commands import HelpScreen  # noqa: E402
from test_ui_app import wait_for  # noqa: E402

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


async def _conversation(pilot, app) -> list:
    for i in range(3):
        app.chat.add_user(f"question {i}")
        app.chat.add_assistant(f"answer {i}")
    await pilot.pause()
    return app.chat.messages()


async def test_f1_says_how_to_focus_a_message_and_tab_goes_to_the_latest_first():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        blocks = await _conversation(pilot, app)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help")
        shown = app.screen.query_one(Markdown).source
        assert "`tab · shift+tab · a click` — focus a message" in shown
        assert shown.index("focus a message") < shown.index("on a focused message: copy it")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), 5, "the help to close")

        app.prompt.focus()
        await pilot.pause()
        await pilot.press("tab")
        assert app.focused is blocks[-1]  # the last reply, the one to copy
        await pilot.press("tab")
        assert app.focused is blocks[-2]  # the question before it, the one to edit
        await pilot.press("shift+tab")
        assert app.focused is blocks[-1]
        await pilot.press("shift+tab")
        assert app.focused is app.prompt


async def _palette_titles(pilot, app, query: str) -> list[str]:
    await pilot.press("ctrl+p")
    await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), 5, "the palette")
    await pilot.press(*query)
    listing = app.screen.query_one(CommandList)
    await wait_for(pilot, lambda: listing.option_count > 0, 5, f"hits for {query!r}")
    await pilot.pause(0.3)  # every provider has answered
    titles = [str(listing.get_option_at_index(i).prompt) for i in range(listing.option_count)]
    return titles


async def test_the_palette_has_the_block_size_and_stop_only_while_a_reply_streams():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        titles = await _palette_titles(pilot, app, "block")
        assert any(t.startswith("Block size: auto") for t in titles)
        assert any(t.startswith("Set block size…") for t in titles)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), 5, "the palette to close")

        titles = await _palette_titles(pilot, app, "stop")
        assert not any(t.startswith("Stop generation") for t in titles)  # nothing streams
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), 5, "the palette to close")
        app.generating = True  # as while a reply streams
        titles = await _palette_titles(pilot, app, "stop")
        assert any(t.startswith("Stop generation") for t in titles)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), 5, "the palette to close")
        app.generating = False

        # an entry that needs a value puts the command in the prompt for the user to finish
        titles = await _palette_titles(pilot, app, "set block")
        assert titles[0].startswith("Set block size…")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.prompt.value == "/block ", 5, "/block in the prompt")
        assert app.focused is app.prompt


async def test_a_message_of_only_blanks_is_cleared_and_not_sent():
    app = DFlashApp(start_engine=False)
    sent: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        app.model_state = "ready"  # no engine here: the turn it would start is recorded instead
        app.start_turn = sent.append  # type: ignore[method-assign]
        app.prompt.focus()
        await pilot.press("space", "space", "space", "enter")
        await pilot.pause()
        assert app.prompt.value == "" and sent == []
        await pilot.press("h", "i", "enter")
        await pilot.pause()
        assert sent == ["hi"]
