"""Exports of a session, a branch or one message: Markdown with YAML front matter, or JSON.

Markdown follows the branch in view (or the one asked for). Its front matter
holds the model and draft (by name, never an install path), the settings, the
dates and every reply's figures (τ, acceptance, tok/s); in the text, a reply
that is bare code is fenced with its language, and a fence without a language
gets one. A message you typed (and the system prompt, and the title) reads as
typed once rendered: its markup is escaped outside code (markdown_text.literal).
A reply stays Markdown, but its raw HTML shows as text and a fence it left open
is closed, so no message can hide the ones after it. Control characters are
made visible, never written raw. JSON is the session file itself (every
branch), a session file of one branch, or one message with its trace.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from dflash_tui.markdown_text import heading_text, literal, reply_markdown
from dflash_tui.model_names import model_label
from dflash_tui.printable import one_line, printable, terminal_json
from dflash_tui.session_record import Session, reply_summary
from dflash_tui.session_tree import Message

FORMATS = ("markdown", "md", "json")
ROLE_NAMES = {"system": "System", "user": "You", "assistant": "Assistant"}

# -- which messages ---------------------------------------------------------------------
def branch_through(session: Session, message_id: Optional[str]) -> list[Message]:
    """The branch in view, or the branch through `message_id` (below it: as last seen), without changing
    what is in view."""
    if message_id is None:
        return session.messages
    tree = session.tree
    return [tree.nodes[i] for i in tree.path_to(message_id) + tree.descend(message_id)]


def find_message(session: Session, ref: str) -> Message:
    """A message by its id, or by its number (from 1) in the branch in view; KeyError saying which."""
    if ref.isdigit() and ref.isascii():
        n = int(ref)
        if not 1 <= n <= len(session.messages):
            raise KeyError(f"the branch in view has {len(session.messages)} messages, not {n}")
        return session.messages[n - 1]
    return session.tree.get(ref)


# -- YAML front matter ----------------------------------------------------------------------
# outside YAML's printable set, or a line break to YAML 1.1: written as escapes
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


def yaml_scalar(value: Any) -> str:
    """A JSON scalar, which YAML reads as the same value (strings double-quoted, every control escaped)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def reply_figures(message: Message) -> dict[str, Any]:
    """The figures of one reply: mode, tokens, τ (tokens per cycle), acceptance, tok/s; None where not measured."""
    done = message.done()
    stats = done.stats if done is not None else {}
    dflash = stats.get("mode") == "dflash"

    def rounded(key: str, places: int) -> Optional[float]:
        value = stats.get(key)
        return round(float(value), places) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return {"message": message.id, "mode": stats.get("mode"),
            "tokens": stats.get("generated_tokens", len(done.tokens) if done else None),
            "tau": rounded("tokens_per_cycle", 3) if dflash else None,
            "acceptance": rounded("acceptance", 4) if dflash else None,
            "tok_s": rounded("decode_tps", 1),
            # what this reply ran with (the front matter's settings are the last reply's)
            "block_size": stats.get("block_size") if dflash else None,
            "temperature": rounded("temperature", 4), "max_tokens": stats.get("max_tokens"),
            "finish": done.finish_reason if done else None}


def front_matter(session: Session, messages: list[Message]) -> str:
    lines = ["---", f"title: {yaml_scalar(session.title or 'untitled')}", f"session: {yaml_scalar(session.id)}",
             f"model: {yaml_scalar(model_label(session.target))}",
             f"draft: {yaml_scalar(model_label(session.draft) if session.draft else None)}",
             f"device: {yaml_scalar(session.device)}", f"date: {yaml_scalar(session.created)}",
             f"updated: {yaml_scalar(session.updated)}"]
    lines.append("settings:" if session.settings else "settings: {}")
    lines += [f"  {yaml_scalar(str(k))}: {yaml_scalar(v)}" for k, v in session.settings.items()]
    lines.append(f"messages: {len(messages)}")
    lines.append(f"branches: {session.tree.leaves()}")
    replies = [reply_figures(m) for m in messages if m.role == "assistant"]
    lines.append("replies:" if replies else "replies: []")
    for figures in replies:
        items = list(figures.items())
        lines.append(f"  - {items[0][0]}: {yaml_scalar(items[0][1])}")
        lines += [f"    {k}: {yaml_scalar(v)}" for k, v in items[1:]]
    lines.append("---")
    return "\n".join(lines)


# -- code fences ------------------------------------------------------------------------------
_FENCE_LINE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# a first line that is code, by language (checked in this order)
_STARTS: list[tuple[str, re.Pattern[str]]] = [(lang, re.compile(p)) for lang, p in (
    ("python", r"(async\s+def|def)\s+\w+\s*\(|class\s+\w+\s*[(:]|from\s+[\w.]+\s+import\s+\S"
               r"|import\s+[\w.]+(\s+as\s+\w+)?(\s*,\s*[\w.]+)*\s*$|@[\w.]+(\(.*\))?\s*$|if\s+__name__\s*==|#!.*python"),
    ("bash", r"#!\s*/(usr/)?bin/(env\s+)?(ba|z)?sh\b"),
    ("c", r"#include\s*[<\"]"),
    ("go", r"package\s+\w+\s*$|func\s+(\([^)]*\)\s*)?\w+\s*\("),
    ("rust", r"(pub\s+)?(fn\s+\w+|struct\s+\w+|enum\s+\w+|impl\b|mod\s+\w+\s*[;{])|use\s+\w+(::[\w{}*, ]+)+;"),
    ("typescript", r"(export\s+)?(interface\s+\w+|type\s+\w+\s*=)"),
    ("javascript", r"(export\s+)?(async\s+)?function\b|(const|let|var)\s+\w+\s*=|import\s+.*\s+from\s+['\"]"
                   r"|console\.log\("),
    ("java", r"(public|private)\s+(static\s+|final\s+)*(class|interface|void)\b"),
    ("sql", r"(SELECT|INSERT\s+INTO|CREATE\s+TABLE|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b"),
    ("html", r"<!DOCTYPE\s+html|<html\b"),
)]


