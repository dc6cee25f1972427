"""Pilot tests on the real engine with the tiny pair: a system prompt set mid-conversation is saved
where it was set and restored on reopening, ctrl+q during a reply saves the reply before quitting, and
typing or pasting while the conversation has focus goes to the prompt."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.sessions import SessionStore  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, SystemPromptMessage, UserMessage  # noqa: E402

pytestmark = pytest.mark.anyio


def saved(app):
    return SessionStore().load(app.session.id)


def roles(session) -> list[tuple[str, str]]:
    return [(m.role, m.content if m.role == "system" else "") for m in session.messages]


async def test_a_system_prompt_set_mid_conversation_is_saved_and_restored(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        await send(pilot, app, "/system be terse")
        await send(pilot, app, "second question")
        await finish_turn(pilot, app)
        on_disk = saved(app)
        assert roles(on_disk) == [("user", ""), ("assistant", ""), ("system", "be terse"), ("user", ""), ("assistant", "")]
        assert on_disk.conversation()[0] == {"role": "system", "content": "be terse"}
        assert app.engine.conversation.messages == on_disk.conversation()  # what the engine ran on
        app.system_prompt = ""
        await app.open_session(on_disk)  # reopened: the prompt is in effect again
        await wait_for(pilot, lambda: app.system_prompt == "be terse", what="the system prompt to be restored")

        # cleared, then the last reply regenerated: the new reply sits beside the old one and the
        # prompt it was written under (none) follows it
        await send(pilot, app, "/system")
        await finish_turn(pilot, app)
        before = len(app.session.tree.nodes)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.session.tree.nodes) > before and not app.generating,
                       what="the regenerated reply to be recorded")
        on_disk = saved(app)
        assert roles(on_disk)[-3:] == [("user", ""), ("assistant", ""), ("system", "")]
        assert on_disk.siblings(on_disk.messages[-2].id) == (2, 2)
        assert on_disk.system_prompt() == ""
        assert app.engine.conversation.messages == on_disk.conversation()
        session_id = app.session.id

    # a fresh app reopens it: both prompts shown where they were set, the last one (cleared) in effect
    app = make_app(qwen3_dirs, probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.system_prompt = "from the config"
        session = SessionStore().load(session_id)
        await app.open_session(session)
        await wait_for(pilot, lambda: app.engine.conversation.messages == session.conversation(),
                       what="the engine to take the branch")
        assert app.system_prompt == ""
        assert [b.raw_text for b in app.chat.query(SystemPromptMessage)] == ["be terse", ""]


async def test_ctrl_q_during_a_reply_saves_it_before_quitting(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4000  # longer than the test waits: the reply is still streaming at ctrl+q
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "a long story please")
        await wait_for(pilot, lambda: app.generating and app._recorder is not None and len(app._recorder.trace) > 2,
                       what="the reply to stream")
        await pilot.press("ctrl+q")
        assert app.is_running or app.session is not None
        await wait_for(pilot, lambda: app.session is not None, what="the stopped reply to be recorded")
    on_disk = saved(app)
    assert [m.role for m in on_disk.messages] == ["user", "assistant"]
    assert on_disk.messages[0].content == "a long story please"
    done = on_disk.messages[1].done()
    assert done is not None and done.finish_reason == "cancelled" and done.tokens


async def test_typing_or_pasting_on_the_conversation_goes_to_the_prompt(qwen3_dirs):
    from textual import events

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        app.chat.query(AssistantMessage).last().focus()
        await pilot.pause(0.2)
        await pilot.press("h", "i")
        assert app.focused is app.prompt and app.prompt.text == "hi"

        reply = app.chat.query(AssistantMessage).last()
        reply.focus()
        reply.post_message(events.Paste("\x1b[31m pasted"))
        await wait_for(pilot, lambda: "pasted" in app.prompt.text, what="the paste to reach the prompt")
        assert app.focused is app.prompt and "\x1b" not in app.prompt.text  # the prompt's own paste rules ran

        # a key a focused message binds stays the message's: e edits it, nothing is typed
        await pilot.pause(0.2)
        app.prompt.value = ""
        app.chat.query(UserMessage).last().focus()
        await pilot.pause(0.2)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.prompt.text == "first question", what="the edit to load the message")

        app.chat.query(AssistantMessage).last().focus()
        await pilot.pause(0.2)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.focused is app.prompt


async def test_keys_typed_in_one_burst_on_a_focused_message_are_all_text(qwen3_dirs):
    """A terminal delivers a fast typist's keys (or tmux send-keys) in one read: the first one sends the
    focus to the prompt, and the ones after it, bound on the message or not, are text, never an edit,
    a copy or a delete."""
    from textual import events

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        app.prompt.value = ""
        app.chat.query(UserMessage).last().focus()
        await pilot.pause(0.2)
        for char in "the code dy":
            app.post_message(events.Key("space" if char == " " else char, char))
        await wait_for(pilot, lambda: app.prompt.text == "the code dy", 5, "the burst in the prompt")
        assert app.focused is app.prompt and len(app.screen_stack) == 1  # no delete question, no edit
        assert len(app.session.tree.nodes) == 2 and not app.prompt.has_class("-editing")


async def test_with_a_message_focused_the_footer_still_shows_f1_help(qwen3_dirs):
    from textual.widgets._footer import FooterKey

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 3
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        before = len(app.session.tree.nodes)
        await pilot.press("ctrl+r")  # a second version: the reply's keys add ‹ Prev and Next ›
        await wait_for(pilot, lambda: len(app.session.tree.nodes) > before and not app.generating,
                       what="the regenerated reply")
        await pilot.pause(0.2)
        for block in (app.chat.query(UserMessage).last(), app.chat.query(AssistantMessage).last()):
            block.focus()
            await pilot.pause(0.2)
            keys = {k.key: k for k in app.screen.query(FooterKey)}
            assert "f1" in keys and keys["f1"].region.right <= app.screen.size.width, sorted(keys)
