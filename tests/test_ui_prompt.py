"""The prompt on the real app: several lines, pastes kept whole, history at the edges, $EDITOR, the keys."""

from __future__ import annotations

import contextlib
import stat
import sys
import time

import pytest
from textual import events

from ui_support import install_placeholders

install_placeholders()

from dflash_tui.ui.app import DFlashApp  # noqa: E402
from dflash_tui.ui.chat_view import UserMessage  # noqa: E402
from dflash_tui.ui.commands import help_markdown  # noqa: E402
from dflash_tui.ui.keys import RESERVED, help_rows  # noqa: E402
from dflash_tui.ui.model_picker import ModelPicker  # noqa: E402
from test_ui_app import finish_turn, make_app, ready, wait_for  # noqa: E402

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


def _notes(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_a_pasted_three_lines_reach_the_model_whole_and_show_inert(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    hostile = "one [b]two[/b]\n\x1b[2Jthree\n  four"
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.prompt.focus()
        app.post_message(events.Paste(hostile))  # as the terminal delivers a bracketed paste
        shown = hostile.replace("\x1b", "\u241b")  # every character kept; the ESC as its symbol, as it is sent
        await wait_for(pilot, lambda: app.prompt.value == shown, 5, "the paste")
        await pilot.press("enter")
        await finish_turn(pilot, app)
        assert app.engine.conversation.messages[0] == {"role": "user", "content": shown}
        (message,) = app.chat.query(UserMessage)
        body = str(message.query_one(".message-body").render())
        assert "[b]two[/b]" in body and "\x1b" not in body and "\u241b[2Jthree" in body
        assert app.prompt.value == ""


async def test_enter_sends_and_shift_alt_enter_and_ctrl_j_each_insert_a_line():
    app = DFlashApp(start_engine=False)
    sent: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        app.model_state = "ready"  # no engine here: the turn it would start is recorded instead
        app.start_turn = sent.append  # type: ignore[method-assign]
        app.prompt.focus()
        await pilot.press("a", "shift+enter", "b", "alt+enter", "c", "ctrl+j", "d")
        assert app.prompt.value == "a\nb\nc\nd"
        await pilot.pause()
        assert app.prompt.region.height == 4 + 2  # four lines and the border
        await pilot.press("enter")
        await wait_for(pilot, lambda: sent, 5, "the message")
        assert sent == ["a\nb\nc\nd"] and app.prompt.value == ""


async def test_the_prompt_grows_to_eight_lines_then_scrolls():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.value = "\n".join(f"line {i}" for i in range(3))
        await pilot.pause()
        assert app.prompt.region.height == 3 + 2
        app.prompt.value = "\n".join(f"line {i}" for i in range(30))
        await pilot.pause()
        assert app.prompt.region.height == 8 + 2
        assert app.prompt.scroll_y > 0  # the cursor's line (the last) in view
        assert app.chat.region.height >= 10


async def test_a_100_kb_paste_is_kept_whole_and_stays_responsive():
    app = DFlashApp(start_engine=False)
    text = "\n".join(f"{i:05d} " + "lorem ipsum dolor sit amet " * 3 for i in range(1200))
    assert len(text) > 100_000
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.focus()
        await pilot.pause()
        tic = time.perf_counter()
        app.post_message(events.Paste(text))
        await wait_for(pilot, lambda: len(app.prompt.value) == len(text), 20, "the paste")
        pasted = time.perf_counter() - tic
        tic = time.perf_counter()
        await pilot.press("x")
        typed = time.perf_counter() - tic
        assert app.prompt.value == text + "x"
        assert app.prompt.region.height == 8 + 2
        # generous bounds for a loaded 2-core host; on a laptop both are a small fraction of these
        assert pasted < 5.0 and typed < 1.0, (pasted, typed)


async def test_up_and_down_walk_the_history_only_from_the_first_and_last_line():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        for text in ("/temp 0.1", "/temp 0.2"):
            app.prompt.value = text
            await pilot.press("enter")
        app.prompt.value = "first\nsecond"  # the cursor ends on the second line
        await pilot.press("up")
        assert app.prompt.value == "first\nsecond" and app.prompt.cursor_location[0] == 0  # moved, no recall
        await pilot.press("up")
        assert app.prompt.value == "/temp 0.2"
        await pilot.press("up")
        assert app.prompt.value == "/temp 0.1"
        await pilot.press("down", "down")
        assert app.prompt.value == "first\nsecond"  # what was being typed comes back
        app.prompt.move_cursor((0, 0))
        await pilot.press("down")
        assert app.prompt.value == "first\nsecond" and app.prompt.cursor_location[0] == 1


async def test_a_slash_command_completes_with_right():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.focus()
        await pilot.press(*"/min")
        assert app.prompt.suggestion == "-p"
        await pilot.press("right")
        assert app.prompt.value == "/min-p"


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "editor.py"
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_ctrl_e_hands_the_prompt_to_the_editor_and_takes_its_text_back(tmp_path, monkeypatch):
    # a real editor process: it appends two lines to the file it is given (and the usual final newline)
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", _script(tmp_path, "p = sys.argv[1]\nt = open(p).read()\n"
                                                   "open(p, 'w').write(t + '\\nline two\\n[b]three[/b]\\n')"))
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        # the headless test terminal cannot be suspended; a real one hands the screen to the editor
        app.suspend = contextlib.nullcontext  # type: ignore[method-assign]
        app.prompt.value = "line one"
        app.prompt.focus()
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: "three" in app.prompt.value, 10, "the editor's text")
        assert app.prompt.value == "line one\nline two\n[b]three[/b]"

        monkeypatch.setenv("EDITOR", _script(tmp_path, "sys.exit(3)"))
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: any("exited with status 3" in n for n in _notes(app)), 10, "the failure")
        assert app.prompt.value == "line one\nline two\n[b]three[/b]"  # unchanged

        monkeypatch.setenv("EDITOR", str(tmp_path / "no-such-editor"))
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: any("could not run the editor" in n for n in _notes(app)), 10, "the failure")


