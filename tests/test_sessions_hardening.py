"""Sessions from an audit: a private index, a data dir that is a file, exports that never make folders or
replace files, ambiguous prefixes that count only readable sessions. Through the real CLI."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from dflash_tui.cli import main
from dflash_tui.files import Refused
from dflash_tui.session_index import INDEX_NAME
from dflash_tui.sessions import Session, SessionStore, StoreUnusable


def _saved(store: SessionStore, text: str = "a private question") -> Session:
    s = store.new("org/target-8B", None, {"temperature": 0.0})
    s.add_message("user", text)
    s.add_message("assistant", "an answer")
    store.save(s)
    return s


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def store() -> SessionStore:
    return SessionStore()  # $DFLASH_TUI_DATA_DIR/sessions: a temp folder (conftest)


@pytest.fixture
def wide_umask():
    old = os.umask(0o022)  # the usual umask, under which SQLite made the index 0644
    yield
    os.umask(old)


def _private(path: Path) -> bool:
    return stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0


# -- 1. the index holds every message: only its owner reads it --------------------------------------
def test_the_index_and_its_journal_are_private(store, capsys, wide_umask):
    _saved(store)
    rc, out, _err = _run(capsys, "sessions", "list")
    assert rc == 0 and "a private question" in out
    index = store.root / INDEX_NAME
    assert _private(index)
    conn = sqlite3.connect(index, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO meta VALUES ('probe', 'x')")  # a write in progress: a journal beside it
        journal = Path(f"{index}-journal")
        assert journal.exists() and _private(journal)
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_an_index_others_could_read_is_narrowed(store, capsys, wide_umask):
    _saved(store)
    assert _run(capsys, "sessions", "list")[0] == 0
    index = store.root / INDEX_NAME
    os.chmod(index, 0o644)  # as an earlier version left it
    assert _run(capsys, "sessions", "search", "private")[0] == 0
    assert _private(index)


# -- 2. a data dir that is a file --------------------------------------------------------------------
ACTIONS = [("list",), ("list", "--json"), ("search", "x"), ("show", "2026"), ("export", "2026"),
           ("delete", "2026", "--yes")]


@pytest.mark.parametrize("args", ACTIONS)
def test_a_data_dir_that_is_a_file_is_one_clear_error(tmp_path, monkeypatch, capsys, args):
    datafile = tmp_path / "datafile"
    datafile.write_text("hi\n")
    monkeypatch.setenv("DFLASH_TUI_DATA_DIR", str(datafile))
    rc, out, err = _run(capsys, "sessions", *args)
    assert rc == 1 and out == ""
    assert err == f"dflash-tui: cannot use the sessions folder {datafile / 'sessions'}: {datafile} is not a folder\n"
    assert datafile.read_text() == "hi\n"


def test_a_sessions_folder_that_is_a_file(store, capsys):
    store.root.parent.mkdir(parents=True)
    store.root.write_text("not a folder")
    rc, out, err = _run(capsys, "sessions", "list")
    assert (rc, out) == (1, "") and err.endswith(f"{store.root}: it is not a folder\n")
    with pytest.raises(StoreUnusable, match="it is not a folder"):  # what the app can catch (a SessionError)
        store.load("2026")


# -- 3. exports to a path the user gave --------------------------------------------------------------
def test_export_never_creates_folders(store, tmp_path, capsys):
    s = _saved(store)
    dest = tmp_path / "nonexistent" / "dir" / "x.md"
    rc, out, err = _run(capsys, "sessions", "export", s.id, "-o", str(dest))
    assert (rc, out, err) == (1, "", f"dflash-tui: no such folder: {dest.parent}\n")
    assert not (tmp_path / "nonexistent").exists()
    with pytest.raises(Refused):  # an OSError: the app's /export reports it
        store.export(s, "markdown", dest)


def test_export_never_replaces_a_file(store, tmp_path, capsys):
    s = _saved(store)
    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    rc, out, err = _run(capsys, "sessions", "export", s.id, "-o", str(mine))
    assert (rc, out, err) == (1, "", f"dflash-tui: already exists: {mine}\n")
    assert mine.read_text() == "my notes\n"
    rc, _out, err = _run(capsys, "sessions", "export", s.id, "-o", str(mine / "x.md"))
    assert rc == 1 and err == f"dflash-tui: not a folder: {mine}\n"
    fresh = tmp_path / "fresh.md"
    assert _run(capsys, "sessions", "export", s.id, "-o", str(fresh))[0] == 0
    assert "a private question" in fresh.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left
    first = store.export(s, "markdown")  # the app's own exports/ folder: made; a newer export goes beside it
    first.write_text(first.read_text() + "my edit\n")
    s.add_message("user", "one more")
    second = store.export(s, "markdown")
    assert second == first.with_name(f"{s.id}-2.md") and "one more" in second.read_text()
    assert first.read_text().endswith("my edit\n")  # the user's edit is still there
    assert store.export(s, "markdown").name == f"{s.id}-3.md"
    # a folder given: the export goes into it, named as in exports/ and never over an earlier one
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    rc, _out, err = _run(capsys, "sessions", "export", s.id, "-o", str(shelf))
    assert rc == 0 and (shelf / f"{s.id}.md").exists(), err
    assert store.export(s, "json", shelf) == shelf / f"{s.id}.json"
    assert store.export(s, "markdown", shelf) == shelf / f"{s.id}-2.md"


# -- ambiguous prefixes ---------------------------------------------------------------------------------
def test_an_ambiguous_prefix_counts_only_readable_sessions(store, capsys):
    a, b = _saved(store), _saved(store)
    broken = store.root / f"{a.id[:9]}999999-deadbeef.json"  # same date, same prefix, not a session
    broken.write_text("{")
    rc, _out, err = _run(capsys, "sessions", "show", a.id[:9])
    assert rc == 1 and f"2 sessions start with {a.id[:9]!r}" in err and broken.stem not in err
    assert {a.id, b.id} <= set(err.split("(")[1].split(")")[0].split(", "))
    os.unlink(store.path_for(b.id))
    rc, out, _err = _run(capsys, "sessions", "show", a.id[:9])  # one session left beside the broken file
    assert rc == 0 and f"({a.id})" in out


def test_a_reply_with_no_cycle_drafted_has_no_cycle_figures():
    """A reply's figure line (footer, replay, `sessions show`, export): tokens per cycle is never 0.00."""
    from dflash_tui.engine.events import Done
    from dflash_tui.figure_rules import reply_summary

    drafted = Done([5, 6, 7], "abc", "stop", {"mode": "dflash", "generated_tokens": 3, "cycles": 1,
                                               "tokens_per_cycle": 3.0, "acceptance": 0.5, "decode_tps": 9.0})
    alone = Done([5], "a", "stop", {"mode": "dflash", "generated_tokens": 1, "cycles": 0,
                                     "tokens_per_cycle": 0.0, "acceptance": 0.0, "decode_tps": 0.0})
    assert "3.00 tok/cycle · 50% accepted" in reply_summary(drafted)
    line = reply_summary(alone)
    assert "target only" in line and "tok/cycle" not in line and "accepted" not in line
    assert reply_summary(Done([5], "a", "length", dict(drafted.stats))).endswith("hit max tokens")
    # one token is "1 token"; a DFlash turn stopped before its first token ran no mode: it says only that
    assert line.startswith("1 token · ")
    unborn = Done([], "", "cancelled", {"mode": "dflash", "generated_tokens": 0, "cycles": 0})
    assert reply_summary(unborn) == "0 tokens · stopped"


