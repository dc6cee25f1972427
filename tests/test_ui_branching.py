"""Pilot tests of editing and branching on the real engine with the tiny pair: edit forks, `[` / `]`
switch versions, a pair is deleted, and a replay follows the branch in view."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.engine.events import Block  # noqa: E402
from dflash_tui.sessions import SessionStore  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, MessageHeader, UserMessage  # noqa: E402
from dflash_tui.ui.keys import help_rows  # noqa: E402

pytestmark = pytest.mark.anyio


def users(app) -> list[str]:
    return [u.raw_text for u in app.chat.query(UserMessage)]


def header(block) -> str:
    return str(block.query_one(MessageHeader).render())


def trace_blocks(message) -> list[Block]:
    return [e for e in message.events() if isinstance(e, Block)]


def in_sync(app) -> bool:
    """The engine's conversation is the session's branch in view."""
    return app.engine.conversation.messages == app.session.conversation()


async def two_turns(pilot, app) -> None:
    await ready(pilot, app)
    await send(pilot, app, "first question")
    await finish_turn(pilot, app)
    await send(pilot, app, "second question")
    await finish_turn(pilot, app)


async def test_edit_forks_brackets_switch_branches_and_the_replay_follows_the_branch(qwen3_dirs):
    from dflash_tui.ui.replay_screen import ReplayScreen
    from dflash_tui.ui.sessions_screen import SessionsScreen

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 5
    async with app.run_test(size=SIZE) as pilot:
        await two_turns(pilot, app)
        old = list(app.session.messages)
        first = app.chat.query(UserMessage).first()
        assert first.message_id == old[0].id and first.versions == (1, 1)

        # e loads the message into the prompt; Esc puts back what was being typed
        app.prompt.value = "half-typed"
        first.focus()
        await pilot.press("e")
        assert app.prompt.editing == old[0].id and app.prompt.value == "first question"
        assert "editing message 1" in str(app.prompt.border_title) and app.focused is app.prompt
        await pilot.press("escape")
        assert app.prompt.editing is None and app.prompt.value == "half-typed"
        assert not app.generating and app.session.messages == old

        # e again, change the text, Enter: a fork there, with its own reply
        first.focus()
        await pilot.press("e")
        app.prompt.value = "first question, edited"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.session.tree.nodes) == 6, 60, "the fork to be recorded")
        await finish_turn(pilot, app)
        assert users(app) == ["first question, edited"] and len(app.chat.query(AssistantMessage)) == 1
        edited, reply = app.session.messages
        assert edited.content == "first question, edited" and app.session.siblings(edited.id) == (2, 2)
        assert app.prompt.editing is None and app.prompt.value == ""
        shown = app.chat.block_for(edited.id)
        assert shown is not None and "‹ 2/2 ›" in header(shown)
        assert in_sync(app)
        assert list(app.acceptance.rows.rows) == trace_blocks(reply)
        saved = SessionStore().load(app.session.id)
        assert len(saved.tree.nodes) == 6 and [m.id for m in saved.messages] == [edited.id, reply.id]

        # [ on the edited message: the old branch, whole, in the chat, the engine and the file
        shown.focus()
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: users(app) == ["first question", "second question"], 5, "the old branch")
        assert [m.id for m in app.session.messages] == [m.id for m in old]
        assert in_sync(app)
        await wait_for(pilot, lambda: getattr(app.focused, "message_id", None) == old[0].id, 5, "focus kept")
        assert app.focused.versions == (1, 2) and "‹ 1/2 ›" in header(app.focused)
        assert list(app.acceptance.rows.rows) == trace_blocks(old[1])  # the reply under the message
        assert [m.id for m in SessionStore().load(app.session.id).messages] == [m.id for m in old]
        await pilot.press("left_square_bracket")  # past the first version: nothing changes
        await pilot.pause()
        assert any("first version" in n.message for n in app._notifications)
        assert users(app) == ["first question", "second question"]

        # ] back to the edited branch
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: users(app) == ["first question, edited"], 5, "the edited branch")
        assert in_sync(app)
        assert list(app.acceptance.rows.rows) == trace_blocks(reply)

        # a replay of the saved session plays the branch in view
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), 5, "the sessions screen")
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen), 5, "the replay")
        replay = app.screen
        await pilot.press("i")
        await wait_for(pilot, lambda: replay.player.finished, 10, "the replay to end")
        await pilot.pause(0.2)
        assert [u.raw_text for u in replay.chat.query(UserMessage)] == ["first question, edited"]
        assert replay.chat.last_assistant().raw_text == reply.content
        assert list(replay.acceptance.rows.rows) == trace_blocks(reply)
        assert all(b.message_id is None for b in replay.chat.messages())  # no branch keys in a replay


async def test_regenerated_replies_are_versions_of_one_reply(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 5
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hi")
        await finish_turn(pilot, app)
        first_reply = app.session.messages[-1]
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.session.messages[-1].id != first_reply.id, 60, "the new reply")
        await finish_turn(pilot, app)
        second_reply = app.session.messages[-1]
        block = app.chat.last_assistant()
        assert block.message_id == second_reply.id and "‹ 2/2 ›" in header(block)
        block.focus()
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: getattr(app.focused, "message_id", None) == first_reply.id, 5,
                       "the first reply in view")
        assert len(app.chat.query(AssistantMessage)) == 1 and "‹ 1/2 ›" in header(app.focused)
        assert [m.id for m in app.session.messages][-1] == first_reply.id and in_sync(app)
        assert list(app.acceptance.rows.rows) == trace_blocks(first_reply)


async def test_delete_a_pair_asks_first_and_the_turns_after_move_up(qwen3_dirs):
    from dflash_tui.ui.sessions_screen import ConfirmScreen

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await two_turns(pilot, app)
        before = list(app.session.messages)
        app.chat.query(AssistantMessage).first().focus()  # either message of the pair
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the question")
        assert app.screen.question.startswith("Delete this reply and the message it answers?")  # what goes
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 5, "the answer")
        assert app.session.messages == before and users(app) == ["first question", "second question"]

        app.chat.query(UserMessage).first().focus()
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the question")
        assert app.screen.question.startswith("Delete this message and its reply?")
        await pilot.press("y")
        await wait_for(pilot, lambda: users(app) == ["second question"], 5, "the pair to go")
        assert [m.id for m in app.session.messages] == [m.id for m in before[2:]]
        assert in_sync(app)
        assert [m.id for m in SessionStore().load(app.session.id).messages] == [m.id for m in before[2:]]
        # the conversation goes on from there
        await send(pilot, app, "third")
        await finish_turn(pilot, app)
        assert users(app) == ["second question", "third"]
        assert [m.role for m in SessionStore().load(app.session.id).messages] == ["user", "assistant"] * 2


async def test_a_failed_edit_is_not_kept(qwen3_dirs, monkeypatch):
    from dflash_tui.engine import conversation as conversation_mod

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await two_turns(pilot, app)
        before = list(app.session.messages)

        def fail(self, *args, **kwargs):
            raise RuntimeError("out of memory")
            yield  # a generator, like the real one

        monkeypatch.setattr(conversation_mod.Conversation, "generate", fail)
        app.chat.query(UserMessage).first().focus()
        await pilot.press("e")
        app.prompt.value = "edited"
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("failed" in str(n.render()) for n in app.chat.query("Note")), 30,
                       "the failure")
        await wait_for(pilot, lambda: users(app) == ["first question", "second question"], 5, "the branch back")
        assert app.session.messages == before and len(app.session.tree.nodes) == 4
        assert in_sync(app)
        assert any("edit was not kept" in str(n.render()) for n in app.chat.query("Note"))


async def test_the_palette_switches_versions_and_f1_lists_the_branch_keys(qwen3_dirs):
    from textual.command import CommandPalette

    keys = dict(help_rows())
    assert {"e", "[", "]", "d / delete"} <= set(keys) and "fork" in keys["e"]
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hi")
        await finish_turn(pilot, app)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.session.siblings(app.session.messages[-1].id) == (2, 2), 60, "2 replies")
        await finish_turn(pilot, app)
        app.prompt.focus()  # no message focused: the palette acts on the last one with versions
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), 5, "the palette")
        await pilot.press(*"previous sibling")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.siblings(app.session.messages[-1].id) == (1, 2), 5,
                       "the first reply in view")
        await wait_for(pilot, lambda: "‹ 1/2 ›" in header(app.chat.last_assistant()), 5, "its header")


async def test_a_slash_command_typed_while_editing_runs_and_the_edit_stays(qwen3_dirs):
    from dflash_tui.ui.commands import help_markdown

    assert "also while you edit a message" in help_markdown(help_rows())
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await two_turns(pilot, app)
        before = list(app.session.messages)
        nodes = len(app.session.tree.nodes)
        app.chat.query(UserMessage).first().focus()
        await pilot.press("e")
        assert app.prompt.editing == before[0].id

        # a setting: it is set, nothing forks, the message's text is back in the prompt, still editing
        app.prompt.value = "/max-tokens 3"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.options.max_tokens == 3, 5, "the command to run")
        await pilot.pause(0.3)
        assert not app.generating and len(app.session.tree.nodes) == nodes and app.session.messages == before
        assert app.prompt.editing == before[0].id and app.prompt.value == "first question"
        assert "editing message 1" in str(app.prompt.border_title)
        assert users(app) == ["first question", "second question"]

        # '//' is a literal '/': that is an edit, and it forks with the setting just made
        app.prompt.value = "//etc is a folder"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.session.tree.nodes) == nodes + 2, 60, "the fork")
        await finish_turn(pilot, app)
        assert users(app) == ["/etc is a folder"] and app.prompt.editing is None
        assert len(app.session.messages[-1].done().tokens) <= 3
        session_id = app.session.id

        # /new while editing: the message is gone from view, so the edit ends (what was typed before comes back)
        app.prompt.value = "half-typed"
        app.chat.query(UserMessage).first().focus()
        await pilot.press("e")
        app.prompt.value = "/new"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session is None, 5, "the new conversation")
        await wait_for(pilot, lambda: app.prompt.editing is None, 5, "the edit to end")
        assert app.prompt.value == "half-typed" and users(app) == []
        assert len(SessionStore().load(session_id).tree.nodes) == nodes + 2  # the saved session is untouched
