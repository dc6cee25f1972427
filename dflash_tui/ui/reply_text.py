"""A reply's text as the conversation shows it: control characters made visible, bare code fenced, and
where a streaming reply's open code fence starts. Pure text: no Textual."""

from __future__ import annotations

import re
from typing import Optional

_CONTROL = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_CONTROL[0x7F] = 0x2421
_CONTROL.update({c: 0xFFFD for c in range(0x80, 0xA0)})  # C1 (a lone CSI is as good as ESC [) have no pictures
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})[^\n]*\n(?P<body>.*?)(?:^(?P=fence)[ \t]*$|\Z)", re.M | re.S)
FENCE_LINE = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)")


def visible(text: str) -> str:
    """Control characters as their Unicode pictures: a random or confused model must not drive the terminal."""
    return text.translate(_CONTROL)


_BARE_CODE = re.compile(r"\s*(def |async def |class \w|@\w|import \w|from [\w.]+ import )")


def looks_like_bare_code(text: str) -> bool:
    """A reply that starts as Python source and has no fences (the demo model answers this way)."""
    return "```" not in text and "~~~" not in text and _BARE_CODE.match(text) is not None


def start_undecided(text: str) -> bool:
    """True while a reply's first line could still turn out to be bare code ("de", "from os")."""
    head = text.lstrip()
    if not head:
        return True
    if "\n" in head:
        return False
    if any(k.startswith(head) for k in ("def ", "async def ", "class ", "import ", "from ", "@")):
        return True
    return head.startswith("from ") and " import " not in head and len(head) < 40


def display_text(text: str) -> str:
    """The Markdown to show for a reply: bare code goes in a fence, or Markdown would run its lines together."""
    return f"```python\n{text.rstrip(chr(10))}\n```" if looks_like_bare_code(text) else text


def open_fence_start(markdown: str) -> Optional[int]:
    """Where the opening line of a fenced code block that `markdown` ends inside starts; None
    when every fence is closed."""
    fence, start, pos = "", None, 0
    for line in markdown.split("\n"):
        m = FENCE_LINE.match(line)
        if m is not None:
            mark, info = m.group("fence"), m.group("info")
            if not fence:
                if not (mark[0] == "`" and "`" in info):  # backticks in the info string: inline code, not a fence
                    fence, start = mark, pos
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not info.strip():
                fence, start = "", None
        pos += len(line) + 1
    return start


def has_fence_line(text: str) -> bool:
    return any(FENCE_LINE.match(line) for line in text.split("\n"))


def code_blocks(markdown: str) -> list[str]:
    """The bodies of fenced code blocks, in order (an unclosed fence runs to the end)."""
    return [m.group("body").rstrip("\n") for m in _FENCE.finditer(markdown)]
