"""The SQLite index beside the session files: incremental, rebuilt when lost or corrupt, never holding a
hostile file, usable from a read-only folder and by several instances at once; search and id prefixes."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dflash_tui import session_index
from dflash_tui.session_index import INDEX_NAME, fts_query
from dflash_tui.sessions import Session, SessionError, SessionStore

FIXTURE = Path(__file__).parent / "fixtures" / "trace_session.json"
ROOT = Path(__file__).resolve().parents[1]


def _write(store: SessionStore, sid: str, title: str, text: str, updated: str) -> Path:
    data = json.loads(FIXTURE.read_text())
    data.update(id=sid, title=title, updated=updated)
    data["messages"][1]["content"] = text
    store.root.mkdir(parents=True, exist_ok=True)
    path = store.root / f"{sid}.json"
    path.write_text(json.dumps(data, ensure_ascii=False))
    return path


def _store(tmp_path: Path) -> SessionStore:
    store = SessionStore(tmp_path / "sessions")
    _write(store, "alpha-1", "Parsing dates", "How do I parse an ISO date in Python?", "2025-01-01T10:00:00+00:00")
    _write(store, "alpha-2", "Café au lait", "Une recette de café, s'il vous plaît", "2025-01-02T10:00:00+00:00")
    _write(store, "beta-1", "Sorting", "sort a list of tuples by the second item -> key=", "2025-01-03T10:00:00+00:00")
    return store


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The files the index reads (the real reader, counted)."""
    seen: list[str] = []
    real = session_index.read_session

    def counted(path):
        seen.append(path.name)
        return real(path)

    monkeypatch.setattr(session_index, "read_session", counted)
    return seen


def _parsed_listing(store: SessionStore) -> list[tuple]:
    """What a listing must say, from reading every file whole."""
    out = []
    for path in store.root.glob("*.json"):
        s = store.load(path.stem)
        out.append((s.updated, s.id, s.title, len(s.messages), s.tokens_per_cycle()))
    return sorted(out, reverse=True)


def _listing(store: SessionStore) -> list[tuple]:
    return [(s.updated, s.id, s.title, s.messages, s.tokens_per_cycle) for s in store.list()[0]]


def test_the_index_reads_only_what_changed(tmp_path, reads):
    store = _store(tmp_path)
    assert _listing(store) == _parsed_listing(store) and sorted(reads) == ["alpha-1.json", "alpha-2.json", "beta-1.json"]
    assert (store.root / INDEX_NAME).is_file()
    reads.clear()
    assert _listing(store) == _parsed_listing(store) and reads == []
    s = store.load("beta")
    s.add_message("user", "and in reverse?")
    store.save(s)
    (store.root / "alpha-2.json").unlink()
    (store.root / "broken.json").write_text("{")
    reads.clear()
    summaries, problems = store.list()
    assert sorted(reads) == ["beta-1.json", "broken.json"]
    assert [x.id for x in summaries] == ["beta-1", "alpha-1"] and summaries[0].messages == 8
    assert problems == ["broken.json: truncated JSON (Expecting property name enclosed in double quotes at line 1)"]
    reads.clear()
    assert store.list()[1] == problems and reads == []  # a bad file is not read again until it changes
    _write(store, "broken", "Fixed", "now fine", "2025-02-01T10:00:00+00:00")
    summaries, problems = store.list()
    assert "broken" in [x.id for x in summaries] and problems == []


def test_a_lost_or_corrupt_index_is_rebuilt_from_the_files(tmp_path, reads):
    store = _store(tmp_path)
    expected = _listing(store)
    index = store.root / INDEX_NAME
    for damage in (lambda: index.unlink(), lambda: index.write_bytes(b"not a database" * 100),
                   lambda: index.write_bytes(index.read_bytes()[:2048])):
        damage()
        reads.clear()
        assert _listing(store) == expected and len(reads) == 3
        assert sqlite3.connect(index).execute("SELECT count(*) FROM sessions").fetchone() == (3,)
    # The full-text part damaged, found out by a search. Seeds 0-2 make SQLite say "malformed"; 117 makes it
    # report out of memory (Python's MemoryError), as about 1 damage in 80 does.
    for seed in (0, 1, 2, 117):
        rng = random.Random(seed)
        db = sqlite3.connect(index)
        for rowid, size in db.execute("SELECT id, length(block) FROM texts_data").fetchall():
            db.execute("UPDATE texts_data SET block = ? WHERE id = ?", (rng.randbytes(size or 0), rowid))
        db.commit()
        db.close()
        assert [h.summary.id for h in store.search("parse")[0]] == ["alpha-1"], seed


