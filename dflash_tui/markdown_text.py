"""Text made safe to write into a Markdown document that others render.

A person's words (a message, the system prompt, a title) become Markdown that
renders exactly as typed: what a renderer would take as markup (HTML, entities,
emphasis, links, headings, lists, quotes, tables, backslashes) is escaped and
line breaks are kept, outside code spans and fenced or indented code, which
show their text literally already. A model's reply stays the Markdown it wrote,
but its raw HTML is escaped (shown as text, never run, and an unterminated
`<!--` or `<pre>` cannot swallow what follows) and an unclosed fence is closed:
no message can hide the ones after it. Pure text: markdown-it-py (which Textual
brings) finds a reply's code blocks.
"""

from __future__ import annotations

import bisect
import re
import string
from typing import Optional

_PUNCT = frozenset(string.punctuation)  # what a backslash escapes (CommonMark: any ASCII punctuation)
_FENCE_LINE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_BACKTICKS = re.compile(r"`+")
# `<` that opens raw HTML: a tag, a closing tag, a comment, a declaration, CDATA, a processing instruction
_HTML_START = re.compile(r"<[A-Za-z/!?]")
_BLUNT = re.compile(r"(\\[\s\S])|(<[A-Za-z/!?])")  # an escape pair as it is, else a `<` that opens HTML
_AUTOLINK = re.compile(r"<(?:[A-Za-z][A-Za-z0-9.+-]{1,31}:[^\s<>]*|[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9]"
                       r"(?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)>")
# a bare URL, which a linking viewer (GFM) links with its escapes in it: written as an autolink instead
_URL = re.compile(r"(?:[hH][tT][tT][pP][sS]?|[fF][tT][pP])://[^\s<>\x00-\x1f\x7f]*")
_URL_TAIL = ".,:;!?'\"*_~"  # punctuation ending a sentence, not the URL
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
# markup anywhere in a line: code spans, emphasis, links and images, strikethrough, table cells, math
_ALWAYS = frozenset("`*[]~|$")
# markup at the start of a line: a heading, a quote, a list item, a setext underline or a thematic break
_HEADING = re.compile(r"#{1,6}(?:[ \t]|$)")
_ORDERED = re.compile(r"[0-9]{1,9}(?=[.)](?:[ \t]|$))")


def code_spans(text: str, escapes: bool) -> dict[int, int]:
    """Where the code spans of one run of inline text start and end (backticks included). `escapes`:
    a backslash before punctuation escapes it, as in Markdown; without, backslashes are plain text."""
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(text)]
    by_length: dict[int, list[int]] = {}  # a run's length -> the indices of the runs that long, in order
    for k, (a, b) in enumerate(runs):
        by_length.setdefault(b - a, []).append(k)
    spans: dict[int, int] = {}
    i, r, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if escapes and c == "\\" and i + 1 < n and text[i + 1] in _PUNCT:
            i += 2
            continue
        if c != "`":
            i += 1
            continue
        while runs[r][1] <= i:
            r += 1
        end = runs[r][1]  # from i: an escaped first backtick leaves the rest of its run to open
        same = by_length.get(end - i, [])
        k = bisect.bisect_right(same, r)
        if k == len(same):  # no later run of the same length: the backticks are text
            i = end
            continue
        spans[i] = runs[same[k]][1]
        i = spans[i]
    return spans


def _escape_inline(text: str, typed: bool, extra: str = "") -> str:
    """`typed`: a person's line, every piece of markup escaped; else a reply's inline text, raw HTML escaped.
    `extra`: more characters to escape (a heading's `#`)."""
    spans = code_spans(text, escapes=not typed)
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if i in spans:
            out.append(text[i:spans[i]])
            i = spans[i]
            continue
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            if not typed and nxt in _PUNCT:  # the reply's own escape: kept as it is
                out.append(text[i:i + 2])
                i += 2
                continue
            # a typed backslash before punctuation (or a URL's `<`) or at a line's end would escape it or break the line
            out.append("\\\\" if typed and (nxt in _PUNCT or nxt in ("", "\n") or _URL.match(text, i + 1)) else c)
        elif c == "<" and _HTML_START.match(text, i) and (typed or not _AUTOLINK.match(text, i)):
            out.append("\\<")
        elif not typed:
            out.append(c)
        elif c == "_":
            end = i
            while end < n and text[end] == "_":
                end += 1
            # inside a word (snake_case) underscores are never emphasis: left as typed
            inside = i > 0 and end < n and text[i - 1].isalnum() and text[end].isalnum()
            out.append(text[i:end] if inside else "\\_" * (end - i))
            i = end
            continue
        elif c in "hHfF" and (i == 0 or not text[i - 1].isalnum()) and _URL.match(text, i):
            url = _url(_URL.match(text, i)[0])  # type: ignore[index]
            out.append(f"<{url}>")
            i += len(url)
            continue
        elif c in _ALWAYS or c in extra or (c == "&" and _ENTITY.match(text, i)):
            out.append("\\" + c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _url(url: str) -> str:
    """A bare URL without the punctuation after it (and without a `)` that closes a parenthesis around it)."""
    while url and (url[-1] in _URL_TAIL or (url[-1] == ")" and url.count(")") > url.count("("))):
        url = url[:-1]
    return url


def _escape_line_start(line: str) -> str:
    body = line.lstrip(" \t")
    lead = line[:len(line) - len(body)]
    c = body[:1]
    if c == ">" or (c == "#" and _HEADING.match(body)) or (c in ("-", "+", "=") and body[1:2] in ("", " ", "\t", c)):
        return lead + "\\" + body
    m = _ORDERED.match(body)
    return lead + body[:m.end()] + "\\" + body[m.end():] if m else line


def _indent(line: str) -> int:
    col = 0
    for ch in line:
        if ch == " ":
            col += 1
        elif ch == "\t":
            col += 4 - col % 4
        else:
            break
    return col


def _fence_opening(line: str) -> Optional[str]:
    m = _FENCE_LINE.match(line)
    if m is None or (m["fence"][0] == "`" and "`" in m["info"]):  # backticks in the info: inline code
        return None
    return m["fence"]


def _closes(line: str, fence: str) -> bool:
    m = _FENCE_LINE.match(line)
    return (m is not None and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence)
            and not m["info"].strip(" \t"))


