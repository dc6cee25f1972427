"""Pilot tests on the real app and the tiny pair: the copy toast names what was copied in plain words,
and reopening a session whose title ends in its own full stop (or ! ?) does not add a second one."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.sessions import SessionStore  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, Note, SystemPromptMessage, UserMessage  # noqa: E402

pytestmark = pytest.mark.anyio


def _notes(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query(Note)]


async def _copy(pilot, app, block) -> str:
    before = len(app._notifications)
    block.focus()
    await pilot.pause()
    await pilot.press("c")
    await wait_for(pilot, lambda: len(app._notifications) > before, 5, "the copy toast")
    return list(app._notifications)[-1].message


async def test_the_copy_toast_says_what_was_copied_and_a_reopened_title_keeps_one_full_stop(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "/system be terse")
        await send(pilot, app, "Wait until a predicate becomes true.")
        await finish_turn(pilot, app)
        (you,), (reply,) = app.chat.query(UserMessage), app.chat.query(AssistantMessage)
        (system,) = app.chat.query(SystemPromptMessage)
        toasts = [await _copy(pilot, app, block) for block in (you, reply, system)]
        assert toasts[0].startswith("Your message (36 characters) went to the terminal's clipboard"), toasts
        assert toasts[1].startswith(f"The reply ({len(reply.raw_text)} characters) went to"), toasts
        assert toasts[2].startswith("The system prompt (8 characters) went to"), toasts
        assert not any("you message" in t or "assistant message" in t for t in toasts)
        assert you.has_class("-you") and reply.has_class("-assistant")  # the role's class, unchanged

        store = SessionStore()
        session = store.load(app.session.id)
        assert session.title == "Wait until a predicate becomes true."
        for title, note in ((session.title, "Opened session “Wait until a predicate becomes true.”"),
                            ("Is it true?", "Opened session “Is it true?”"),
                            ("A plain title", "Opened session “A plain title”.")):
            session.title = title
            await app.open_session(session)
            await wait_for(pilot, lambda: note in _notes(app), 30, f"the note {note!r}")
            await wait_for(pilot, lambda: app.engine.conversation.messages == session.conversation(), 30,
                           "the engine to take the branch")
            await pilot.pause()
            assert [n for n in _notes(app) if n.startswith("Opened session")][-1] == note, _notes(app)
