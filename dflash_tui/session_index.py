"""An index of a sessions folder in SQLite, so that listing and searching do not parse every file.

The JSON files stay the truth. The index (`.index.sqlite3` beside them) holds
each file's stamp (inode, size, modification time) and, for a file that reads
as a valid session, its summary and its text (an FTS5 table: the title and
every message of every branch); for a file that does not, the reason. Each
use compares the folder with the stamps and reads only what changed, so a
file enters the index only through the same checks as a load: a hostile file
is a problem line, never a row.

The index holds every message, so it and SQLite's side files (journal, WAL)
are private to their owner (0600) like the sessions: made so before SQLite
opens it, and an older, wider one narrowed.

A corrupt or foreign index file is deleted and rebuilt, and so is one built
under other checks: the index records a digest of the source of the modules
that decide what a file may hold and what its row says (CHECK_MODULES), so a
release that makes the checks stricter (or looser) rebuilds it without anyone
bumping INDEX_VERSION. One that is not a regular file is left alone. Where
the index cannot be written (a read-only folder, a lock held too long) it is
built in memory (from the file on disk when that can be read) and nothing is
written. Several instances may share one index: SQLite's locks serialise
their writes, and each writes only what it read itself.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import marshal
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar

from dflash_tui.model_names import model_label
from dflash_tui.session_record import Session, SessionError, SessionSummary, read_session
from dflash_tui.session_schema import SCHEMA_VERSION

INDEX_NAME = ".index.sqlite3"
INDEX_VERSION = "1"  # the layout of the tables; what the checks accept is followed by checks_version()
# what decides whether a file is a row and what the row holds: its checks, its migrations, its summary, this module
CHECK_MODULES = ("dflash_tui.session_schema", "dflash_tui.session_tree", "dflash_tui.session_trace",
                 "dflash_tui.session_record", "dflash_tui.session_index")
CHUNK = 256  # files read between two writes: a long first build shows progress to other instances
BUSY_TIMEOUT_S = 5.0
MAX_SQL_INT = 2**63 - 1
SIDE_FILES = ("-journal", "-wal", "-shm")  # what SQLite may keep beside the index file

_TABLES = {
    "meta": "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT",
    "files": "CREATE TABLE files (name BLOB PRIMARY KEY, stamp TEXT NOT NULL, problem TEXT) STRICT",
    "sessions": ("CREATE TABLE sessions (id TEXT PRIMARY KEY, title TEXT NOT NULL, target TEXT NOT NULL, draft TEXT, "
                 "created TEXT NOT NULL, updated TEXT NOT NULL, messages INTEGER NOT NULL, turns INTEGER NOT NULL, "
                 "branches INTEGER NOT NULL, generated_tokens INTEGER NOT NULL, tokens_per_cycle REAL) STRICT"),
    "sessions_by_time": "CREATE INDEX sessions_by_time ON sessions (updated DESC, id DESC)",
    "texts": "CREATE VIRTUAL TABLE texts USING fts5(title, body, tokenize = 'unicode61 remove_diacritics 2')",
}
_FTS_SHADOWS = {f"texts_{s}" for s in ("data", "idx", "content", "docsize", "config")}
_COLUMNS = ("id, title, target, draft, created, updated, messages, turns, branches, generated_tokens, "
            "tokens_per_cycle")
# rows whose values are not of their column's kind (STRICT tables keep them out; a file made by hand might not)
_BAD_ROWS = ("SELECT count(*) FROM sessions WHERE typeof(id) != 'text' OR typeof(title) != 'text' "
             "OR typeof(target) != 'text' OR typeof(draft) NOT IN ('text', 'null') OR typeof(created) != 'text' "
             "OR typeof(updated) != 'text' OR typeof(messages) != 'integer' OR typeof(turns) != 'integer' "
             "OR typeof(branches) != 'integer' OR typeof(generated_tokens) != 'integer' "
             "OR typeof(tokens_per_cycle) NOT IN ('real', 'null')")


T = TypeVar("T")


class IndexUnusable(Exception):
    """The index file cannot be used as it is (corrupt, foreign, or an older layout)."""


# What a damaged index raises: SQLite reports some corrupt full-text data as out of memory (a length read
# from garbage), which Python raises as MemoryError. The index is derived data, so it is built again.
_BROKEN = (IndexUnusable, sqlite3.DatabaseError, MemoryError)


@dataclass
class SearchHit:
    summary: SessionSummary
    snippet: str  # text around the match ("" when only the title matched)


@dataclass
class _Read:
    name: str
    stamp: str
    session: Optional[Session] = None
    problem: Optional[str] = None


def fts_query(text: str) -> Optional[str]:
    """Every word of `text` as a quoted prefix term (FTS5 syntax in it is data); None when no word has a
    letter or digit."""
    terms = ['"' + w.replace('"', '""') + '"*' for w in text.split() if any(ch.isalnum() for ch in w)]
    return " AND ".join(terms) or None


def _stamp(entry: os.DirEntry) -> str:
    try:
        st = entry.stat()  # follows a link: what would be read
    except OSError as exc:
        return f"unstatable {exc.errno}"
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{stat.S_IFMT(st.st_mode)}"


def _blob(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")  # a file name need not be UTF-8


def _text(value: str) -> str:
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class SessionIndex:
    """The index of one sessions folder; `open()` gives a connection brought up to date with the folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / INDEX_NAME
        self.in_memory = False  # True after a use that could not write the index file

    # -- connections -------------------------------------------------------------------
    def read(self, use: Callable[[sqlite3.Connection], T], refresh: bool = True) -> T:
        """`use(connection)` on the index, first brought up to date with the folder (unless not `refresh`).
        An index found corrupt on the way is deleted and built again; failing that, built in memory."""
        self.in_memory = False
        try:
            return self._read_with(self._connect(), use, refresh)
        except _BROKEN as exc:
            if isinstance(exc, sqlite3.OperationalError) and not _is_corrupt(exc):
                return self._read_with(self._memory(), use, refresh)
        if self._remove_index():
            try:
                return self._read_with(self._connect(), use, refresh)
            except _BROKEN:
                pass
        return self._read_with(self._memory(from_disk=False), use, True)

    def _read_with(self, conn: sqlite3.Connection, use: Callable[[sqlite3.Connection], T], refresh: bool) -> T:
        try:
            if refresh or self.in_memory:  # an index in memory starts from the file's (or nothing) each time
                try:
                    self._refresh(conn)
                except sqlite3.OperationalError as exc:  # read-only, or locked past the timeout: in memory
                    if _is_corrupt(exc) or self.in_memory:
                        raise
                    conn.close()
                    conn = self._memory()
                    self._refresh(conn)
            return use(conn)
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        try:
            st: Optional[os.stat_result] = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        except OSError:
            return self._memory()
        if st is not None and not stat.S_ISREG(st.st_mode):
            return self._memory(from_disk=False)  # a link, fifo or folder under our name: never opened
        if st is None:
            _create_private(self.path)
        for path in (self.path, *(Path(f"{self.path}{side}") for side in SIDE_FILES)):
            _make_private(path)
        for attempt in (1, 2):
            conn: Optional[sqlite3.Connection] = None
            try:
                conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                self._prepare(conn)
                return conn
            except _BROKEN as exc:
                if conn is not None:
                    conn.close()
                if isinstance(exc, sqlite3.OperationalError) and not _is_corrupt(exc):
                    return self._memory()  # cannot write here (read-only) or locked
                if attempt == 2 or not self._remove_index():
                    return self._memory(from_disk=False)
        return self._memory(from_disk=False)

    def _remove_index(self) -> bool:
        """Delete a corrupt index file (and its journal): derived data, rebuilt from the sessions."""
        for path in (self.path, self.path.with_name(INDEX_NAME + "-journal")):
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True

    def _memory(self, from_disk: bool = True) -> sqlite3.Connection:
        """An index in memory: a copy of the file's when it can be read and trusted, else empty."""
        self.in_memory = True
        conn = sqlite3.connect(":memory:", isolation_level=None)
        if from_disk and self.path.is_file() and not self.path.is_symlink():
            try:
                disk = sqlite3.connect(self.path.absolute().as_uri() + "?mode=ro", uri=True, timeout=1.0)
                try:
                    _check_layout(disk)
                    disk.backup(conn)
                finally:
                    disk.close()
                self._prepare(conn)
                return conn
            except _BROKEN:
                conn.close()
                conn = sqlite3.connect(":memory:", isolation_level=None)
        self._prepare(conn)
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Our tables, as we made them, in this version; created when the file is new."""
        conn.execute("PRAGMA trusted_schema = OFF")
        empty = "SELECT count(*) FROM sqlite_master"
        if conn.execute(empty).fetchone() == (0,):
            with _writing(conn):
                if conn.execute(empty).fetchone() == (0,):  # not made by another instance in the meantime
                    for sql in _TABLES.values():
                        conn.execute(sql)
                    conn.executemany("INSERT INTO meta VALUES (?, ?)", _meta().items())
        _check_layout(conn)

    # -- bringing it up to date --------------------------------------------------------
    def _scan(self) -> dict[str, str]:
        """Every `*.json` in the folder (not a save in progress) -> its stamp."""
        try:
            with os.scandir(self.root) as entries:
                return {e.name: _stamp(e) for e in entries if e.name.endswith(".json") and not e.name.startswith(".")}
        except OSError:
            return {}

    def _read(self, name: str, stamp: str) -> _Read:
        path = self.root / name
        try:
            session = read_session(path)
            if path.stem != session.id:
                raise SessionError(f"{name}: its id is {session.id!r}, not its file name")
            return _Read(name, stamp, session=session)
        except SessionError as exc:
            return _Read(name, stamp, problem=str(exc))
        except (TypeError, ValueError, ArithmeticError, KeyError, IndexError) as exc:  # a check missed something
            return _Read(name, stamp, problem=f"{name}: cannot be summarised ({type(exc).__name__})")

    def _refresh(self, conn: sqlite3.Connection) -> None:
        current = self._scan()
        known = {bytes(name).decode("utf-8", "surrogateescape"): stamp
                 for name, stamp in conn.execute("SELECT name, stamp FROM files")}
        gone = sorted(known.keys() - current.keys())
        changed = sorted(name for name, stamp in current.items() if known.get(name) != stamp)
        for start in range(0, len(changed), CHUNK):
            reads = [self._read(name, current[name]) for name in changed[start:start + CHUNK]]  # no lock held
            with _writing(conn):
                for r in reads:
                    self._put(conn, r)
        if gone:
            with _writing(conn):
                for name in gone:
                    self._drop(conn, name)

    def _drop(self, conn: sqlite3.Connection, name: str) -> None:
        conn.execute("DELETE FROM files WHERE name = ?", (_blob(name),))
        stem = name[:-len(".json")]
        row = conn.execute("SELECT rowid FROM sessions WHERE id = ?", (stem,)).fetchone()
        if row is not None:
            conn.execute("DELETE FROM sessions WHERE rowid = ?", row)
            conn.execute("DELETE FROM texts WHERE rowid = ?", row)

    def _put(self, conn: sqlite3.Connection, r: _Read) -> None:
        self._drop(conn, r.name)
        conn.execute("INSERT INTO files VALUES (?, ?, ?)", (_blob(r.name), r.stamp,
                                                            _text(r.problem) if r.problem is not None else None))
        s = r.session
        if s is None:
            return
        summary = SessionSummary.of(s)
        cur = conn.execute(f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (s.id, s.title, s.target, s.draft, s.created, s.updated, summary.messages, summary.turns,
                            summary.branches, min(summary.generated_tokens, MAX_SQL_INT), summary.tokens_per_cycle))
        body = "\n".join(m.content for m in s.tree.nodes.values())
        conn.execute("INSERT INTO texts (rowid, title, body) VALUES (?, ?, ?)", (cur.lastrowid, s.title, body))

    # -- reading -------------------------------------------------------------------------
    def summaries(self, conn: sqlite3.Connection) -> list[SessionSummary]:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM sessions ORDER BY updated DESC, id DESC")
        return self._summaries(rows)

    def ids_starting(self, conn: sqlite3.Connection, prefix: str) -> list[str]:
        """Ids of the sessions (files that read as valid ones) whose id starts with `prefix`."""
        rows = conn.execute("SELECT id FROM sessions WHERE substr(id, 1, ?) = ? ORDER BY id", (len(prefix), prefix))
        return [sid for (sid,) in rows]

    def problems(self, conn: sqlite3.Connection) -> list[str]:
        return [p for (p,) in conn.execute("SELECT problem FROM files WHERE problem IS NOT NULL ORDER BY name")]

    def search(self, conn: sqlite3.Connection, text: str, snippets: int = 0) -> list[SearchHit]:
        """Sessions whose title or any message holds every word of `text` (as a word prefix, case and
        accents ignored), newest first; text with no letter or digit is looked for as it is. The first
        `snippets` hits get the text around the match (the rest ""): a snippet costs a read of the text."""
        columns = ", ".join(f"s.{c.strip()}" for c in _COLUMNS.split(","))
        join = f"SELECT {columns} FROM texts JOIN sessions s ON s.rowid = texts.rowid"
        order = "ORDER BY s.updated DESC, s.id DESC"
        query = fts_query(text)
        if query is not None:
            summaries = self._summaries(conn.execute(f"{join} WHERE texts MATCH ? {order}", (query,)))
        elif text.strip():
            needle = text.strip()
            rows = conn.execute(f"{join} WHERE instr(texts.title, ?) > 0 OR instr(texts.body, ?) > 0 {order}",
                                (needle, needle))
            summaries = self._summaries(rows)
        else:
            summaries = self.summaries(conn)
        found: dict[str, str] = {}
        first = [s.id for s in summaries[:snippets]]
        if query is not None and first:
            marks = ", ".join("?" * len(first))
            found = dict(conn.execute("SELECT s.id, snippet(texts, 1, '', '', '…', 12) FROM texts JOIN sessions s "
                                      f"ON s.rowid = texts.rowid WHERE texts MATCH ? AND s.id IN ({marks})",
                                      (query, *first)))
        return [SearchHit(s, found.get(s.id) or "") for s in summaries]

    def _summaries(self, rows) -> list[SessionSummary]:
        prefix, labels, out = str(self.root) + os.sep, {}, []
        for (sid, title, target, draft, created, updated, messages, turns, branches, tokens, tpc) in rows:
            label = labels.get(target)
            if label is None:
                label = labels[target] = model_label(target)
            out.append(SessionSummary(sid, title, target, draft, created, updated, messages, turns, tokens, tpc,
                                      prefix + sid + ".json", label, branches))
        return out


def _create_private(path: Path) -> None:
    """An empty index file only its owner can read: SQLite then keeps it (and gives its side files) that mode."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        os.close(os.open(path, flags, 0o600))
    except OSError:  # made by another instance meanwhile, or a read-only folder (the index goes in memory)
        pass