def literal(text: str) -> str:
    """A person's text as Markdown that renders as typed, line breaks included. Fenced code (closed if
    left open) and indented code stay as they are: they show their text literally."""
    out: list[str] = []
    paragraph: list[str] = []
    fence = ""

    def end_paragraph() -> None:
        lines = [_escape_line_start(_escape_inline(ln, typed=True)) for ln in paragraph]
        out.extend(ln + "\\" for ln in lines[:-1])  # a hard break: each typed line stays a line
        out.extend(lines[-1:])
        paragraph.clear()

    for line in text.split("\n"):
        if fence:
            out.append(line)
            fence = "" if _closes(line, fence) else fence
        elif _fence_opening(line):
            end_paragraph()
            out.append(line)
            fence = _fence_opening(line) or ""
        elif not line.strip(" \t"):
            end_paragraph()
            out.append(line)
        elif not paragraph and _indent(line) >= 4:  # indented code (a paragraph's next line is not)
            out.append(line)
        else:
            paragraph.append(line)
    end_paragraph()
    if fence:
        out.append(fence)
    return "\n".join(out)


def heading_text(text: str) -> str:
    """One line for after a heading's `#`: as `literal`, and a `#` at its end is not a closing sequence."""
    return _escape_line_start(_escape_inline(text.strip(" \t"), typed=True, extra="#"))


def _reply_blocks(text: str) -> tuple[set[int], dict[int, int], bool, str]:
    """A reply as markdown-it reads it: its lines of code, its runs of inline text (first line -> end),
    whether it holds raw HTML, and the fence left open at its end ("" if none)."""
    from markdown_it import MarkdownIt

    lines = text.split("\n")
    code: set[int] = set()
    groups: dict[int, int] = {}
    html, unclosed = False, ""
    for token in MarkdownIt("commonmark").parse(text.replace("\r", " ")):  # (a \r would end a line there)
        html = html or token.type == "html_block" or any(c.type == "html_inline" for c in token.children or ())
        if token.map is None:
            continue
        start, end = token.map
        if token.type in ("fence", "code_block"):
            code.update(range(start, end))
            if (token.type == "fence" and token.level == 0
                    and (end - 1 == start or not _closes(lines[end - 1], token.markup))):
                unclosed = token.markup  # it runs to the end of the reply, and would run on into what follows
        elif token.type == "inline":
            groups[start] = end
    return code, groups, html, unclosed


def reply_markdown(text: str) -> str:
    """A reply's Markdown as the model wrote it, with its raw HTML escaped (outside code) and a fence
    it left open closed."""
    blunt = False  # code spans respected; then (should that leave HTML) every `<` outside code blocks escaped
    while True:
        code, groups, html, unclosed = _reply_blocks(text)
        if not html:
            break
        lines = text.split("\n")
        out: list[str] = []
        i = 0
        while i < len(lines):
            if i in code:
                out.append(lines[i])
                i += 1
                continue
            end = i + 1 if blunt else groups.get(i, i + 1)
            run = "\n".join(lines[i:end])
            out.append(_BLUNT.sub(lambda m: m[1] or "\\" + m[2], run) if blunt else _escape_inline(run, typed=False))
            i = end
        escaped = "\n".join(out)  # (an escaped HTML block's lines may read as other blocks now: parsed again)
        if escaped == text and blunt:
            break
        blunt = blunt or escaped == text
        text = escaped
    if unclosed:
        text = text.rstrip("\n") + "\n" + unclosed
    return text