def test_a_foreign_database_under_the_index_name_is_replaced(tmp_path):
    store = _store(tmp_path)
    expected = _listing(store)
    index = store.root / INDEX_NAME
    index.unlink()
    db = sqlite3.connect(index)
    db.executescript(session_index._TABLES["meta"] + ";" + session_index._TABLES["files"] + ";"
                     "CREATE TABLE sessions (id, title, target, draft, created, updated, messages, turns, branches,"
                     " generated_tokens, tokens_per_cycle);"
                     "INSERT INTO sessions VALUES ('x', 1, 2, 3, 4, 5, 'six', 7, 8, 9, 'ten');")
    db.commit()
    db.close()
    assert _listing(store) == expected


def test_an_index_name_that_is_not_a_regular_file_is_left_alone(tmp_path):
    store = _store(tmp_path)
    expected = _listing(store)
    index = store.root / INDEX_NAME
    index.unlink()
    elsewhere = tmp_path / "elsewhere.db"
    index.symlink_to(elsewhere)
    assert _listing(store) == expected and not elsewhere.exists() and index.is_symlink()
    index.unlink()
    os.mkfifo(index)
    assert _listing(store) == expected
    assert store.search("parse")[0][0].summary.id == "alpha-1"
    # in memory there is nothing to keep between uses: even a filter as you type reads the folder
    assert [h.summary.id for h in store.search("parse", refresh=False)[0]] == ["alpha-1"]


def test_a_hostile_file_never_enters_the_index(tmp_path):
    from test_fault_sessions import BAD, GOOD, build_folder

    root = tmp_path / "sessions"
    build_folder(root)
    summaries, problems = SessionStore(root).list()
    assert sorted(s.id for s in summaries) == sorted(GOOD)
    db = sqlite3.connect(root / INDEX_NAME)
    assert sorted(i for (i,) in db.execute("SELECT id FROM sessions")) == sorted(GOOD)
    assert db.execute("SELECT count(*) FROM files WHERE problem IS NOT NULL").fetchone() == (len(BAD),)
    assert len(SessionStore(root).list()[1]) == len(BAD)


def test_search_by_title_and_text_quoting_query_syntax(tmp_path):
    store = _store(tmp_path)
    s = Session(id="gamma-1", title="", created="2025-01-04T09:00:00+00:00", updated="2025-01-04T10:00:00+00:00", target="t", draft=None,
                settings={})
    s.add_message("user", "first question")
    s.add_message("assistant", "an answer")
    s.regenerate_reply("a regenerated answer about zebras")  # a branch not in view is searched too
    s.tree.select(s.tree.nodes["m2"].id)
    store.save(s)

    def ids(text: str) -> list[str]:
        return [h.summary.id for h in store.search(text)[0]]

    assert ids("parse") == ["alpha-1"]  # a word prefix ("parse" in the text, "Parsing" in the title)
    assert ids("PARS python") == ["alpha-1"]  # every word, case ignored
    assert ids("cafe") == ["alpha-2"]  # accents ignored
    assert ids("zebra") == ["gamma-1"]
    assert ids("sorting") == ["beta-1"]
    assert ids("->") == ["beta-1"]  # no letter or digit: looked for as it is
    assert ids("") == ["gamma-1", "beta-1", "alpha-2", "alpha-1"]
    for hostile in ('"', 'parse"', "AND", "parse OR sort", "NEAR(parse sort)", "title:parse", "*", "^parse",
                    "parse*", "(", "'; DROP TABLE sessions; --", "-parse", "\x1b[2J"):
        found = ids(hostile)  # never an error; FTS operators are words like any other
        assert set(found) <= {"alpha-1", "alpha-2", "beta-1", "gamma-1"}, hostile
    assert ids("parse OR sort") == []  # "or" is a word here, found nowhere
    assert fts_query('say "hi"') == '"say"* AND """hi"""*'
    assert store.search("ISO")[0][0].snippet == ""  # snippets only when asked for
    hit = store.search("ISO", snippets=1)[0][0]
    assert "ISO date" in hit.snippet


def test_id_prefixes(tmp_path):
    store = _store(tmp_path)
    assert store.resolve_id("beta") == "beta-1" and store.load("bet").id == "beta-1"
    assert store.resolve_id("alpha-1") == "alpha-1"
    with pytest.raises(SessionError, match="2 sessions start with 'alpha' .alpha-1, alpha-2."):
        store.load("alpha")
    with pytest.raises(SessionError, match="no session 'zeta'"):
        store.load("zeta")
    with pytest.raises(SessionError, match="not a session id"):
        store.resolve_id("../alpha")


