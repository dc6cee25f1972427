"""Session files: one JSON file per conversation, saved atomically, listed and searched through an index.

A session file is data only. Loading one parses JSON and checks every field;
nothing in it is executed, and its id is checked before it becomes a file name,
so a file from someone else cannot make the app read or write elsewhere.
Files that cannot be read (corrupt, truncated, foreign, from a newer version)
are reported by name and left exactly as they are. Listing and searching go
through an SQLite index beside the files (session_index), rebuilt from them
whenever it is lost or wrong; a session is found by any unique prefix of its id.

The records (Session, its message tree, summaries) are in session_record and
session_tree, exports in session_export; this module re-exports their names.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from dflash_tui.files import Refused, atomic_write, read_regular_file, sweep_stale_temps, write_new_file
from dflash_tui.session_export import export_text, to_json, to_markdown
from dflash_tui.session_index import SearchHit, SessionIndex
from dflash_tui.session_record import (
    MAX_FILE_BYTES,
    Session,
    SessionError,
    SessionSummary,
    first_prefill,
    make_title,
    new_id,
    now_iso,
    read_session,
    reply_summary,
    session_from_dict,
    valid_id,
)
from dflash_tui.session_schema import FORMAT, ROLES, SCHEMA_VERSION
from dflash_tui.session_trace import TraceRecorder, timed_trace
from dflash_tui.session_tree import Message

__all__ = ["FORMAT", "ROLES", "SCHEMA_VERSION", "Message", "SearchHit", "Session", "SessionError", "SessionStore",
           "SessionSummary", "StoreUnusable", "TraceRecorder", "export_text", "first_prefill", "make_title",
           "read_session", "reply_summary", "session_from_dict", "timed_trace", "to_json", "to_markdown"]


MAX_EXPORTS = 999  # numbered exports of one session (and part) in the exports folder

# -- the store ---------------------------------------------------------------------
def default_root() -> Path:
    from dflash_tui.config import data_dir  # $DFLASH_TUI_DATA_DIR or the platform's user data dir

    return data_dir() / "sessions"


class StoreUnusable(SessionError):
    """The sessions folder cannot be used: a file where it (or a folder above it) should be, or unreadable."""


def folder_problem(root: Path) -> Optional[str]:
    """Why `root` cannot hold sessions, or None (a folder not made yet is fine: the first save makes it)."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        above = next((p for p in reversed(root.parents) if p.exists() and not p.is_dir()), root.parent)
        return f"{above} is not a folder"
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if not os.access(root, os.R_OK | os.X_OK):
        return "it cannot be read (permission denied)"
    return None


