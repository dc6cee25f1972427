"""The fault suite for session files: one hostile file of each kind in one folder.

`sessions list/show/export`, `replay` and the sessions screen (ctrl+o in the
chat app) run over them: no traceback, no control byte reaches the output, the
good sessions are still listed, every bad file is named with its reason and
left exactly as it was.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash_tui.cli import main
from dflash_tui.sessions import SessionStore, read_session, session_from_dict

FIXTURE = Path(__file__).parent / "fixtures" / "trace_session.json"
ROOT = Path(__file__).resolve().parents[1]
# clipboard write (OSC 52), window title, clear screen, a C1 CSI, DEL, a carriage return
ESCAPES = "\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1b[2J\x9b2J\x7f\r"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # anything but \t and \n
EVIL_NAME = "evil\x1b]0;x\x07name.json"


def _base() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _with(sid: str, **changes) -> dict:
    data = _base()
    data.update(id=sid, **changes)
    return data


def _block(trace: list, **changes) -> list:
    """The trace with its second block (a drafting cycle) changed."""
    trace = copy.deepcopy(trace)
    blocks = [e for e in trace if e["type"] == "block" and e["drafted"]]
    blocks[0].update(changes)
    return trace


def _reply(data: dict, trace: list) -> dict:
    data["messages"][2]["trace"] = trace
    return data


def _evil_text() -> dict:
    """Valid, but with terminal controls in every text a view shows."""
    data = _with("evil-text", title="osc " + ESCAPES, target="org/t" + ESCAPES, draft="org/d" + ESCAPES,
                 device="cpu" + ESCAPES, updated="2031-01-01T00:00:00+00:00")  # a date: controls there are refused
    data["settings"]["note"] = ESCAPES
    for m in data["messages"]:
        m["content"] += ESCAPES
    data["token_text"] = {k: v + ESCAPES for k, v in data["token_text"].items()}
    trace = _block(data["messages"][2]["trace"], text="x" + ESCAPES)
    trace.insert(-1, {"t": trace[-2]["t"], "type": "error", "message": "boom" + ESCAPES})
    return _reply(data, trace)


def _markup() -> dict:
    data = _with("markup", title="[/] hi", target="[/]", draft="[bold]x[/]", updated="2030-01-01T00:00:00+00:00")
    data["messages"][1]["content"] = "[/] hi"
    return data


def _v1(**changes) -> dict:
    data = {"format": "dflash-tui-session", "schema_version": 1, "id": "v1", "title": "t", "created": "c",
            "updated": "u", "model": {"target": "t", "draft": None}, "settings": {},
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "events": []}]}
    data.update(changes)
    return data


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


GOOD = {"good": lambda: _with("good"), "evil-text": _evil_text, "markup": _markup}
# file name -> JSON data (dict) or raw bytes; each is one kind of hostile file
BAD_DATA = {
    "messages-not-a-list.json": lambda: _with("messages-not-a-list", messages=5),
    "nested-too-deep.json": lambda: (b'{"format": "dflash-tui-session", "schema_version": 2, "settings": '
                                     + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "nested-50.json": lambda: _with("nested-50", settings={"x": _nested(50)}),
    "int-5000-digits.json": lambda: b'{"format": "dflash-tui-session", "schema_version": 2, "revision": '
                                    + b"7" * 5000 + b"}",
    "int-huge-in-stats.json": lambda: _reply(_with("int-huge-in-stats"), _stats(generated_tokens=10**400)),
    "version-huge.json": lambda: _with("version-huge", schema_version=10**400),
    "lone-surrogate.json": lambda: json.dumps(_with("lone-surrogate")).replace('"title": "', '"title": "\\ud800', 1).encode(),
    "nan.json": lambda: json.dumps(_with("nan", baseline_tps=1.5)).replace('"baseline_tps": 1.5', '"baseline_tps": NaN').encode(),
    "stats-wrong-type.json": lambda: _reply(_with("stats-wrong-type"), _stats(tokens_per_cycle="fast")),
    "stats-null.json": lambda: _reply(_with("stats-null"), _stats(decode_tps=None)),
    "date-with-escapes.json": lambda: _with("date-with-escapes", updated="2031-01-01T00:00:00+00:00" + ESCAPES),
    "date-not-a-date.json": lambda: _with("date-not-a-date", created="9999-99-99"),
    "float-huge-in-stats.json": lambda: _reply(_with("float-huge-in-stats"), _stats(decode_tps=1e300)),
    "float-huge-baseline.json": lambda: _with("float-huge-baseline", baseline_tps=1e300),
    # a ratio of two figures each fine alone: a speedup of 10^300 (the reply's recorded target-alone rate)
    "rate-tiny-in-stats.json": lambda: _reply(_with("rate-tiny-in-stats"), _stats(baseline_tps=1e-300)),
    "temperature-huge.json": lambda: _reply(_with("temperature-huge"), _stats(temperature=9e15)),
    "top-p-over-one.json": lambda: _with("top-p-over-one", settings={"top_p": 1e9}),
    "acceptance-over-one.json": lambda: _reply(_with("acceptance-over-one"), _stats(acceptance=7.5)),
    "tau-over-block.json": lambda: _reply(_with("tau-over-block"), _stats(block_size=16, tokens_per_cycle=99.0)),
    "settings-wrong-type.json": lambda: _with("settings-wrong-type", settings={"temperature": "hot"}),
    "event-wrong-type.json": lambda: _reply(_with("event-wrong-type"), _block(_trace(), drafted="abc")),
    "event-unknown-field.json": lambda: _reply(_with("event-unknown-field"), _block(_trace(), extra=1)),
    "accepted-negative.json": lambda: _reply(_with("accepted-negative"), _block(_trace(), accepted=-5)),
    "accepted-too-many.json": lambda: _reply(_with("accepted-too-many"), _block(_trace(), accepted=99)),
    "text-not-text.json": lambda: _reply(_with("text-not-text"), _block(_trace(), text=42)),
    "token-id-negative.json": lambda: _reply(_with("token-id-negative"), _block(_trace(), emitted=[-1])),
    "token-text-bad-key.json": lambda: _with("token-text-bad-key", token_text={"1" * 400: "x"}),
    "v1-model-not-object.json": lambda: _v1(id="v1-model-not-object", model=5),
    "v1-messages-not-list.json": lambda: _v1(id="v1-messages-not-list", messages=5),
    "v1-event-not-object.json": lambda: _v1(id="v1-event-not-object", messages=[
        {"role": "assistant", "content": "x", "events": [5]}]),
    "v1-event-bad-seconds.json": lambda: _v1(id="v1-event-bad-seconds", messages=[
        {"role": "assistant", "content": "x", "events": [{"type": "prefill", "prompt_tokens": 1,
                                                          "cached_tokens": 0, "seconds": [1]}]}]),
    "not-utf8.json": lambda: b'{"title": "caf\xe9"}',
    EVIL_NAME: lambda: b"{",
    "[b]markup-name[i].json": lambda: b"{",
}


def _trace() -> list:
    return _base()["messages"][2]["trace"]


def _stats(**changes) -> list:
    trace = _trace()
    trace[-1]["stats"].update(changes)
    return trace


def build_folder(root: Path) -> dict[str, str]:
    """The hostile folder; returns file name -> sha256 of every bad file (to show they are left alone)."""
    root.mkdir(parents=True, exist_ok=True)
    for sid, make in GOOD.items():
        (root / f"{sid}.json").write_text(json.dumps(make(), ensure_ascii=False), encoding="utf-8")
    for name, make in BAD_DATA.items():
        data = make()
        (root / name).write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    os.mkfifo(root / "fifo.json")
    os.symlink("/dev/zero", root / "dev-zero.json")
    (root / "folder.json").mkdir()
    with open(root / "too-big.json", "wb") as fh:  # sparse: costs no disk
        fh.truncate(65 * 1024 * 1024)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir() if p.name in BAD_DATA}


SPECIAL = ["fifo.json", "dev-zero.json", "folder.json", "too-big.json"]
BAD = sorted(list(BAD_DATA) + SPECIAL)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    root = tmp_path / "data" / "sessions"
    digests = build_folder(root)
    monkeypatch.setenv("DFLASH_TUI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: root)
    yield root
    for name, digest in digests.items():  # nothing was changed
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _inert(text: str) -> bool:
    return not CONTROL.search(text)


def _shown(name: str) -> str:
    """How a file name appears once neutralised."""
    from dflash_tui.printable import one_line

    return one_line(name)


# -- the store ------------------------------------------------------------------------------------
def test_store_list_returns_the_good_and_names_every_bad_file_with_a_reason(folder):
    result: list = []
    worker = threading.Thread(target=lambda: result.append(SessionStore(folder).list()), daemon=True)
    worker.start()
    worker.join(20)  # a fifo or /dev/zero read would never return
    assert result, "listing the sessions hung"
    summaries, problems = result[0]
    assert sorted(s.id for s in summaries) == sorted(GOOD)
    named = {p.split(": ", 1)[0]: p.split(": ", 1)[1] for p in problems}
    assert sorted(named) == BAD
    assert all(reason.strip() for reason in named.values())
    assert "not a regular file" in named["fifo.json"] and "not a regular file" in named["dev-zero.json"]
    assert "too big" in named["too-big.json"]


@pytest.mark.parametrize("name", sorted(BAD_DATA))
def test_each_bad_file_is_one_session_error(tmp_path, name):
    from dflash_tui.sessions import SessionError

    data = BAD_DATA[name]()
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    with pytest.raises(SessionError, match=re.escape(name)):
        read_session(path)


# -- the CLI ----------------------------------------------------------------------------------------
def test_cli_sessions_list_lists_the_good_and_skips_the_bad_by_name(folder, capsys):
    rc, out, err = _run(capsys, "sessions", "list")
    assert rc == 0
    assert _inert(out) and _inert(err)
    assert sorted(line.split()[0] for line in out.splitlines()) == sorted(GOOD)
    skipped = [line for line in err.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == len(BAD) and all(any(line.startswith(f"skipped {_shown(n)}:") for line in skipped) for n in BAD)
    assert "[/] hi" in out  # data as it is, not parsed

    rc, out, err = _run(capsys, "sessions", "list", "--json")
    assert rc == 0 and _inert(out)
    listing = json.loads(out)
    assert sorted(s["id"] for s in listing["sessions"]) == sorted(GOOD)
    assert len(listing["problems"]) == len(BAD)
    evil = next(s for s in listing["sessions"] if s["id"] == "evil-text")
    assert evil["title"] == "osc " + ESCAPES  # the JSON keeps the data exact


def test_cli_show_and_export_of_each_file(folder, capsys, tmp_path):
    for sid, make in GOOD.items():
        for args in (["show"], ["show", "--json"], ["export"], ["export", "-f", "json"]):
            rc, out, err = _run(capsys, "sessions", args[0], sid, *args[1:])
            assert rc == 0 and err == "", (sid, args, err)
            assert _inert(out), (sid, args)
            if args[-1] == "json" or args[-1] == "--json":  # nothing lost
                assert session_from_dict(json.loads(out)) == session_from_dict(make())
        rc, out, err = _run(capsys, "sessions", "export", sid, "-o", str(tmp_path / f"{sid}.md"))
        assert rc == 0 and _inert((tmp_path / f"{sid}.md").read_text(encoding="utf-8"))
    for name in BAD:
        for args in (["sessions", "show"], ["sessions", "export"], ["replay"]):
            rc, out, err = _run(capsys, *args, str(folder / name))
            assert rc == 1 and out == "", (name, args)
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("dflash-tui: ") and _inert(err), (name, args, err)


def test_cli_sessions_search_over_the_hostile_folder(folder, capsys):
    """Search reads the index: the good sessions are found, every bad file is named as skipped, all inert."""
    rc, out, err = _run(capsys, "sessions", "search", "pwned")
    assert rc == 0 and _inert(out) and _inert(err)
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == ["evil-text"]
    assert len([line for line in err.splitlines() if line.startswith("skipped ")]) == len(BAD)
    for text in ("[/]", '"', "hi AND NOT x", "\x1b]0;", "*"):  # markup, FTS syntax, escapes: all just text
        rc, out, err = _run(capsys, "sessions", "search", text)
        assert rc in (0, 1) and _inert(out) and _inert(err) and "Traceback" not in err, text


@pytest.mark.parametrize("buffered", [True, False])
def test_cli_list_into_a_closed_pipe_ends_with_one_line(folder, buffered):
    """`sessions list | head -0`: the reader is gone before the output comes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "dflash_tui", "sessions", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    proc.stdout.close()  # before the child writes a byte
    err = proc.stderr.read().decode()
    assert proc.wait(60) != 0
    assert "Traceback" not in err and "Exception ignored" not in err
    assert "dflash-tui: output closed early (broken pipe)" in err.splitlines()


