"""Reading the terminal: a bracketed paste arrives as one paste, whatever bytes it holds.

A terminal in bracketed-paste mode wraps pasted text in ESC[200~ … ESC[201~. Textual's
XTermParser (8.x) starts an escape sequence at every ESC, inside a paste too, so pasted text
holding an ESC (coloured output: ESC[31m) is split: the characters after that ESC, up to the
next ESC or 32 characters, come out as key presses (a pasted line break among them is Enter,
which sends half the message), and the rest as a paste, after those keys.

`PasteKeepingParser` leaves everything outside a paste to Textual's parser. When that parser
has read a paste's start marker, this one reads the paste itself, character by character up
to the end marker, and gives it as one `Paste` event; then it hands the end marker to Textual's
parser so that its own paste state ends too (the empty paste it reports for it is dropped).
The driver is given this parser by `read_pastes_whole`, once, when the app is made.
"""

from __future__ import annotations

import sys
from typing import Generator

from textual import events
from textual._parser import ParseEOF, ParseTimeout, Peek1, Read1, TokenCallback
from textual._xterm_parser import BRACKETED_PASTE_END, BRACKETED_PASTE_START, XTermParser
from textual.message import Message


class PasteKeepingParser(XTermParser):
    """Textual's terminal parser, except that a bracketed paste is read whole, ESC bytes and all."""

    def parse(self, token_callback: TokenCallback) -> Generator[Read1 | Peek1, str, None]:
        leaving_paste = False

        def from_textual(token: Message) -> None:
            if leaving_paste and isinstance(token, events.Paste):
                return  # the empty paste Textual's parser reports for the end marker it was handed
            token_callback(token)

        textual_parse = super().parse(from_textual)
        request = next(textual_parse)
        # what Textual's parser read since its last escape timeout: a timeout ends any sequence it was in
        recent = ""
        try:
            while True:
                try:
                    character = yield request
                except ParseTimeout:
                    recent = ""
                    request = textual_parse.throw(ParseTimeout())
                    continue
                request = textual_parse.send(character)
                recent = (recent + character)[-len(BRACKETED_PASTE_START):]
                if recent != BRACKETED_PASTE_START:
                    continue
                text = yield from self._read_paste()
                token_callback(events.Paste(text.replace("\x00", "")))  # NUL dropped, as Textual does
                leaving_paste = True
                for character in BRACKETED_PASTE_END:
                    request = textual_parse.send(character)
                leaving_paste = False
                recent = ""
        except ParseEOF:
            try:
                textual_parse.throw(ParseEOF())
            except (StopIteration, ParseEOF):
                pass
        except StopIteration:
            return

    def _read_paste(self) -> Generator[Read1, str, str]:
        """The paste's text: every character up to the end marker (no timeout: a paste may come in pieces)."""
        end = BRACKETED_PASTE_END
        characters: list[str] = []
        while True:
            character = yield self.read1()
            characters.append(character)
            if character == end[-1] and "".join(characters[-len(end):]) == end:
                return "".join(characters[:-len(end)])


def read_pastes_whole(driver_class: type) -> None:
    """The driver `driver_class` reads the terminal with PasteKeepingParser (it names its parser class
    in its own module). A driver that reads no terminal (the headless one of tests) is left as it is."""
    module = sys.modules.get(driver_class.__module__)
    if module is not None and getattr(module, "XTermParser", None) is XTermParser:
        module.XTermParser = PasteKeepingParser  # type: ignore[attr-defined]