def _first_lines(text: str, n: int) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()][:n]


def code_language(text: str, lines: int = 1) -> Optional[str]:
    """The language the first `lines` lines of `text` are code in; None when they read as prose."""
    for line in _first_lines(text, lines):
        for lang, pattern in _STARTS:
            if pattern.match(line):
                return lang
    head = text.lstrip()[:1]
    if head in ("{", "["):
        try:
            json.loads(text)
            return "json"
        except ValueError:
            pass
    return None


def _fence_for(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def fenced(text: str) -> str:
    """A reply as Markdown: bare code inside a fence with its language; fences without one given one."""
    lines = text.split("\n")
    if not any(_FENCE_LINE.match(ln) for ln in lines):
        lang = code_language(text)
        if lang is None:
            return text
        fence = _fence_for(text)
        return f"{fence}{lang}\n{text.strip(chr(10))}\n{fence}"
    out, open_at, fence = [], -1, ""
    for i, line in enumerate(lines):
        m = _FENCE_LINE.match(line)
        if m is None:
            out.append(line)
            continue
        mark, info = m["fence"], m["info"]
        if not fence and not (mark[0] == "`" and "`" in info):  # backticks in the info: inline code, no fence
            fence, open_at = mark, len(out)
        elif fence and mark[0] == fence[0] and len(mark) >= len(fence) and not info.strip():
            if not out[open_at].strip()[len(fence):].strip():  # the opening line has no language
                body = "\n".join(out[open_at + 1:])
                out[open_at] = out[open_at].rstrip() + (code_language(body, lines=5) or "text")
            fence = ""
        out.append(line)
    return "\n".join(out)


# -- Markdown ------------------------------------------------------------------------------------
def _message_markdown(m: Message) -> list[str]:
    # typed text reads as typed; a reply is rendered as the Markdown it is, its raw HTML escaped and its fence closed
    text = reply_markdown(fenced(m.content)) if m.role == "assistant" else literal(m.content)
    if m.role == "system" and not text:
        text = "*(system prompt cleared)*"
    lines = [f"## {ROLE_NAMES[m.role]}", "", text, ""]
    figures = reply_summary(m.done()) if m.role == "assistant" else ""
    if figures:
        lines += [f"*{figures}*", ""]
    return lines


def to_markdown(session: Session, messages: Optional[list[Message]] = None) -> str:
    """The branch in view (or `messages`) as Markdown with YAML front matter."""
    whole = messages is None
    messages = session.messages if messages is None else messages
    lines = [f"# {heading_text(one_line(session.title or 'untitled'))}", ""]
    tpc = session.tokens_per_cycle() if whole else None
    if tpc is not None:
        lines += [f"*{tpc:.2f} tokens per cycle over the session*", ""]
    for m in messages:
        lines += _message_markdown(m)
    return front_matter(session, messages) + "\n\n" + printable("\n".join(lines))


# -- JSON ------------------------------------------------------------------------------------------
def _dumps(data: Any) -> str:
    return terminal_json(json.dumps(data, ensure_ascii=False, indent=1, allow_nan=False)) + "\n"


def to_json(session: Session, messages: Optional[list[Message]] = None) -> str:
    """The session file (every branch), or, given a branch, a session file of that branch alone: shareable,
    and `dflash-tui replay` reads it (DEL and C1 escaped: the same data)."""
    data = session.to_dict()
    if messages is not None:
        keep = {m.id for m in messages}
        data["messages"] = [dict(m.to_dict(), children=[c for c in m.children if c in keep]) for m in messages]
        data["roots"], data["view"] = [messages[0].id] if messages else [], [m.id for m in messages]
    return _dumps(data)


def message_json(session: Session, message: Message) -> str:
    data = {"format": "dflash-tui-message", "session": session.id, "title": session.title,
            "model": model_label(session.target), "draft": model_label(session.draft) if session.draft else None,
            "settings": session.settings, "message": message.to_dict(),
            "figures": reply_figures(message) if message.role == "assistant" else None}
    return _dumps(data)


def export_text(session: Session, fmt: str, message: Optional[str] = None, branch: Optional[str] = None) -> str:
    """`fmt` is markdown (md) or json; `message` (an id or a number in the branch in view) exports that
    message alone, `branch` (a message id) the branch through it. KeyError for a message not there."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (markdown or json)")
    if message is not None:
        m = find_message(session, message)
        return to_markdown(session, [m]) if fmt != "json" else message_json(session, m)
    messages = branch_through(session, branch) if branch is not None else None
    return to_json(session, messages) if fmt == "json" else to_markdown(session, messages)
