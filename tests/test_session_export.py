"""Exports: YAML front matter a YAML reader takes back exactly, code fenced with its language, one message,
one branch, model names instead of install paths; and through the CLI."""

from __future__ import annotations

import json

import pytest

from dflash_tui.cli import main
from dflash_tui.engine.events import Block, Done, Prefill, event_to_dict
from dflash_tui.session_export import code_language, export_text, fenced
from dflash_tui.sessions import Session, SessionStore

yaml = pytest.importorskip("yaml")

ESCAPES = "\x1b]0;pwned\x07\x9b2J\x7f\u2028"
BARE = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n"


def _trace(text: str, mode: str = "dflash", **ran) -> list[dict]:
    stats = {"mode": mode, "generated_tokens": 12, "decode_tps": 48.25, "cycles": 4 if mode == "dflash" else 0, **ran}
    if mode == "dflash":
        stats.update(tokens_per_cycle=3.125, acceptance=0.53125)
    events = [Prefill(6, 0, 0.01), Block(0, [], 0, [4], text), Done([4], text, "stop", stats)]
    return [{"t": 0.01 * (i + 1), **event_to_dict(e)} for i, e in enumerate(events)]


def _session() -> Session:
    from dflash_tui.demo import demo_draft_path, demo_target_path

    s = Session(id="exp-1", title="Adding " + ESCAPES, created="2025-05-01T09:00:00+00:00",
                updated="2025-05-01T09:05:00+00:00", target=str(demo_target_path()), draft=str(demo_draft_path()),
                settings={"temperature": 0.0, "block_size": 16, "note": "x: [y] # z"}, device="cpu")
    s.add_message("system", "be brief")
    s.add_message("user", "add two numbers")
    s.add_message("assistant", BARE, _trace(BARE))
    q = s.add_message("user", "and a list?")
    s.add_message("assistant", "Here:\n\n```\nimport math\nprint(math.fsum([1, 2]))\n```\n", _trace("x", "baseline"))
    s.edit(q.id, "and a tuple?")
    s.add_message("assistant", "Use `sum((1, 2))`.", _trace("y", temperature=0.7, max_tokens=64, block_size=8))  # its own
    return s


def _front(md: str) -> dict:
    assert md.startswith("---\n")
    head, _, _body = md[4:].partition("\n---\n")
    return yaml.safe_load(head)


def test_front_matter_reads_back_with_model_names_settings_and_figures():
    s = _session()
    md = export_text(s, "markdown")
    front = _front(md)
    assert front["title"] == s.title  # escapes and all, exactly
    assert (front["model"], front["draft"]) == ("demo (offline)", "demo (offline)")
    assert "demo/target" not in md and "dflash_tui" not in md  # no install path
    assert front["settings"] == {"temperature": 0.0, "block_size": 16, "note": "x: [y] # z"}
    assert front["date"] == "2025-05-01T09:00:00+00:00" and front["session"] == "exp-1"
    assert front["messages"] == 5 and front["branches"] == 2
    assert front["replies"] == [
        {"message": "m3", "mode": "dflash", "tokens": 12, "tau": 3.125, "acceptance": 0.5312, "tok_s": 48.2,
         "block_size": None, "temperature": None, "max_tokens": None, "finish": "stop"},  # an older file: not recorded
        {"message": "m7", "mode": "dflash", "tokens": 12, "tau": 3.125, "acceptance": 0.5312, "tok_s": 48.2,
         "block_size": 8, "temperature": 0.7, "max_tokens": 64, "finish": "stop"}]
    assert "\x1b" not in md and "\x9b" not in md and "\x07" not in md  # inert on a terminal
    assert "and a tuple?" in md and "and a list?" not in md  # the branch in view


def test_code_is_fenced_with_its_language():
    md = export_text(_session(), "md")
    assert "```python\n" + BARE.strip("\n") + "\n```" in md  # bare code keeps its lines
    assert fenced("Here:\n\n```\nimport math\n```") == "Here:\n\n```python\nimport math\n```"
    assert fenced("```rust\nfn main() {}\n```") == "```rust\nfn main() {}\n```"  # a language given is kept
    assert fenced("```\nsome words\n```") == "```text\nsome words\n```"
    assert fenced("Plain prose.\nTwo lines.") == "Plain prose.\nTwo lines."
    assert fenced("x = '```'\n")  == "x = '```'\n"  # a fence mark mid-line is not a fence
    assert fenced("import os\nprint('``` ok')") == "````python\nimport os\nprint('``` ok')\n````"
    assert [code_language(t) for t in ("#include <stdio.h>", "package main", "fn main() {", "SELECT 1",
                                       "const x = 1;", '{"a": 1}', "import the thing, please?")] == [
        "c", "go", "rust", "sql", "javascript", "json", None]


def test_one_message_and_one_branch():
    s = _session()
    md = export_text(s, "md", message="3")
    assert _front(md)["messages"] == 1 and "## Assistant" in md and "## You" not in md
    one = json.loads(export_text(s, "json", message="m5"))
    assert one["message"]["content"].startswith("Here:") and one["figures"]["mode"] == "baseline"
    assert one["model"] == "demo (offline)"
    branch = json.loads(export_text(s, "json", branch="m5"))  # the other branch, as a session file of its own
    from dflash_tui.sessions import session_from_dict

    alone = session_from_dict(branch)
    assert [m.content for m in alone.messages][3:] == ["and a list?", s.tree.nodes["m5"].content]
    assert alone.tree.leaves() == 1 and s.messages[3].content == "and a tuple?"  # the view is not changed
    whole = session_from_dict(json.loads(export_text(s, "json")))
    assert whole == s  # every branch
    with pytest.raises(KeyError):
        export_text(s, "md", message="99")