def test_stale_temp_files_of_killed_saves_are_swept(folder):
    store = SessionStore(folder)
    stale, fresh, foreign = folder / ".good.k2j4h5g6.tmp", folder / ".good.a1b2c3d4.tmp", folder / ".notes.tmp"
    for path in (stale, fresh, foreign):
        path.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(foreign, (old, old))
    store.list()
    assert not stale.exists() and fresh.exists() and foreign.exists()
    os.utime(fresh, (old, old))
    store.save(store.load("good"))  # a save sweeps as well
    assert not fresh.exists() and foreign.exists()


# -- the TUI ----------------------------------------------------------------------------------------
def _screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@pytest.mark.anyio
async def test_replay_of_a_session_full_of_escapes_shows_them_inert():
    from dflash_tui.ui.replay_screen import ReplayApp, ReplayScreen

    for make in (_evil_text, _markup):
        app = ReplayApp(session_from_dict(make()), speed=float("inf"))
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, ReplayScreen)
            await pilot.pause(0.3)
            assert screen.player.finished
            text = _screen_text(app)
            assert _inert(text)
            assert "replay · " + ("osc ␛]52" if make is _evil_text else "[/] hi") in text


async def _one_turn(app, pilot, text: str) -> None:
    """A reply to `text` through the Messages the engine worker posts (the trace of the fixture session)."""
    from dflash_tui.engine.events import Block, event_from_dict
    from dflash_tui.session_trace import without_time
    from dflash_tui.ui import messages as msg

    session = _base()
    decoder = {int(k): v for k, v in session["token_text"].items()}
    events = [event_from_dict(without_time(e)) for e in session["messages"][2]["trace"]]
    app.post_message(msg.EngineReady(session["target"], session["draft"], "cpu", 16, decoder.get, 0.1))
    await pilot.pause()
    app.start_turn(text)
    turn = app.turn_id
    app.post_message(msg.TurnPrefill(turn, events[0]))
    app.post_message(msg.TurnBlocks(turn, [e for e in events if isinstance(e, Block)], 0.1))
    app.post_message(msg.TurnDone(turn, events[-1], []))
    while app.generating:
        await pilot.pause(0.05)


