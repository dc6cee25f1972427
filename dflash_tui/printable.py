"""Data made safe to print or show: no control character from a file or a model reaches the terminal.

Session titles, messages, model names, token texts and file names are data; an
ESC or a C1 control in them could set the window title, write the clipboard
(OSC 52) or clear the screen. Everything that prints or shows data passes it
through `printable`; the data itself is never changed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text


def _table(keep: str) -> dict[int, str]:
    table = {c: chr(0x2400 + c) for c in range(0x20)}  # C0 as their Unicode pictures (ESC -> ␛)
    table[0x7F] = "\u2421"  # DEL -> ␡
    table.update({c: "\ufffd" for c in range(0x80, 0xA0)})  # C1 (CSI, OSC, ...) have no pictures
    for ch in keep:
        table.pop(ord(ch))
    return table


_LINES = _table("\n\t")
_ONE_LINE = _table("")
_SURROGATE = re.compile("[\ud800-\udfff]")  # a non-UTF-8 file name: cannot be written out as UTF-8
# json.dumps escapes C0 but writes DEL, C1 and lone surrogates as they are
_JSON_UNSAFE = re.compile("[\x7f-\x9f\ud800-\udfff]")


def printable(text: str, lines: bool = True) -> str:
    """`text` with control characters made visible; `lines` keeps newlines and tabs."""
    text = str(text)
    if text.isprintable():  # no control, no surrogate, no line break: nothing to change (the common case)
        return text
    return _SURROGATE.sub("\ufffd", str(text).translate(_LINES if lines else _ONE_LINE))


def one_line(text: str) -> str:
    """For titles, names, table cells and error lines: no line breaks either."""
    return printable(text, lines=False)


def plain(text: str, lines: bool = False) -> "Text":
    """A Textual/Rich `Text` of data: shown as it is, never parsed as markup."""
    from rich.text import Text  # here: the CLI prints error lines without loading Rich

    return Text(printable(text, lines))


def terminal_json(text: str) -> str:
    """JSON text (from json.dumps) with DEL, C1 and lone surrogates escaped too: the same data, safe to print."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