# -- 4. a reply reads the same in the app, in `sessions show` and in the export -----------------------
FIGURES = [  # (tokens, finish, the Done's stats) -> the words under the reply, as the chat writes them
    (([5, 6, 7], "stop", {"mode": "dflash", "generated_tokens": 3, "cycles": 1, "tokens_per_cycle": 3.0,
                          "acceptance": 0.5, "decode_tps": 9.0}),
     "3 tokens · 3.00 tok/cycle · 50% accepted · 9.0 tok/s"),
    (([], "stop", {"mode": "remote", "generated_tokens": 40, "cycles": 16, "tokens_per_cycle": 2.5,
                   "acceptance": 0.6, "ttft_s": 0.12, "decode_tps": 31.0}),
     "40 tokens · 2.50 tok/step · 60% accepted · ttft 0.12 s · 31.0 tok/s"),
    (([], "length", {"mode": "remote", "generated_tokens": 12, "ttft_s": 0.3, "decode_tps": 20.0}),
     "12 tokens · no speculative figures · ttft 0.30 s · 20.0 tok/s · hit max tokens"),
    # a file without the engine's token count: the reply's token ids count
    (([5, 6], "cancelled", {"mode": "baseline", "decode_tps": 8.0}), "2 tokens · target only · 8.0 tok/s · stopped"),
]


@pytest.mark.anyio
async def test_a_reply_reads_the_same_in_the_app_in_show_and_in_the_export(store, capsys):
    from dflash_tui.engine.events import Done, event_to_dict
    from dflash_tui.sessions import export_text
    from dflash_tui.ui.chat_view import AssistantMessage
    from dflash_tui.ui.replay_screen import ReplayApp

    s = store.new("org/target-8B", "org/draft", {"temperature": 0.0})
    for n, ((tokens, finish, stats), _) in enumerate(FIGURES):
        s.add_message("user", f"question {n}")
        s.add_message("assistant", f"answer {n}", [{"t": 0.01, **event_to_dict(Done(tokens, f"answer {n}", finish, stats))}])
    store.save(s)
    wanted = [words for _, words in FIGURES]
    app = ReplayApp(store.load(s.id), paused=True, theme="textual-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("i", "space")  # played, instantly
        for _ in range(100):
            if app.screen.player.finished:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.1)
        shown = [str(b.query_one(".message-footer").render()) for b in app.screen.query(AssistantMessage)]
    assert shown == wanted
    rc, out, _err = _run(capsys, "sessions", "show", s.id)
    assert rc == 0 and [line.strip() for line in out.splitlines() if line.startswith("  (")] == [f"({w})" for w in wanted]
    md = export_text(store.load(s.id), "markdown")
    assert [line for line in md.splitlines() if line.startswith("*") and " · " in line] == [f"*{w}*" for w in wanted]