@pytest.mark.anyio
async def test_markup_as_the_first_message_then_ctrl_o_over_the_hostile_folder(folder):
    """Type `[/] hi`, get the reply, press ctrl+o: the sessions screen lists it and the good files, names the bad."""
    from textual.widgets import DataTable

    from dflash_tui.ui.app import DFlashApp
    from dflash_tui.ui.replay_screen import ReplayScreen
    from dflash_tui.ui.sessions_screen import SessionsScreen

    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await _one_turn(app, pilot, "[/] hi")
        saved = app.session.id
        await pilot.press("ctrl+o")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, SessionsScreen)
        table = screen.query_one(DataTable)
        ids = [s.id for s in screen.summaries]
        assert sorted(ids) == sorted([*GOOD, saved])
        cells = [str(c) for row in range(table.row_count) for c in table.get_row_at(row)]
        assert "[/] hi" in cells and all(_inert(c) for c in cells)
        problems = str(screen.query_one("#sessions-problems").render())
        assert all(_shown(name) in problems for name in BAD) and _inert(problems)
        assert _inert(_screen_text(app))
        table.move_cursor(row=ids.index(saved))
        await pilot.press("r")  # replay the session whose first message is markup
        await pilot.pause(0.3)
        assert isinstance(app.screen, ReplayScreen)
        await pilot.press("i")
        await pilot.pause(0.3)
        assert app.screen.player.finished and _inert(_screen_text(app))
