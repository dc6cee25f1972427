"""Pilot test on the real app and the tiny pair: sessions opened back to back, without waiting for one to
be on screen before the next, leave the last one shown whole and raise nothing."""

from __future__ import annotations

import copy

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.sessions import SessionStore  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, MessageBlock, Note  # noqa: E402

pytestmark = pytest.mark.anyio


def _notes(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query(Note)]


async def test_sessions_opened_back_to_back_leave_the_last_one_whole(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "/system be terse")
        await send(pilot, app, "Wait until a predicate becomes true.")
        await finish_turn(pilot, app)
        saved = SessionStore().load(app.session.id)
        sessions = []
        for title in ("First of three", "Second of three", "Third of three"):
            session = copy.deepcopy(saved)
            session.title = title
            sessions.append(session)
        for session in sessions:  # no wait between them: each clears what the one before is still mounting
            await app.open_session(session)
        last = sessions[-1]
        await wait_for(pilot, lambda: app.engine.conversation.messages == last.conversation(), 30,
                       "the engine to take the last session")
        await pilot.pause()
        assert [n for n in _notes(app) if n.startswith("Opened session")] == ["Opened session “Third of three”."]
        shown = [(b.ROLE, b.message_id) for b in app.chat.query(MessageBlock)]
        assert shown == [({"user": "you"}.get(m.role, m.role), m.id) for m in last.messages], shown
        (reply,) = app.chat.query(AssistantMessage)
        assert reply.raw_text == last.messages[-1].content
        assert reply.query_one(".message-footer").display == bool(reply._footer)



async def test_sessions_chosen_back_to_back_on_the_sessions_screen_leave_the_last_one_whole(qwen3_dirs):
    """The sessions screen's answers, three in a row: each open is queued (call_later) behind the one before,
    and the clear that waits for the messages still mounting does not hold that queue up for good."""
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "Wait until a predicate becomes true.")
        await finish_turn(pilot, app)
        saved = SessionStore().load(app.session.id)
        sessions = []
        for title in ("One", "Two", "Three"):
            session = copy.deepcopy(saved)
            session.title = title
            sessions.append(session)
        for session in sessions:
            app._session_chosen(("open", session))  # what SessionsScreen's Enter hands back
        last = sessions[-1]
        await wait_for(pilot, lambda: "Opened session “Three”." in _notes(app), 30, "the last note")
        await wait_for(pilot, lambda: app.engine.conversation.messages == last.conversation(), 30,
                       "the engine to take the last session")
        await pilot.pause()
        assert [n for n in _notes(app) if n.startswith("Opened session")] == ["Opened session “Three”."]
        shown = [(b.ROLE, b.message_id) for b in app.chat.query(MessageBlock)]
        assert shown == [({"user": "you"}.get(m.role, m.role), m.id) for m in last.messages], shown
        assert app.session is last
