"""Session files: round trips (also through the real engine), atomic saves, bad files, two stores, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dflash_tui.engine.events import Block, Done, Prefill, event_to_dict
from dflash_tui.replay import Player, events_of, recorded_events
from dflash_tui.sessions import (
    SCHEMA_VERSION,
    Session,
    SessionError,
    SessionStore,
    TraceRecorder,
    export_text,
    make_title,
    timed_trace,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "trace_session.json"


def _trace(n_blocks: int = 3, base: float = 0.0) -> list[dict]:
    events = [Prefill(12, 0, 0.02)]
    events += [Block(i, [5, 6, 7] if i else [], 2 if i else 0, [5, 6, 9] if i else [4], "abc", 1.0, 2.0, 0.1)
               for i in range(n_blocks)]
    events.append(Done([4, 5, 6, 9], "abc" * n_blocks, "stop", {"mode": "dflash", "cycles": n_blocks - 1,
                                                               "tokens_per_cycle": 3.0, "generated_tokens": 4}))
    return [{"t": base + 0.01 * i, **event_to_dict(e)} for i, e in enumerate(events)]


def _session(store: SessionStore, turns: int = 1) -> Session:
    s = store.new("org/target-8B", "org/target-8B-dflash", {"temperature": 0.0, "block_size": 16})
    s.add_message("system", "be brief")
    for i in range(turns):
        s.add_message("user", f"question {i}\nwith a second line")
        s.add_message("assistant", f"answer {i}", _trace())
    return s


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- round trips ---------------------------------------------------------------------
def test_save_load_round_trip(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    s = _session(store, turns=2)
    path = store.save(s)
    assert path == tmp_path / "sessions" / f"{s.id}.json"
    loaded = store.load(s.id)
    assert loaded == s
    assert loaded.title == "question 0"  # the first line of the first user message
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["format"] == "dflash-tui-session"
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert store.load(path) == s  # by path as well as by id


def test_default_root_honours_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_TUI_DATA_DIR", str(tmp_path / "elsewhere"))
    assert SessionStore().root == tmp_path / "elsewhere" / "sessions"


def test_real_engine_round_trip(qwen3_pair, tmp_path):
    """Two turns from the real engine, recorded, saved, loaded: equal, and replay gives back the same events."""
    from conftest import oracle_proposer, reference_tokens
    from dflash_tui.engine.conversation import Conversation, GenerationSettings

    conv = Conversation(qwen3_pair, system="You are terse.")
    store = SessionStore(tmp_path / "sessions")
    settings = GenerationSettings(max_tokens=24)
    session = store.new("tiny-target", "tiny-draft", settings.to_dict())
    tok = qwen3_pair.target.tokenizer
    session.decoder = lambda t: tok.decode([t])
    session.add_message("system", "You are terse.")
    produced = []
    for text in ("Write a function.", "And a class?"):
        prompt = conv.prompt_tokens(conv.messages + [{"role": "user", "content": text}])
        conv.propose = oracle_proposer(prompt + reference_tokens(qwen3_pair, prompt, 40), error_rate=0.2)
        rec = TraceRecorder()
        events = []
        for ev in conv.generate(text, settings):
            rec.add(ev)
            events.append(ev)
        produced.append(events)
        session.add_message("user", text)
        session.add_message("assistant", events[-1].text, rec.trace)
        store.save(session)
    assert any(b.accepted for evs in produced for b in evs if isinstance(b, Block))  # the oracle got some right
    loaded = store.load(session.id)
    assert loaded == session
    assert [m["content"] for m in conv.messages] == [m.content for m in loaded.messages]
    assert recorded_events(loaded) == produced
    player = Player(loaded, speed=float("inf"))
    cues = player.advance(0.0)
    assert player.finished and events_of(cues) == [e for evs in produced for e in evs]
    # every token shown in the acceptance view has its recorded text
    ids = {t for evs in produced for b in evs if isinstance(b, Block) for t in b.drafted + b.emitted}
    assert ids <= set(loaded.token_text)


def test_fixture_trace_is_a_valid_session():
    s = SessionStore(Path("/nonexistent")).load(FIXTURE)
    assert s.id == "fixture-trace-session" and s.path is None  # a file outside the store: never written back
    modes = [m.done().stats["mode"] for m in s.replies()]
    assert modes == ["dflash", "baseline", "dflash"]
    assert s.baseline_tps and s.tokens_per_cycle() > 2


# -- timing in traces ------------------------------------------------------------------
def test_timed_trace_fills_missing_times_from_engine_timings():
    raw = [event_to_dict(Prefill(10, 0, 0.5)), event_to_dict(Block(0, [], 0, [1], "a")),
           event_to_dict(Block(1, [1, 2], 1, [1, 3], "b", 10.0, 20.0, 10.0)),
           event_to_dict(Done([1, 1, 3], "ab", "stop", {"prefill_s": 0.5, "decode_s": 0.1}))]
    timed = timed_trace(raw)
    assert [e["t"] for e in timed] == [0.5, 0.5, 0.54, 0.6]
    assert all("t" not in e for e in raw)  # the input is not changed


def test_recorder_spreads_a_batch_over_its_elapsed_time():
    rec = TraceRecorder(clock=lambda: 100.0)
    rec.add(Prefill(4, 0, 0.1), now=100.1)
    blocks = [Block(i, [1, 2], 1, [1, 2], "x", 1.0, 3.0 if i == 1 else 1.0, 0.0) for i in range(3)]
    rec.add_blocks(blocks, elapsed_s=0.6, now=100.8)
    times = [e["t"] for e in rec.trace]
    assert times[0] == pytest.approx(0.1)
    # the batch spans 0.2 .. 0.8, split 2:4:2 by the cycles' own timings
    assert times[1:] == pytest.approx([0.35, 0.65, 0.8])


# -- bad files ---------------------------------------------------------------------------
def _write_bad_files(root: Path) -> dict[str, bytes]:
    good = json.loads(FIXTURE.read_text())
    newer = dict(good, id="newer", schema_version=SCHEMA_VERSION + 1)
    files = {
        "corrupt.json": b'{"format": "dflash-tui-session", "schema_version": 2, "id": !!}',
        "truncated.json": FIXTURE.read_bytes()[:500],
        "foreign.json": json.dumps({"name": "something else", "items": [1, 2]}).encode(),
        "newer.json": json.dumps(newer).encode(),
        "binary.json": b"\xff\xfe\x00garbage",
        "misnamed.json": json.dumps(dict(good, id="another-id")).encode(),
        "baddate.json": json.dumps(dict(good, id="baddate", created="not a date")).encode(),
        "farfuture.json": json.dumps(dict(good, id="farfuture", updated="9999-99-99")).encode(),
        "badtrace.json": json.dumps(dict(good, id="badtrace", messages=[
            {"role": "assistant", "content": "x", "trace": [{"t": 0, "type": "shell", "cmd": "rm -rf /"}]}])).encode(),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def test_bad_files_are_reported_by_name_and_never_touched(tmp_path):
    root = tmp_path / "sessions"
    files = _write_bad_files(root)
    store = SessionStore(root)
    good = _session(store)
    store.save(good)
    before = {name: _digest(root / name) for name in files}

    summaries, problems = store.list()
    assert [s.id for s in summaries] == [good.id]
    assert len(problems) == len(files)
    joined = "\n".join(problems)
    for name in files:
        assert name in joined
    assert "truncated" in next(p for p in problems if p.startswith("truncated.json"))
    assert "newer dflash-tui" in next(p for p in problems if p.startswith("newer.json"))
    assert "foreign" in next(p for p in problems if p.startswith("foreign.json"))
    assert "'updated' is not a date and time" in next(p for p in problems if p.startswith("farfuture.json"))

    for name in files:
        with pytest.raises(SessionError) as exc:
            store.load(root / name)
        assert name in str(exc.value)
        stem = Path(name).stem
        with pytest.raises(SessionError):
            store.delete(stem)  # the app never deletes a file it cannot read
    good.add_message("user", "more")
    store.save(good)
    store.list()
    assert {name: _digest(root / name) for name in files} == before


def test_older_schema_is_migrated_on_load_and_the_file_left_alone(tmp_path):
    root = tmp_path / "sessions"
    root.mkdir()
    v1 = {
        "format": "dflash-tui-session", "schema_version": 1, "id": "old-one", "title": "old",
        "created": "2024-05-01T10:00:00+00:00", "updated": "2024-05-01T10:05:00+00:00",
        "model": {"target": "org/t", "draft": "org/d"}, "settings": {"temperature": 0.0},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "abc", "events": [
                         {k: v for k, v in e.items() if k != "t"} for e in _trace()]}],
    }
    path = root / "old-one.json"
    path.write_text(json.dumps(v1))
    digest = _digest(path)
    s = SessionStore(root).load("old-one")
    assert (s.target, s.draft, s.schema_version) == ("org/t", "org/d", SCHEMA_VERSION)
    times = [e["t"] for e in s.messages[1].trace]
    assert times == sorted(times) and times[-1] > 0  # timing rebuilt from the engine's own figures
    assert s.messages[1].done().text == "abcabcabc"
    assert _digest(path) == digest
    SessionStore(root).save(s)  # saving writes the current schema
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION


def test_ids_and_paths_are_validated(tmp_path):
    root = tmp_path / "sessions"
    store = SessionStore(root)
    for bad in ("../x", "a/b", ".hidden", "", "x" * 200, "a.b"):
        with pytest.raises(SessionError):
            store.path_for(bad)
    outside = tmp_path / "shared.json"
    data = json.loads(FIXTURE.read_text())
    outside.write_text(json.dumps(dict(data, id="../../escape")))
    with pytest.raises(SessionError, match="bad session id"):
        store.load(outside)
    # a valid file shared from elsewhere is read, and saving it goes into the store, not back to it
    outside.write_text(FIXTURE.read_text())
    digest = _digest(outside)
    s = store.load(outside)
    path = store.save(s)
    assert path.parent == root and _digest(outside) == digest
    with pytest.raises(SessionError, match="no such session file"):
        store.load(tmp_path / "missing.json")
    with pytest.raises(SessionError, match="not a session file"):
        store.load(tmp_path)


# -- writing: atomic, failures, two stores -----------------------------------------------
def test_failed_replace_keeps_the_old_file_and_no_temp_files(tmp_path, monkeypatch):
    """Simulates a full or read-only disk by making os.replace fail (root ignores chmod)."""
    store = SessionStore(tmp_path / "sessions")
    s = _session(store)
    path = store.save(s)
    old = path.read_bytes()
    s.add_message("user", "one more")
    revision = s.revision

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        store.save(s)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert s.revision == revision and s.messages[-1].content == "one more"  # still in memory
    store.save(s)  # and it saves once the disk is back
    assert store.load(s.id).messages[-1].content == "one more"


def test_unwritable_data_dir_raises_oserror(tmp_path):
    """A sessions dir whose parent is a regular file cannot be created: an honest stand-in for
    a read-only directory when tests run as root."""
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    store = SessionStore(blocker / "sessions")
    with pytest.raises(OSError):
        store.save(_session(store))
    assert store.list() == ([], [])
    assert blocker.read_text() == "not a directory"


def test_two_stores_never_clobber_each_other(tmp_path):
    root = tmp_path / "sessions"
    a, b = SessionStore(root), SessionStore(root)
    errors = []

    def work(store: SessionStore, tag: str) -> None:
        try:
            for i in range(8):
                s = _session(store)
                s.title = f"{tag}-{i}"
                store.save(s)
                s.add_message("user", "again")
                store.save(s)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(st, tag)) for st, tag in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    summaries, problems = a.list()
    assert not problems
    assert sorted(s.title for s in summaries) == sorted(f"{t}-{i}" for t in "ab" for i in range(8))
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]  # no temp files left


def test_same_session_continued_in_two_instances_forks_instead_of_overwriting(tmp_path):
    root = tmp_path / "sessions"
    a, b = SessionStore(root), SessionStore(root)
    original = _session(a)
    a.save(original)
    in_a, in_b = a.load(original.id), b.load(original.id)
    in_a.add_message("user", "from a")
    a.save(in_a)
    in_b.add_message("user", "from b")
    path_b = b.save(in_b)
    assert in_b.id != in_a.id and path_b.exists()
    assert a.load(in_a.id).messages[-1].content == "from a"
    assert b.load(in_b.id).messages[-1].content == "from b"
    # and a foreign file squatting on a session's name is never overwritten
    squat = root / f"{in_a.id}.json"
    squat.write_text('{"not": "ours"}')
    in_a.add_message("user", "later")
    new_path = a.save(in_a)
    assert new_path != squat and squat.read_text() == '{"not": "ours"}'


# -- rename, delete, export ----------------------------------------------------------------
def test_rename_delete_and_exports(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    s = _session(store)
    store.save(s)
    renamed = store.rename(s.id, "  A better   title ")
    assert store.load(s.id).title == "A better title" == renamed.title
    md = export_text(store.load(s.id), "markdown")
    assert md.startswith("---\ntitle: \"A better title\"\n") and "\n# A better title\n" in md
    assert "## You" in md and "answer 0" in md
    assert "3.00 tok/cycle" in md  # the reply's figures, in the chat's words
    out = store.export(store.load(s.id), "json")
    assert out == tmp_path / "exports" / f"{s.id}.json"
    assert SessionStore(tmp_path / "other").load(out) == store.load(s.id)
    assert store.delete(s.id) == tmp_path / "sessions" / f"{s.id}.json"
    with pytest.raises(SessionError):
        store.load(s.id)
    assert make_title("x" * 100).endswith("…") and len(make_title("x" * 100)) == 60


# -- the CLI ----------------------------------------------------------------------------------
def _cli(*args: str, env_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, DFLASH_TUI_DATA_DIR=str(env_dir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "dflash_tui", *args], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=60)


def test_cli_sessions_list_show_export_delete(tmp_path):
    store = SessionStore(tmp_path / "data" / "sessions")
    s = _session(store)
    store.save(s)
    (store.root / "broken.json").write_text("{")
    r = _cli("sessions", "list", "--json", env_dir=tmp_path / "data")
    assert r.returncode == 0, r.stderr
    listing = json.loads(r.stdout)
    assert [x["id"] for x in listing["sessions"]] == [s.id]
    assert listing["sessions"][0]["tokens_per_cycle"] == 3.0
    assert listing["problems"][0].startswith("broken.json")
    r = _cli("sessions", "show", s.id, "--json", env_dir=tmp_path / "data")
    assert json.loads(r.stdout)["id"] == s.id
    r = _cli("sessions", "export", s.id, "-f", "md", "-o", str(tmp_path / "out.md"), env_dir=tmp_path / "data")
    assert r.returncode == 0 and "\n# question 0\n" in (tmp_path / "out.md").read_text()
    # a file asked for gets the mode the shell's `>` would give it under the user's umask, not mkstemp's 0600
    env = dict(os.environ, DFLASH_TUI_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "dflash_tui", "sessions", "export", s.id, "-o", str(tmp_path / "o2.md")],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60,
                       preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0 and stat.S_IMODE((tmp_path / "o2.md").stat().st_mode) == 0o640
    r = _cli("sessions", "delete", s.id, env_dir=tmp_path / "data")
    assert r.returncode == 1 and "--yes" in r.stderr and store.path_for(s.id).exists()
    r = _cli("sessions", "delete", s.id, "--yes", env_dir=tmp_path / "data")
    assert r.returncode == 0 and not store.path_for(s.id).exists()


@pytest.mark.parametrize("args, expect", [
    (("replay", "no-such-id"), "no session 'no-such-id'"),
    (("sessions", "show", "BROKEN"), "broken.json: truncated JSON"),
    (("replay", "BROKEN"), "broken.json: truncated JSON"),
    (("sessions", "delete", "../../etc", "--yes"), "not a session id"),
    (("replay", "x", "--speed", "100"), "speed must be"),
    (("sessions", "search", "x", "--snippets", "-1"), "--snippets: 0 or more, got -1"),
    (("sessions", "delete", "20250101-000000-loop0000", "--yes"), "20250101-000000-loop0000.json: a link that leads "
                                                                  "to no session file; left as it is"),
])
def test_cli_bad_input_is_one_line(tmp_path, args, expect):
    root = tmp_path / "data" / "sessions"
    root.mkdir(parents=True)
    broken = root / "broken.json"
    broken.write_text('{"format": "dflash-tui-session", ')
    (root / "20250101-000000-loop0000.json").symlink_to("20250101-000000-loop0000.json")  # a link to itself
    args = tuple(str(broken) if a == "BROKEN" else a for a in args)
    r = _cli(*args, env_dir=tmp_path / "data")
    assert r.returncode != 0
    assert expect in r.stderr and "Traceback" not in r.stderr
    assert broken.read_text() == '{"format": "dflash-tui-session", '


def test_cli_replay_starts_the_replay_app_without_a_model(monkeypatch):
    from dflash_tui import cli
    from dflash_tui.ui import replay_screen

    started = []
    monkeypatch.setattr(replay_screen.ReplayApp, "run", lambda self: started.append((self.session.id, self.speed)))
    assert cli.main(["replay", str(FIXTURE), "--speed", "4"]) == 0
    assert started == [("fixture-trace-session", 4.0)]
    assert cli.main(["replay", str(FIXTURE), "--speed", "instant"]) == 0
    assert started[-1][1] == float("inf")
