"""Sending a message brings the conversation back to the bottom, following the new reply, wherever the
user had scrolled or focused (Tab to an earlier message scrolls up to it)."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.ui.chat_view import UserMessage  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_a_sent_message_is_followed_after_focusing_an_earlier_one(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 24
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        chat = app.chat
        for text in ("first question", "second question", "third question"):
            await send(pilot, app, text)
            await finish_turn(pilot, app)
        await wait_for(pilot, lambda: chat.max_scroll_y > 5, what="a conversation taller than the pane")
        chat.query(UserMessage).first().focus()  # as Tab does: the view scrolls up to it
        await pilot.pause(0.2)
        assert chat.scroll_y < chat.max_scroll_y
        await send(pilot, app, "fourth question")
        await finish_turn(pilot, app)
        await pilot.pause(0.2)
        assert chat.scroll_y == chat.max_scroll_y, (chat.scroll_y, chat.max_scroll_y)  # the new reply in view


async def test_a_burst_typed_on_a_focused_message_is_sent_whole_by_its_enter(qwen3_dirs):
    """Keys typed fast on the conversation all reach the prompt, the Enter among them too (it arrived
    before the focus did, and was lost: '/max-tokens 7' stayed in the prompt)."""
    from textual import events

    from dflash_tui.ui.chat_view import AssistantMessage

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 3
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        reply = app.chat.query(AssistantMessage).last()
        reply.focus()
        await pilot.pause(0.2)
        for ch in "/max-tokens 7":  # as a terminal's burst: all queued before the first is handled
            app.post_message(events.Key("space" if ch == " " else ch, ch))
        app.post_message(events.Key("enter", "\r"))
        await wait_for(pilot, lambda: app.options.max_tokens == 7, what="the command to be sent")
        assert app.prompt.text == ""
