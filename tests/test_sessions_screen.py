"""The sessions screen, driven with Pilot: list, problems by name, open, replay, rename, delete, export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import DataTable

from fixtures.harness import TRACE_SESSION
from dflash_tui.sessions import SessionStore
from dflash_tui.ui.sessions_screen import ConfirmScreen, RenameScreen, SessionsScreen

pytestmark = pytest.mark.anyio


class Host(App[None]):
    """Pushes the sessions screen and keeps what it dismissed with."""

    def __init__(self, store: SessionStore) -> None:
        super().__init__()
        self.store = store
        self.results: list = []

    def on_mount(self) -> None:
        self.push_screen(SessionsScreen(self.store), self.results.append)


def _store(tmp_path: Path, n: int = 3) -> SessionStore:
    store = SessionStore(tmp_path / "sessions")
    base = json.loads(TRACE_SESSION.read_text())
    for i in range(n):
        data = dict(base, id=f"s{i}", title=f"session number {i}", updated=f"2025-01-0{i + 1}T10:00:00+00:00")
        store.root.mkdir(parents=True, exist_ok=True)
        (store.root / f"s{i}.json").write_text(json.dumps(data))
    return store


async def test_lists_sessions_newest_first_and_problems_by_name(tmp_path):
    store = _store(tmp_path)
    (store.root / "broken.json").write_text("{ nope")
    (store.root / "future.json").write_text(json.dumps({"format": "dflash-tui-session", "schema_version": 99}))
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SessionsScreen)
        table = screen.query_one(DataTable)
        assert table.row_count == 3
        first = [str(cell) for cell in table.get_row_at(0)]  # cells are Text: data, never markup
        assert first[0] == "session number 2" and first[1].startswith("tiny-qwen3") and first[3] == "7"
        assert first[4] == f"{store.load('s2').tokens_per_cycle():.2f}"
        problems = str(screen.query_one("#sessions-problems").render())
        assert "broken.json" in problems and "future.json" in problems and "newer dflash-tui" in problems
    assert (store.root / "broken.json").read_text() == "{ nope"


async def test_enter_opens_and_r_replays(tmp_path):
    store = _store(tmp_path)
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.results[-1][0] == "open" and app.results[-1][1].id == "s1"
        app.push_screen(SessionsScreen(store), app.results.append)
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        what, session = app.results[-1]
        assert what == "replay" and session.id == "s2" and session.messages[2].trace


async def test_rename_and_delete_with_confirmation(tmp_path):
    store = _store(tmp_path)
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, RenameScreen)
        app.screen.query_one("Input").value = ""
        await pilot.press(*"Sorting notes", "enter")
        await pilot.pause()
        assert store.load("s2").title == "Sorting notes"
        table = app.screen.query_one(DataTable)
        assert str(table.get_row_at(table.cursor_row)[0]) == "Sorting notes"  # the cursor stays on it

        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # keep it
        await pilot.pause()
        assert store.path_for("s2").exists()
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert not store.path_for("s2").exists()
        assert app.screen.query_one(DataTable).row_count == 2
        assert sorted(p.name for p in store.root.glob("*.json")) == ["s0.json", "s1.json"]


async def test_exports_markdown_and_json(tmp_path):
    store = _store(tmp_path, n=1)
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("m", "j")
        await pilot.pause()
    md = (tmp_path / "exports" / "s0.md").read_text()
    assert md.startswith("---\ntitle: \"session number 0\"") and "\n# session number 0\n" in md
    assert "## Assistant" in md and "tok/cycle" in md
    assert SessionStore(tmp_path / "x").load(tmp_path / "exports" / "s0.json").id == "s0"


async def test_empty_directory_says_so(tmp_path):
    app = Host(SessionStore(tmp_path / "none"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.screen.query_one("#sessions-empty").display
        assert not app.screen.query_one(DataTable).display
        await pilot.press("escape")
        await pilot.pause()
    assert app.results == [None]


async def test_the_chat_app_replays_a_saved_session_and_comes_back(tmp_path, monkeypatch):
    """ctrl+o in the chat app, r on a session: the replay screen plays it; Esc returns to the chat."""
    from dflash_tui.ui.app import DFlashApp
    from dflash_tui.ui.replay_screen import ReplayScreen

    store = _store(tmp_path, n=1)
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        main = app.screen
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("r")
        await pilot.pause()
        replay = app.screen
        assert isinstance(replay, ReplayScreen) and replay.session.id == "s0"
        await pilot.press("i")
        await pilot.pause(0.5)
        assert replay.player.finished
        assert replay.chat.last_assistant().raw_text == store.load("s0").messages[-1].content
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is main


async def test_slash_searches_titles_and_messages_as_you_type(tmp_path):
    from dflash_tui.demo import demo_target_path

    store = _store(tmp_path)
    s1 = store.load("s1")
    s1.add_message("user", "what about zebras?")
    s1.target = str(demo_target_path())  # the demo pair: its name, not where it is installed
    store.save(s1)
    s0 = store.load("s0")
    s0.title = "Quokka facts"
    store.save(s0)
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = app.screen
        table = screen.query_one(DataTable)
        models = {str(table.get_row_at(r)[0]): str(table.get_row_at(r)[1]) for r in range(table.row_count)}
        assert models["session number 1"] == "demo (offline)" and models["session number 2"].startswith("tiny-qwen3")
        await pilot.press("slash", *"zebra")
        await pilot.pause()
        assert [s.id for s in screen.summaries] == ["s1"] and table.row_count == 1  # a message's text
        await pilot.press(*["backspace"] * 5, *"quokka")
        await pilot.pause()
        assert [s.id for s in screen.summaries] == ["s0"]  # a title; "q" typed here does not close the screen
        await pilot.press(*["backspace"] * 6, *"nothing-like-it")
        await pilot.pause()
        assert screen.summaries == [] and "No session holds" in str(screen.query_one("#sessions-empty").render())
        await pilot.press("escape")  # clears the search
        await pilot.pause()
        assert table.row_count == 3 and app.screen is screen
        await pilot.press("slash", *"zeb", "enter", "enter")  # Enter goes to the list, Enter opens
        await pilot.pause()
    assert app.results[-1][0] == "open" and app.results[-1][1].id == "s1"


async def test_a_long_list_fills_a_page_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr("dflash_tui.ui.sessions_screen.PAGE_ROWS", 4)
    monkeypatch.setattr("dflash_tui.ui.sessions_screen.MORE_AT", 1)
    store = SessionStore(tmp_path / "sessions")
    store.root.mkdir(parents=True)
    base = json.loads(TRACE_SESSION.read_text())
    for i in range(10):
        data = dict(base, id=f"p{i}", title=f"page {i}", updated=f"2025-02-{i + 1:02d}T10:00:00+00:00")
        (store.root / f"p{i}.json").write_text(json.dumps(data))
    app = Host(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        counts = [table.row_count]
        for _ in range(3):
            await pilot.press("ctrl+end")
            await pilot.pause()
            counts.append(table.row_count)
        assert counts == [4, 8, 10, 10] and table.cursor_row == 9
        await pilot.press("enter")
        await pilot.pause()
    assert app.results[-1][1].id == "p0"  # the oldest, reached through the pages


_ROW = re.compile(r"^ +(?P<title>\S.*?) {2,}(?P<model>\S.*?) {2,}(?P<updated>\d{4}-\d\d-\d\d \d\d:\d\d) {2,}"
                  r"(?P<msgs>\d+) {2,}(?P<tpc>\d+\.\d\d|—)(?= |$)")


def _screen_rows(app: App) -> tuple[str, dict[str, re.Match]]:
    """The table as the screen shows it: its header line, and each row's cells by the row's date."""
    lines = [strip.text for strip in app.screen._compositor.render_strips()]
    header = next(line for line in lines if line.lstrip().startswith("Title"))
    rows = {m["updated"]: m for m in map(_ROW.match, lines) if m}
    return header, rows


async def test_a_narrow_terminal_cuts_the_title_never_a_figure(tmp_path):
    """60 columns (and 50), a long title, rows past the screen's height (a scrollbar): every date, count and
    tokens/cycle shows whole; the title gives up width, with an ellipsis; resized while open too."""
    from dflash_tui.ui.sessions_screen import local_time

    store = _store(tmp_path, n=3)
    base = json.loads(TRACE_SESSION.read_text())
    for i in range(20):  # older than s0..s2: below them
        data = dict(base, id=f"x{i}", title=f"older {i}", updated=f"2024-12-{i + 1:02d}T10:00:00+00:00")
        (store.root / f"x{i}.json").write_text(json.dumps(data))
    long = "a very long title about sorting notes and other things worth keeping"[:60]
    s2 = store.load("s2")
    s2.title = long
    store.save(s2)
    summaries, _ = store.list()
    expected = {local_time(s.updated): s for s in summaries}
    app = Host(store)
    async with app.run_test(size=(60, 20)) as pilot:
        for size in [(60, 20), (130, 30), (60, 20), (50, 20)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            header, rows = _screen_rows(app)
            assert header.split()[-1] in ("Tok/cycle", "τ"), (size, header)
            if size[0] >= 100:
                assert header.split()[-1] == "Tok/cycle"
            table = app.screen.query_one(DataTable)
            shown = min(table.row_count, table.scrollable_content_region.height - 1)  # less the header
            assert len(rows) == shown and set(rows) <= set(expected), (size, header, rows)
            for updated, cells in rows.items():
                summary = expected[updated]
                assert cells["tpc"] == f"{summary.tokens_per_cycle:.2f}", (size, cells.group(0))
                assert cells["msgs"] == str(summary.messages)
                title = cells["title"]
                assert title == summary.title or (title.endswith("…") and summary.title.startswith(title[:-1]))
            if size[0] <= 60:
                assert rows[local_time(s2.updated)]["title"].endswith("…")
            else:
                assert rows[local_time(s2.updated)]["title"] == long