def test_cli_export_by_prefix_of_a_message_and_a_branch(tmp_path, monkeypatch, capsys):
    store = SessionStore(tmp_path / "sessions")
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    s = _session()
    store.save(s)
    assert main(["sessions", "export", "exp", "--message", "3"]) == 0
    out = capsys.readouterr().out
    assert _front(out)["replies"][0]["message"] == "m3" and "```python" in out
    assert main(["sessions", "export", "exp", "--branch", "m5", "-f", "json", "-o", str(tmp_path / "b.json")]) == 0
    assert [m.content for m in store.load(tmp_path / "b.json").messages][-2] == "and a list?"
    assert main(["sessions", "export", "exp", "--message", "m99"]) == 1
    assert "no message 'm99'" in capsys.readouterr().err
    assert main(["sessions", "show", "exp"]) == 0
    out = capsys.readouterr().out
    assert "‹ 2/2 ›" in out and "m6" in out  # where a message has siblings, and the ids to export by


# -- what a Markdown viewer shows ----------------------------------------------------------------
TYPED = ["what does <div> do?", "<!-- a comment left open", "AT&T, &amp; and &#60; as typed",
         "*not emphasis*, _nor this_, snake_case_name", "[a link](http://x.y) ![an image](z.png)",
         "# not a heading\n> not a quote\n- not a list\n1. not a list either\n+ nor this\n===",
         "a \\* backslash, C:\\dir\\ and a line's end\\", "| a | b |\n|---|---|\n~~not struck~~ $5 and $6",
         "see https://example.com/a_(b)_c*d*. now"]


def _rendered(md: str) -> tuple[str, str]:
    """The export's body as commonmark renders it: its HTML, and the text a reader sees."""
    import html
    import re

    from markdown_it import MarkdownIt

    out = MarkdownIt("commonmark").render(md[4:].partition("\n---\n")[2])
    return out, html.unescape(re.sub(r"<[^>]+>", "", out.replace("<br />\n", "\n")))


def test_typed_text_reads_as_typed_and_no_message_hides_the_ones_after_it():
    s = Session(id="exp-2", title="<!-- C# <b>", created="2025-05-01T09:00:00+00:00",
                updated="2025-05-01T09:05:00+00:00", target="demo", draft=None, settings={}, device="cpu")
    s.add_message("system", "be <em>brief</em>")
    for typed in TYPED:
        s.add_message("user", typed)
        s.add_message("assistant", "ok", _trace("ok"))
    s.add_message("user", "code: `<b>` stays code\n```html\n<script>x()</script>\n```")
    s.add_message("assistant", "Use <b>bold</b>, **this** and `<i>`, <https://x.y>.\n\n<pre>\n<!-- left open", _trace("r"))
    s.add_message("user", "and an open fence\n```\nstill typed")
    s.add_message("assistant", "Cut short:\n\n```python\ndef f(<x>):", _trace("c"))
    s.add_message("user", "the last word")
    out, text = _rendered(export_text(s, "md"))
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    for typed in TYPED + ["be <em>brief</em>"]:
        got = [ln.strip() for ln in typed.split("\n")]
        assert any(lines[i:i + len(got)] == got for i in range(len(lines))), typed  # every line, as typed
    assert lines[0] == "<!-- C# <b>"  # the title too
    assert "<code>&lt;b&gt;</code> stays code" in out and '<code class="language-html">&lt;script&gt;' in out
    # a reply stays Markdown; its raw HTML shows as text; a fence it left open ends with it
    assert "Use &lt;b&gt;bold&lt;/b&gt;, <strong>this</strong> and <code>&lt;i&gt;</code>" in out
    assert '<a href="https://x.y">https://x.y</a>' in out and "&lt;!-- left open" in out
    assert "<pre><code>still typed\n</code></pre>" in out and "def f(&lt;x&gt;):\n</code></pre>" in out
    user_turns = len(TYPED) + 3
    assert out.count("<h2>You</h2>") == user_turns and out.count("<h2>Assistant</h2>") == user_turns - 1
    assert out.endswith("<h2>You</h2>\n<p>the last word</p>\n")  # nothing before it swallowed it


def test_any_typed_text_renders_as_typed():
    import random

    from dflash_tui.markdown_text import literal

    rng = random.Random(7)
    pieces = list("<>&#*_[]()!\\-+=|$:.;/? \tab1") + ["<div>", "<!--", "-->", "&amp;", "&#60;", "1. ", "- ", "\n",
                                                     "\n\n", "a_b", "<?", "<![CDATA[", "[x]: /u", "    "]
    for _ in range(300):
        typed = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        s = Session(id="t", title="t", created="", updated="", target="demo", draft=None, settings={}, device="cpu")
        s.add_message("user", typed)
        s.add_message("user", "after")
        _, text = _rendered(export_text(s, "md"))
        shown = [ln.strip() for ln in text.split("\n") if ln.strip()]
        assert shown == ["t", "You"] + [ln.strip() for ln in typed.split("\n") if ln.strip()] + ["You", "after"], \
            (typed, literal(typed))
