"""A bracketed paste holding an ESC reaches the prompt whole: the terminal parser the app's driver uses,
the real app in a real terminal (a pty), and the prompt showing control characters as symbols."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from textual import events

from ui_support import install_placeholders

install_placeholders()

from dflash_tui.ui.app import DFlashApp  # noqa: E402
from dflash_tui.ui.chat_view import UserMessage  # noqa: E402
from dflash_tui.ui.paste_parser import PasteKeepingParser  # noqa: E402
from test_ui_app import wait_for  # noqa: E402

START, END = "\x1b[200~", "\x1b[201~"
# coloured terminal output, a line break as terminals paste it (CR), and text that looks like Rich markup
PASTED = "one \x1b[31mred\x1b[0m\rtwo [b]bold?[/b] \x1b]0;title\x07 [/]"
SHOWN = "one \u241b[31mred\u241b[0m\ntwo [b]bold?[/b] \u241b]0;title\u2407 [/]"  # what the prompt holds and sends


def parsed(chunks: list[str]) -> list[tuple[str, str]]:
    parser = PasteKeepingParser()
    out = [e for chunk in chunks for e in parser.feed(chunk)]
    return [("paste", e.text) if isinstance(e, events.Paste) else ("key", e.key) for e in out]


def test_a_paste_holding_escape_sequences_is_one_paste_event_in_any_chunking():
    data = "a" + START + PASTED + END + "z"
    want = [("key", "a"), ("paste", PASTED), ("key", "z")]
    assert parsed([data]) == want
    for cut in range(1, len(data)):  # the terminal's writes may split it anywhere, markers included
        assert parsed([data[:cut], data[cut:]]) == want, cut
    assert parsed(list(data)) == want


def test_pastes_that_end_in_an_escape_or_hold_long_sequences_stay_whole():
    long_sequence = "\x1b[" + "1;" * 40 + "m" + "after"  # past the parser's 32-character sequence search
    for text in ("\x1b", "x\x1b", "\x1b\x1b[", "\x1b[2", long_sequence, "", "\x00nul\x00"):
        assert parsed([START + text + END, "q"]) == [("paste", text.replace("\x00", "")), ("key", "q")], repr(text)
    # outside a paste, keys and escape sequences read as before
    assert parsed(["\x1b[A", "x\r"]) == [("key", "up"), ("key", "x"), ("key", "enter")]
    assert parsed([START + "p" + END + START + "\x1b[1mq" + END]) == [("paste", "p"), ("paste", "\x1b[1mq")]


def test_a_lone_escape_outside_a_paste_is_still_the_escape_key_after_its_delay():
    parser = PasteKeepingParser()
    assert list(parser.feed("\x1b")) == []
    time.sleep(0.25)  # past Textual's ESCDELAY (0.1 s)
    assert [e.key for e in parser.tick()] == ["escape"]
    assert [e.text for e in parser.feed(START + "\x1b[31m" + END) if isinstance(e, events.Paste)] == ["\x1b[31m"]


def test_the_app_reads_its_terminal_with_the_paste_keeping_parser():
    import textual.drivers.linux_driver as linux_driver

    app = DFlashApp(start_engine=False)
    if app.driver_class is not linux_driver.LinuxDriver:
        pytest.skip("this checks the Linux/macOS terminal driver")
    assert linux_driver.XTermParser is PasteKeepingParser


_CHILD = r"""
import sys
from pathlib import Path
from textual import on
from dflash_tui.ui.app import DFlashApp
from dflash_tui.ui.prompt import PromptBox

out = Path(sys.argv[1])

class Probe(DFlashApp):
    CSS_PATH = str(Path(sys.modules[DFlashApp.__module__].__file__).with_name("app.tcss"))

    def on_mount(self) -> None:
        super().on_mount()
        self.call_after_refresh(lambda: (out.parent / "ready").write_text("ready"))

    @on(PromptBox.Send)
    def record(self, event: PromptBox.Send) -> None:
        out.write_text(event.text, encoding="utf-8")
        self.exit()

Probe(start_engine=False).run()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a pty")
def test_in_a_real_terminal_a_paste_with_escapes_and_a_line_break_is_sent_whole(tmp_path):
    """The real app on a pty, its real driver: the paste, then Enter, sends exactly the paste (shown safely)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out = tmp_path / "sent.txt"
    env = dict(os.environ, TERM="xterm-256color", DFLASH_TUI_CONFIG_DIR=str(tmp_path / "config"),
               DFLASH_TUI_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(Path(__file__).parents[1]))
    script = tmp_path / "paste_probe.py"  # a file: Textual looks for an App class's source
    script.write_text(_CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(out)], stdin=slave, stdout=slave, stderr=slave,
                             env=env, start_new_session=True)
    os.close(slave)
    screen = bytearray()

    def drain() -> None:  # the app blocks if nobody reads what it draws
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert child.poll() is None, screen[-2000:].decode(errors="replace")
            assert time.monotonic() < deadline, "the app did not start"
            time.sleep(0.1)
        time.sleep(0.3)
        os.write(master, (START + PASTED + END).encode())
        time.sleep(0.5)
        os.write(master, b"\r")  # Enter
        child.wait(timeout=30)
        assert out.read_text(encoding="utf-8") == SHOWN
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(master)


@pytest.mark.anyio
async def test_a_paste_with_escapes_and_markup_lands_literally_in_the_prompt_and_the_chat():
    app = DFlashApp(start_engine=False)
    sent: list[str] = []
    async with app.run_test(size=(100, 30)) as pilot:
        app.model_state = "ready"  # no engine here: the turn it would start is recorded instead
        app.start_turn = sent.append  # type: ignore[method-assign]
        app.prompt.focus()
        await pilot.press("x", "space")
        app.post_message(events.Paste(PASTED + "\r\n\x0cthird\tline"))
        await wait_for(pilot, lambda: app.prompt.value.endswith("line"), 5, "the paste")
        assert app.prompt.value == "x " + SHOWN + "\n\u240cthird\tline"
        assert app.prompt.document.line_count == 3
        drawn = "".join(strip.text for strip in app.prompt.render_lines(app.prompt.region.reset_offset))
        assert "\x1b" not in drawn and "\x07" not in drawn and "[b]bold?[/b]" in drawn and "\u241b[31mred" in drawn
        await pilot.press("enter")
        await wait_for(pilot, lambda: sent, 5, "the message")
        assert sent == ["x " + SHOWN + "\n\u240cthird\tline"]
        app.chat.add_user(sent[0])
        await pilot.pause()
        body = str(app.chat.query(UserMessage).last().query_one(".message-body").render())
        assert "[b]bold?[/b]" in body and "[/]" in body and "\x1b" not in body