async def test_without_a_terminal_to_hand_over_ctrl_e_says_so():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.value = "kept"
        app.prompt.focus()
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: any("cannot be handed to an editor" in n for n in _notes(app)), 5, "the note")
        assert app.prompt.value == "kept"


async def test_every_key_is_in_the_help_and_none_is_a_terminal_control_key():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        bound = set(app._bindings.key_to_bindings)
        helped = " ".join(key for key, _ in help_rows())
        assert bound and all(key in helped for key in bound), bound
        assert not bound & RESERVED
        text = help_markdown(help_rows())
        for key in ("shift+enter", "alt+enter", "ctrl+j", "ctrl+e", "f3", "ctrl+l is not used"):
            assert key in text
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), 5, "the model picker")
        await pilot.press("escape")
        await pilot.press("ctrl+l")  # clear-screen muscle memory opens nothing
        await pilot.pause()
        assert not isinstance(app.screen, ModelPicker)
        footer = app.screen.query_one("Footer")
        await pilot.pause()
        assert "Model" in " ".join(str(w.render()) for w in footer.query("FooterKey"))


def test_alt_enter_as_most_terminals_send_it_is_a_new_line_not_send():
    from textual._xterm_parser import XTermParser

    DFlashApp(start_engine=False)  # the app sets the reading up
    # ESC CR: alt+enter without the kitty keyboard protocol (xterm, tmux, most others); CR alone is Enter
    keys = [e.key for e in XTermParser(debug=False).feed("a\x1b\rb\r")]
    assert keys == ["a", "ctrl+j", "b", "enter"]


async def test_up_down_and_typing_that_arrive_together_are_handled_in_order():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.focus()
        app.prompt.value = "alpha\nbeta\ngamma"
        await pilot.pause()
        # as a terminal delivers them in one read (a fast typist, a key repeat, tmux send-keys)
        for key, char in (("up", None), ("up", None), ("Z", "Z"), ("down", None), ("down", None), ("Q", "Q")):
            app.post_message(events.Key(key, char))
        await wait_for(pilot, lambda: "Q" in app.prompt.value, 5, "the keys")
        assert app.prompt.value == "alphaZ\nbeta\ngammaQ"


async def test_ctrl_c_in_the_prompt_says_how_to_quit_in_plain_words():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.focus()
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: app._notifications, 5, "the hint")
        (hint,) = [n.message for n in app._notifications]
        assert hint == "Press ctrl+q to quit the app" and app.is_running