def _make_private(path: Path) -> None:
    """Narrow a regular file that others may read (an index made before this rule) to its owner; never follows
    a link, and leaves alone what it cannot change."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
    except OSError:
        pass
    finally:
        os.close(fd)


def _module_digest(name: str) -> str:
    """A digest of a module's source; where that cannot be read (a build without sources), of its compiled
    code; failing that too, of the app's version (so an upgrade still rebuilds the index)."""
    try:
        module = importlib.import_module(name)
        loader = module.__spec__.loader  # type: ignore[union-attr]
        source = loader.get_source(name)  # type: ignore[union-attr]
        if source is not None:
            return "src:" + hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        code = loader.get_code(name)  # type: ignore[union-attr]
        if code is not None:
            return "code:" + hashlib.sha256(marshal.dumps(code)).hexdigest()
    except Exception:  # a loader without these, an unreadable file: the fallback below
        pass
    from dflash_tui import __version__

    return f"version:{__version__}"


@functools.lru_cache(maxsize=None)
def checks_version(modules: tuple[str, ...] = CHECK_MODULES) -> str:
    """One digest of what every module in `modules` checks and records (see _module_digest)."""
    parts = "\n".join(f"{name}={_module_digest(name)}" for name in modules)
    return hashlib.sha256(parts.encode("utf-8")).hexdigest()[:32]


def _meta() -> dict[str, str]:
    return {"index_version": INDEX_VERSION, "schema_version": str(SCHEMA_VERSION), "checks": checks_version()}


def _check_layout(conn: sqlite3.Connection) -> None:
    """Raise IndexUnusable unless the file holds exactly our tables, as we create them, in this version
    (nothing else: no triggers or views), with our meta."""
    objects = {name: (kind, sql) for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master")}
    for name, sql in _TABLES.items():
        if objects.pop(name, (None, None))[1] != sql:
            raise IndexUnusable(f"{name} is not ours")
    for name, (kind, _sql) in objects.items():
        if not (kind == "table" and name in _FTS_SHADOWS) and not name.startswith("sqlite_autoindex_"):
            raise IndexUnusable(f"an unexpected {kind} {name}")
    if dict(conn.execute("SELECT key, value FROM meta")) != _meta():
        raise IndexUnusable("another version")
    if conn.execute(_BAD_ROWS).fetchone() != (0,):
        raise IndexUnusable("a row of the wrong kind")


def _is_corrupt(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB")


@contextlib.contextmanager
def _writing(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # some errors have rolled it back already
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")