def test_several_instances_share_the_index(tmp_path):
    """Two processes list over and over while this one saves: every listing is whole, none fails."""
    store = _store(tmp_path)
    script = ("import json, sys; from dflash_tui.sessions import SessionStore; st = SessionStore(sys.argv[1]); "
              "out = [sorted(s.id for s in st.list()[0]) for _ in range(15)]; print(json.dumps(out))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(store.root)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, text=True) for _ in range(2)]
    saved = []
    for i in range(10):
        s = store.new("t", None, {})
        s.add_message("user", f"question {i}")
        store.save(s)
        saved.append(s.id)
    base = {"alpha-1", "alpha-2", "beta-1"}
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        for listing in json.loads(out):
            assert base <= set(listing) <= base | set(saved)
    assert sorted(s.id for s in store.list()[0]) == sorted(base | set(saved))


def _read_only_works() -> bool:
    try:
        r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount --bind -o ro / / 2>/dev/null; true"],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _list_read_only(root: Path) -> dict:
    """`sessions list --json` with the sessions folder mounted read-only (a user namespace)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DFLASH_TUI_DATA_DIR=str(root.parent))
    cmd = (f'mount --bind -o ro "{root}" "{root}" && touch "{root}/probe" 2>/dev/null && exit 9; '
           f'exec "{sys.executable}" -m dflash_tui sessions list --json')
    r = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(not _read_only_works(), reason="no user namespaces to mount a read-only folder")
def test_a_read_only_folder_is_listed_without_writing(tmp_path):
    store = _store(tmp_path)
    shutil.copy(FIXTURE, store.root / "fixture-trace-session.json")
    listing = _list_read_only(store.root)  # no index yet, and none can be made
    assert sorted(s["id"] for s in listing["sessions"]) == ["alpha-1", "alpha-2", "beta-1", "fixture-trace-session"]
    assert not (store.root / INDEX_NAME).exists()
    store.list()  # an index, made while it could be written
    index = store.root / INDEX_NAME
    digest = hashlib.sha256(index.read_bytes()).hexdigest()
    _write(store, "alpha-2", "Changed since", "new text", "2025-03-01T10:00:00+00:00")
    listing = _list_read_only(store.root)
    assert listing["sessions"][0]["id"] == "alpha-2" and listing["sessions"][0]["title"] == "Changed since"
    assert hashlib.sha256(index.read_bytes()).hexdigest() == digest


def test_a_session_listed_while_it_is_saved_threads(tmp_path):
    """Listing in threads (their own connections) while saves go on: no error, no half rows."""
    store = _store(tmp_path)
    errors: list[BaseException] = []

    def lister() -> None:
        try:
            for _ in range(20):
                ids = {s.id for s in SessionStore(store.root).list()[0]}
                assert {"alpha-1", "alpha-2", "beta-1"} <= ids
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=lister) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(10):
        s = store.load("beta-1")
        s.add_message("user", f"more {i}")
        store.save(s)
    for t in threads:
        t.join(60)
    assert not errors


def test_the_index_benchmark_runs_on_a_few_sessions(tmp_path, capsys):
    """The benchmark's mechanics on 30 small sessions (the 10,000-session figures are in docs/sessions.md)."""
    from dflash_tui.bench import sessions_index as bench

    assert bench.main(["--sessions", "30", "--kb", "4", "--repeat", "1", "--dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sessions"] == 30 and report["search_hits"]["zebra"] == 1  # one session in a hundred, from the 8th
    assert all(0 < report["search_hits"][q] <= 30 for q in ("python", "parse dat"))
    for key in ("read_every_file_s", "list_cold_s", "list_warm_s", "list_one_changed_s", "search_cold_s",
                "cli_list_warm_s", "cli_search_warm_s"):
        assert 0 < report[key] < 60, key
    assert set(report["search_warm_s"]) == {"python", "zebra", "parse dat"}
    summaries, problems = SessionStore(tmp_path / "sessions").list()  # every synthetic file is a valid session
    assert len(summaries) == 30 and not problems and summaries[0].turns >= 2


def test_cli_search_list_and_prefixes(tmp_path, monkeypatch, capsys):
    from dflash_tui.cli import main

    store = _store(tmp_path)
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    evil = "\x1b]0;pwned\x07 zebra"
    _write(store, "gamma-1", "title " + evil, "a message about zebras " + evil, "2025-01-05T10:00:00+00:00")
    assert main(["sessions", "list"]) == 0
    out, err = capsys.readouterr()
    assert f"4 session(s) in {store.root}" in err  # where the files are
    assert [line.split()[0] for line in out.splitlines()] == ["gamma-1", "beta-1", "alpha-2", "alpha-1"]
    assert main(["sessions", "search", "zebra"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("gamma-1") and "zebras" in out.splitlines()[1]  # the words in context
    assert "\x1b" not in out and "\x07" not in out and "␛]0;pwned" in out
    assert main(["sessions", "search", "zebra", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [s["id"] for s in found["sessions"]] == ["gamma-1"] and found["sessions"][0]["title"] == "title " + evil
    assert main(["sessions", "search", "nothing-here"]) == 1  # like grep: nothing found
    assert main(["sessions", "show", "gam"]) == 0 and "gamma-1" in capsys.readouterr().out
    assert main(["sessions", "export", "alpha-2", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "alpha-2"
    assert main(["sessions", "delete", "alpha", "--yes"]) == 1  # two match: nothing deleted
    assert "2 sessions start with 'alpha'" in capsys.readouterr().err
    assert main(["sessions", "delete", "gam", "--yes"]) == 0
    assert not (store.root / "gamma-1.json").exists() and len(list(store.root.glob("*.json"))) == 3


def test_an_index_built_under_other_checks_is_rebuilt(tmp_path, monkeypatch, capsys):
    """After an upgrade whose checks are stricter, a file the old ones let in is no row: the index records what
    the checks were (a digest of their source) and is rebuilt when they change, with nobody bumping a version."""
    from dflash_tui import session_schema
    from dflash_tui.cli import main

    store = _store(tmp_path)
    data = json.loads(FIXTURE.read_text())
    data["id"] = "tau-99"
    for m in data["messages"]:
        for entry in m.get("trace") or []:
            if entry["type"] == "done" and entry["stats"]["mode"] == "dflash":
                entry["stats"].update(tokens_per_cycle=99.0, block_size=16)  # more than a block of 16 holds
    (store.root / "tau-99.json").write_text(json.dumps(data))
    with monkeypatch.context() as older:  # the release before: checks that let it through, and their digest
        older.setattr(session_schema, "_figures_possible", lambda stats: True)
        older.setattr(session_index, "checks_version", lambda: "the-older-checks", raising=False)
        summaries, problems = store.list()
        assert {s.id: s.tokens_per_cycle for s in summaries}["tau-99"] == 99.0 and problems == []
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    assert main(["sessions", "list"]) == 0
    out, err = capsys.readouterr()
    assert "tau-99" not in out and "99.00 tok/cycle" not in out and len(out.splitlines()) == 3
    assert "skipped tau-99.json: message m3: trace entry" in err and "figures no run can give" in err
    assert main(["sessions", "show", "tau-99"]) == 1  # as `show` says too
    db = sqlite3.connect(store.root / INDEX_NAME)
    assert dict(db.execute("SELECT key, value FROM meta"))["checks"] == session_index.checks_version()
    assert db.execute("SELECT count(*) FROM sessions WHERE id = 'tau-99'").fetchone() == (0,)


def test_the_checks_version_follows_the_source_and_falls_back_safely(tmp_path, monkeypatch):
    import compileall
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    probe = tmp_path / "dflash_checks_probe.py"
    probe.write_text("LIMIT = 16\n")
    importlib.invalidate_caches()
    first = session_index.checks_version(("dflash_checks_probe",))
    assert session_index._module_digest("dflash_checks_probe").startswith("src:")
    probe.write_text("LIMIT = 17  # stricter\n")
    assert session_index.checks_version(("dflash_checks_probe",)) == first  # worked out once a run
    session_index.checks_version.cache_clear()
    assert session_index.checks_version(("dflash_checks_probe",)) != first
    # no source (an install of compiled files only): the compiled code, which changes with it
    assert compileall.compile_file(str(probe), legacy=True, quiet=1)
    probe.unlink()
    monkeypatch.delitem(sys.modules, "dflash_checks_probe")
    importlib.invalidate_caches()
    assert session_index._module_digest("dflash_checks_probe").startswith("code:")
    # neither (a built-in, a module that cannot be found): the app's version, never an error
    assert session_index._module_digest("sys") == session_index._module_digest("no_such_module_here")
    assert session_index._module_digest("sys").startswith("version:")
    session_index.checks_version.cache_clear()
    assert len(session_index.checks_version()) == 32
