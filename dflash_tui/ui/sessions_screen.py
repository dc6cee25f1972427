"""Saved sessions: list, search (`/`), open, replay, rename, delete (with confirmation), export.

The screen dismisses with ("open", session) or ("replay", session) for the app
to act on, or None. Files that cannot be read are listed by name below the
table and never touched. `/` filters by title and the full text of every
message (the store's index: as you type, no file is read).
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from dflash_tui.printable import one_line, plain, printable
from dflash_tui.session_record import TITLE_CHARS
from dflash_tui.sessions import Session, SessionError, SessionStore, SessionSummary
from dflash_tui.ui.plain_notify import PlainNotify

Result = Optional[tuple[str, Session]]
PAGE_ROWS = 200  # rows added at a time
MORE_AT = 20  # the next page comes when the cursor is this close to the last row shown
# Column widths, in cells. Figures (dates, counts, tokens/cycle) are as wide as their widest value: never cut.
# The title gives up width first, down to TITLE_MIN; then the model name down to MODEL_MIN; then the
# tokens/cycle header becomes "τ"; then the title again, down to TITLE_FLOOR, and the model name, down to
# MODEL_FLOOR. That is 50 columns: narrower, the table scrolls sideways.
MODEL_MAX = 18
MODEL_MIN = 10
MODEL_FLOOR = 6
TITLE_MIN = 12
TITLE_FLOOR = 6


def local_time(stamp: str) -> str:
    """An ISO time as local 'YYYY-MM-DD HH:MM' (the text itself when it does not parse)."""
    try:
        return datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except (ValueError, OverflowError, OSError):  # year 1 or 9999 in another zone cannot be shown locally
        return stamp


def _tpc(summary: SessionSummary) -> str:
    return f"{summary.tokens_per_cycle:.2f}" if summary.tokens_per_cycle is not None else "—"


def _cell(text: str) -> "Text":
    cell = plain(text)
    cell.no_wrap, cell.overflow = True, "ellipsis"
    return cell


class ConfirmScreen(PlainNotify, ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; background: $background 60%; }
    ConfirmScreen > Vertical { width: 64; max-width: 90%; height: auto; border: round $error; background: $surface; padding: 1 2; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    ConfirmScreen Button { margin-left: 1; }
    """

    def __init__(self, question: str, yes: str = "Delete (y)", no: str = "Keep (n)") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(printable(self.question), markup=False)
            with Horizontal():
                yield Button(self.yes, variant="error", id="yes")
                yield Button(self.no, id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class RenameScreen(PlainNotify, ModalScreen[Optional[str]]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    RenameScreen { align: center middle; background: $background 60%; }
    RenameScreen > Vertical { width: 70; max-width: 90%; height: auto; border: round $primary; background: $surface; padding: 1 2; }
    RenameScreen Label { color: $text-muted; }
    """

    def __init__(self, title: str) -> None:
        super().__init__()
        self.current = title

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"New title, up to {TITLE_CHARS} characters (Enter saves, Esc cancels)")
            yield Input(one_line(self.current), id="title")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SessionsScreen(PlainNotify, Screen[Result]):
    BINDINGS = [
        # The footer's order: what finds and leaves a session first, so a narrow footer keeps it.
        Binding("o", "open", "Open"),  # Enter on a row opens too (DataTable.RowSelected)
        Binding("r", "replay", "Replay"),
        Binding("slash", "search", "Search"),
        Binding("escape,q", "close", "Close"),
        Binding("e", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("m", "export('markdown')", "Export .md"),
        Binding("j", "export('json')", "Export .json"),
    ]
    DEFAULT_CSS = """
    SessionsScreen { layout: vertical; }
    SessionsScreen #sessions-title { height: 1; padding: 0 1; color: $primary; text-style: bold; }
    SessionsScreen #sessions-where { height: 1; padding: 0 1; color: $text-muted; }
    SessionsScreen #sessions-search { margin: 1 1 0 1; display: none; }
    SessionsScreen #sessions-search.-shown { display: block; }
    SessionsScreen DataTable { height: 1fr; margin: 1 1 0 1; }
    SessionsScreen #sessions-empty { height: 1fr; padding: 1 2; color: $text-muted; }
    SessionsScreen #sessions-problems { height: auto; max-height: 8; padding: 0 1; color: $warning; border-top: hkey $warning 50%; }
    """

    def __init__(self, store: Optional[SessionStore] = None) -> None:
        super().__init__()
        self.store = store or SessionStore()
        self.summaries: list[SessionSummary] = []
        self.problems: list[str] = []
        self.filter = ""  # the search text; "" lists every session

    def compose(self) -> ComposeResult:
        yield Static("Saved sessions", id="sessions-title")
        yield Static(one_line(f"Enter opens · r replays · / searches · {self.store.root}"), id="sessions-where",
                     markup=False)
        yield Input(placeholder="search titles and messages (Enter: to the list, Esc: clear)", id="sessions-search")
        yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)  # columns: _lay_out
        yield Static("No saved sessions yet: every conversation is saved here after each reply.",
                     id="sessions-empty")
        yield Static("", id="sessions-problems", markup=False)
        yield Footer(compact=True, show_command_palette=False)  # eight keys: the palette (ctrl+p) still opens

    def on_mount(self) -> None:
        self._layout: list[tuple[str, str, int]] = []  # (key, label, width) as the table has them
        self.reload()
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        if self.is_mounted:
            self._lay_out()

    def _widths(self) -> list[tuple[str, str, int]]:
        """(key, label, width) of each column for this screen's width and the sessions listed."""
        table = self.table
        styles = table.styles
        # the table's width inside its margin, border and padding, less a vertical scrollbar (reserved always:
        # whether rows overflow is known only after layout) and each column's padding
        room = ((self.size.width or 100) - styles.margin.width - styles.gutter.width
                - styles.scrollbar_size_vertical - 2 * table.cell_padding * 5)
        rows = self.summaries

        def widest(label: str, values) -> int:
            return max([len(label), *(len(v) for v in values)])

        updated = widest("Updated", (local_time(s.updated) for s in rows))
        messages = widest("Msgs", (str(s.messages) for s in rows))
        model_max = min(MODEL_MAX, widest("Model", (one_line(s.model) for s in rows)))
        for tpc_label in ("Tok/cycle", "τ"):
            tpc = widest(tpc_label, (_tpc(s) for s in rows))
            rest = room - updated - messages - tpc
            model = min(model_max, max(MODEL_MIN, rest - TITLE_MIN))
            title = rest - model
            if title >= TITLE_MIN:
                break
        if title < TITLE_FLOOR:  # the model name again, down to MODEL_FLOOR
            model = min(model, max(MODEL_FLOOR, rest - TITLE_FLOOR))
            title = max(TITLE_FLOOR, rest - model)
        return [("title", "Title", title), ("model", "Model", model), ("updated", "Updated", updated),
                ("messages", "Msgs", messages), ("tpc", tpc_label, tpc)]

    def _lay_out(self) -> None:
        """Columns as wide as `_widths` says: the table built again (its rows too) when they change."""
        columns = self._widths()
        if columns == self._layout:
            return
        table = self.table
        shown, cursor = table.row_count, table.cursor_row
        table.clear(columns=True)
        for key, label, width in columns:
            table.add_column(plain(label), width=width, key=key)
        self._layout = columns
        self._add_rows(shown)
        if cursor:
            table.move_cursor(row=cursor)

    @property
    def table(self) -> DataTable:
        return self.query_one(DataTable)

    def reload(self, keep: Optional[str] = None, refresh: bool = True) -> None:
        """Read the directory again (unless not `refresh`: the index as it is), filtered by the search text;
        keep the cursor on `keep` (a session id) when it is still there."""
        if self.filter.strip():
            hits, problems = self.store.search(self.filter, refresh=refresh)
            self.summaries = [h.summary for h in hits]
            self.problems = problems if refresh else self.problems
        else:
            self.summaries, self.problems = self.store.list()
        table = self.table
        table.clear()
        self._lay_out()  # the widest values may have changed
        ids = [s.id for s in self.summaries]
        at = ids.index(keep) if keep in ids else 0
        self._add_rows(at + PAGE_ROWS)
        empty = not self.summaries
        table.display = not empty
        notice = self.query_one("#sessions-empty", Static)
        notice.display = empty
        notice.update(plain(f"No session holds “{self.filter.strip()}”." if self.filter.strip() else
                            "No saved sessions yet: every conversation is saved here after each reply."))
        problems = self.query_one("#sessions-problems", Static)
        problems.display = bool(self.problems)
        if self.problems:
            lines = [f"{len(self.problems)} file(s) skipped (left as they are):"] + [f"  {p}" for p in self.problems]
            problems.update(printable("\n".join(lines)))
        if at:
            table.move_cursor(row=at)

    def _add_rows(self, upto: int) -> None:
        """Rows for the summaries up to `upto` (a page at a time: a table of 10,000 rows takes seconds to fill)."""
        table = self.table
        for s in self.summaries[table.row_count:upto]:
            cells = (one_line(s.title or "untitled"), one_line(s.model), one_line(local_time(s.updated)),
                     str(s.messages), _tpc(s))
            # data as Text: a str cell is parsed as markup, and a title like "[/] hi" would end the app; what does
            # not fit its column (a title, a model name) ends in "…", never silently cut
            table.add_row(*(_cell(c) for c in cells), key=s.id)

    @on(DataTable.RowHighlighted)
    def _more_rows(self, event: DataTable.RowHighlighted) -> None:
        """The cursor near the last row shown: the next page of rows."""
        table = self.table
        if event.cursor_row >= table.row_count - MORE_AT and table.row_count < len(self.summaries):
            self._add_rows(table.row_count + PAGE_ROWS)

    def selected(self) -> Optional[SessionSummary]:
        if not self.summaries:
            return None
        row = self.table.cursor_row
        return self.summaries[row] if 0 <= row < len(self.summaries) else None

    def _load_selected(self) -> Optional[Session]:
        summary = self.selected()
        if summary is None:
            self.notify("No session selected", severity="warning", timeout=2)
            return None
        try:
            return self.store.load(summary.id)
        except SessionError as exc:
            self.notify(str(exc), title="session not loaded", severity="error")
            self.reload()
            return None

    # -- actions -----------------------------------------------------------------------
    def action_open(self) -> None:
        session = self._load_selected()
        if session is not None:
            self.dismiss(("open", session))

    def action_replay(self) -> None:
        session = self._load_selected()
        if session is not None:
            self.dismiss(("replay", session))

    def action_rename(self) -> None:
        summary = self.selected()
        if summary is None:
            return

        def renamed(title: Optional[str]) -> None:
            if not title:
                return
            try:
                session = self.store.rename(summary.id, title)
            except (SessionError, OSError) as exc:
                self.notify(f"not renamed: {exc}", severity="error")
                return
            cut = session.title != " ".join(title.split())  # the store keeps TITLE_CHARS: say so, never silently
            note = f" (cut to {TITLE_CHARS} characters)" if cut else ""
            self.notify(f"Renamed to “{session.title}”{note}", timeout=4 if cut else 2)
            self.reload(keep=session.id)

        self.app.push_screen(RenameScreen(summary.title), renamed)

    def action_delete(self) -> None:
        summary = self.selected()
        if summary is None:
            return

        def answered(yes: Optional[bool]) -> None:
            if not yes:
                return
            try:
                self.store.delete(summary.id)
            except (SessionError, OSError) as exc:
                self.notify(f"not deleted: {exc}", severity="error")
                return
            self.notify(f"Deleted “{summary.title}”", timeout=2)
            self.reload()

        self.app.push_screen(ConfirmScreen(f"Delete “{summary.title}” ({summary.messages} messages)? "
                                           "This cannot be undone."), answered)

    def action_export(self, fmt: str) -> None:
        session = self._load_selected()
        if session is None:
            return
        try:
            path = self.store.export(session, fmt)
        except OSError as exc:
            self.notify(f"could not export: {exc}", severity="error")
            return
        self.notify(f"Exported to {path}", title="export", timeout=6)

    def action_search(self) -> None:
        box = self.query_one("#sessions-search", Input)
        box.add_class("-shown")
        box.focus()

    @on(Input.Changed, "#sessions-search")
    def _search_changed(self, event: Input.Changed) -> None:
        self.filter = event.value
        self.reload(refresh=False)  # the index was brought up to date when the screen opened

    @on(Input.Submitted, "#sessions-search")
    def _search_done(self, event: Input.Submitted) -> None:
        self.table.focus()

    def action_close(self) -> None:
        """Esc: clears a search first, then closes."""
        box = self.query_one("#sessions-search", Input)
        if box.has_class("-shown"):
            box.remove_class("-shown")
            if box.value:
                box.value = ""  # Input.Changed reloads the whole list
            self.table.focus()
            return
        self.dismiss(None)

    @on(DataTable.RowSelected)
    def _row_chosen(self, event: DataTable.RowSelected) -> None:
        self.action_open()