def _stamp(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _given(text: str) -> None:
    """An empty name is no session (as a path it would be the current folder): one line saying so."""
    if not text.strip():
        raise SessionError("no session given: name one by its id, a unique prefix of one, or a path to its file")


class SessionStore:
    """The sessions directory. Several processes may use it at once."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def check(self) -> None:
        """Raise StoreUnusable, one line saying why, when the folder cannot hold sessions. `list` and `search`
        do not call it (they find nothing there); looking a session up by id does."""
        problem = folder_problem(self.root)
        if problem is not None:
            raise StoreUnusable(f"cannot use the sessions folder {self.root}: {problem}")

    def path_for(self, session_id: str) -> Path:
        if not valid_id(session_id):
            raise SessionError(f"not a session id: {session_id!r}")
        return self.root / f"{session_id}.json"

    def new(self, target: str, draft: Optional[str], settings: dict[str, Any], device: Optional[str] = None,
            decoder: Optional[Callable[[int], str]] = None, server: Optional[str] = None) -> Session:
        """A session not yet on disk. `decoder` (token id -> text) lets replies record their tokens' text;
        `server`: the remote engine's URL (never its key)."""
        stamp = now_iso()
        return Session(id=new_id(), title="", created=stamp, updated=stamp, target=target, draft=draft,
                       settings=dict(settings), device=device, decoder=decoder, server=server)

    # -- writing ---------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise check-then-write between processes (an advisory lock on the directory)."""
        try:
            import fcntl
        except ImportError:  # no flock here: unique ids and atomic replaces still hold
            yield
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _ours(self, path: Path, session: Session) -> bool:
        """May `session` replace what is at `path`? Only the revision it last saved or loaded."""
        stamp = _stamp(path)
        if stamp is None:
            return True
        if stamp == session._stamp:
            return True
        try:
            data = json.loads(read_regular_file(path, MAX_FILE_BYTES).decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            return False  # unreadable, or not a regular file: never overwrite it
        return isinstance(data, dict) and data.get("format") == FORMAT and data.get("id") == session.id \
            and data.get("revision") == session.revision and session.revision > 0

    def save(self, session: Session) -> Path:
        """Write atomically; raises OSError (the caller keeps the conversation in memory).

        If another process saved this session since we last did (or a foreign
        file has its name), the session forks to a new id instead of overwriting.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            sweep_stale_temps(self.root)  # what saves killed mid-write left (the lock keeps live ones out)
            path = self.path_for(session.id)
            if not self._ours(path, session):
                session.id = new_id()
                session.revision = 0
                path = self.path_for(session.id)
            updated, revision = now_iso(), session.revision + 1
            data = session.to_dict()
            data.update(updated=updated, revision=revision)
            try:
                payload = json.dumps(data, ensure_ascii=False, indent=1, allow_nan=False).encode("utf-8")
            except (TypeError, ValueError) as exc:
                raise OSError(f"session {session.id} cannot be written as JSON: {exc}") from None
            atomic_write(path, payload)
            session.updated, session.revision = updated, revision
            session.path, session._stamp = path, _stamp(path)
        return path

    # -- reading ---------------------------------------------------------------
    def ids_starting(self, prefix: str) -> list[str]:
        """Ids of the session files in the store whose id starts with `prefix` (by file name: nothing read)."""
        try:
            with os.scandir(self.root) as entries:
                stems = [e.name[:-5] for e in entries if e.name.endswith(".json") and e.name.startswith(prefix)]
        except OSError:
            return []
        return sorted(stem for stem in stems if valid_id(stem))

    def resolve_id(self, text: str) -> str:
        """The id of the one session whose id is `text` or starts with it; SessionError otherwise."""
        _given(text)
        if not valid_id(text):
            raise SessionError(f"not a session id: {text!r}")
        self.check()
        if (self.root / f"{text}.json").is_file():
            return text
        found = self.ids_starting(text)
        if len(found) > 1:  # only then read them: files that `list` skips are no candidates
            found = self._readable_ids(text) or found
        if len(found) == 1:
            return found[0]
        if not found:
            raise SessionError(f"no session {text!r} in {self.root}")
        shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
        raise SessionError(f"{len(found)} sessions start with {text!r} ({shown}): give more of the id")

    def _readable_ids(self, prefix: str) -> list[str]:
        index = SessionIndex(self.root)
        return self._index(lambda conn: index.ids_starting(conn, prefix)) or []

    def resolve(self, id_or_path: Union[str, Path]) -> Path:
        """A session id in this store, or a unique prefix of one, or a path to a session file (read only)."""
        text = str(id_or_path)
        _given(text)
        if valid_id(text) and not Path(text).exists():
            return self.path_for(self.resolve_id(text))
        if valid_id(text) and (self.root / f"{text}.json").is_file():
            return self.root / f"{text}.json"
        path = Path(text).expanduser()
        if not path.exists():
            if path.is_symlink():  # a link to nothing, or a loop: nothing here reads or deletes it
                raise SessionError(f"{path.name}: a link that leads to no session file; left as it is")
            raise SessionError(f"no such session file: {text}")
        if not path.is_file():
            raise SessionError(f"not a session file: {text}")
        return path

    def load(self, id_or_path: Union[str, Path]) -> Session:
        path = self.resolve(id_or_path)
        session = read_session(path)
        inside = path.resolve().parent == self.root.resolve() if self.root.exists() else False
        if inside and path.stem != session.id:
            raise SessionError(f"{path.name}: its id is {session.id!r}, not its file name")
        session._stamp = _stamp(path) if inside else None
        if not inside:
            session.path = None  # a shared file: saving goes into the store, never back to it
        return session

    def _index(self, use: Callable[[Any], Any], refresh: bool = True) -> Any:
        if not self.root.is_dir():
            return None
        if refresh:
            sweep_stale_temps(self.root)
        return SessionIndex(self.root).read(use, refresh)

    def list(self) -> tuple[list[SessionSummary], list[str]]:
        """Summaries, newest first, and one line per file that could not be read (from the index, brought
        up to date with the folder first)."""
        index = SessionIndex(self.root)
        found = self._index(lambda conn: (index.summaries(conn), index.problems(conn)))
        return found if found is not None else ([], [])

    def search(self, text: str, refresh: bool = True, snippets: int = 0) -> tuple[list[SearchHit], list[str]]:
        """Sessions whose title or messages (every branch) hold every word of `text`, newest first, and the
        files that could not be read. `refresh=False`: the index as the last use left it (a filter as you
        type); the first `snippets` hits come with the text around the match."""
        index = SessionIndex(self.root)
        found = self._index(lambda conn: (index.search(conn, text, snippets), index.problems(conn)), refresh)
        return found if found is not None else ([], [])

    def delete(self, session_id: str) -> Path:
        """Remove a session (its full id). Only a file that reads as a valid session is removed."""
        path = self.path_for(session_id)
        if not path.is_file():
            self.check()
            raise SessionError(f"no session {session_id!r} in {self.root}")
        session = read_session(path)  # raises for a broken or foreign file: those are left alone
        if session.id != session_id:
            raise SessionError(f"{path.name}: its id is {session.id!r}, not its file name; left as it is")
        path.unlink()
        return path

    def rename(self, session_id: str, title: str) -> Session:
        session = self.load(session_id)
        session.title = make_title(title) if title.strip() else session.title
        self.save(session)
        return session

    def export(self, session: Session, fmt: str, dest: Optional[Path] = None, message: Optional[str] = None,
               branch: Optional[str] = None) -> Path:
        """Write a Markdown or JSON export (see session_export); default under the data dir's `exports/`
        (made if need be; beside an earlier export of the same, `-2`, `-3`, ...: never over one, which the
        user may have edited). A `dest` given must be a new file in a folder that exists, or a folder, where it
        goes as in `exports/`: files.Refused (an OSError) otherwise."""
        payload = export_text(session, fmt, message=message, branch=branch).encode("utf-8")
        folder = Path(dest).expanduser() if dest is not None else self.root.parent / "exports"
        if dest is not None and not folder.is_dir():
            write_new_file(folder, payload)
            return folder
        part = message or branch
        suffix = f"-{part}" if part and valid_id(part) else ""
        ext = "json" if fmt == "json" else "md"
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(1, MAX_EXPORTS + 1):
            dest = folder / f"{session.id}{suffix}{'' if n == 1 else f'-{n}'}.{ext}"
            try:
                write_new_file(dest, payload)
                return dest
            except Refused:
                if not os.path.lexists(dest):
                    raise  # not a name taken: the folder itself is the problem
        raise Refused(f"{MAX_EXPORTS} exports of this session already in {folder}: move some away")
