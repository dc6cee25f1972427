"""What `sessions list|search|show` and the sessions screen's rename say: titles as the app cuts them, an empty
name or search refused with one line, a cut title said to be cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import DataTable, Input, Label

from dflash_tui.cli import main
from dflash_tui.session_record import TITLE_CHARS, cut_title, make_title
from dflash_tui.sessions import SessionStore
from dflash_tui.ui.sessions_screen import RenameScreen, SessionsScreen

FIXTURE = Path(__file__).parent / "fixtures" / "trace_session.json"
LONG = "A hand-edited title " + "that goes on " * 230  # about 3,000 characters


@pytest.fixture
def store(tmp_path, monkeypatch) -> SessionStore:
    store = SessionStore(tmp_path / "sessions")
    store.root.mkdir(parents=True)
    for sid, title, text in (("long-1", LONG, "about zebras"), ("short-1", "Sorting", "about lists")):
        data = json.loads(FIXTURE.read_text())
        data.update(id=sid, title=title)
        data["messages"][1]["content"] = text
        (store.root / f"{sid}.json").write_text(json.dumps(data))
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    return store


def test_list_and_search_cut_a_long_title_as_the_app_does(store, capsys):
    assert len(LONG) > 2900
    want = make_title(LONG)  # the app's rule: 60 characters, the last "…"
    assert len(want) <= TITLE_CHARS and want.endswith("…") and cut_title(LONG) == want
    assert main(["sessions", "list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["long-1"].endswith("  " + want) and len(lines["long-1"]) < 160
    assert lines["short-1"].endswith("  Sorting")
    assert main(["sessions", "search", "zebras"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("long-1") and out[0].endswith("  " + want)
    assert main(["sessions", "list", "--json"]) == 0  # the data stays whole
    titles = {s["id"]: s["title"] for s in json.loads(capsys.readouterr().out)["sessions"]}
    assert titles["long-1"] == LONG


@pytest.mark.parametrize("name", ["", "  "])
@pytest.mark.parametrize("action", ["show", "export", "delete"])
def test_an_empty_session_name_is_one_clear_line(store, capsys, action, name):
    assert main(["sessions", action, name, "--yes"] if action == "delete" else ["sessions", action, name]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("dflash-tui: no session given: name one by its id")


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_search_is_refused_with_one_line(store, capsys, text):
    for args in (["sessions", "search", text], ["sessions", "search", text, "--json"]):
        assert main(args) == 2  # a usage error, as argparse's; 1 is "nothing found"
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "give a word to look for" in err and "''" not in err
    assert main(["sessions", "search", "?!"]) == 1  # text with no letter or digit is still looked for as it is


class Host(App[None]):
    def __init__(self, store: SessionStore) -> None:
        super().__init__()
        self.store = store

    def on_mount(self) -> None:
        self.push_screen(SessionsScreen(self.store))


@pytest.mark.anyio
async def test_rename_says_the_limit_and_that_a_long_title_was_cut(store):
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        table.move_cursor(row=[str(table.get_row_at(i)[0]) for i in range(table.row_count)].index("Sorting"))
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, RenameScreen)
        assert f"up to {TITLE_CHARS} characters" in str(app.screen.query_one(Label).render())
        app.screen.query_one(Input).value = ""
        await pilot.press(*"Sorting notes", "enter")
        await pilot.pause()
        assert store.load("short-1").title == "Sorting notes"
        notes = [n.message for n in app._notifications]
        assert notes[-1] == "Renamed to “Sorting notes”"  # nothing cut: nothing said
        await pilot.press("e")
        await pilot.pause()
        typed = "A much longer title " + "x" * 70
        app.screen.query_one(Input).value = typed
        await pilot.press("enter")
        await pilot.pause()
        title = store.load("short-1").title
        assert title == make_title(typed) and len(title) == TITLE_CHARS
        notes = [n.message for n in app._notifications]
        assert notes[-1] == f"Renamed to “{title}” (cut to {TITLE_CHARS} characters)"
