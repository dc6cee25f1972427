"""Session files: one JSON file per conversation, saved atomically, listed, exported.

A session file is data only. Loading one parses JSON and checks every field;
nothing in it is executed, and its id is checked before it becomes a file name,
so a file from someone else cannot make the app read or write elsewhere.
Files that cannot be read (corrupt, truncated, foreign, from a newer version)
are reported by name and left exactly as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from dflash_tui.engine.events import Done, Event, Prefill, event_from_dict
from dflash_tui.errors import UserError
from dflash_tui.files import TooBig, atomic_write, read_regular_file, sweep_stale_temps
from dflash_tui.printable import one_line, printable, terminal_json
from dflash_tui.session_schema import FORMAT, ROLES, SCHEMA_VERSION, check_session
from dflash_tui.session_trace import TraceRecorder, timed_trace, without_time

__all__ = ["FORMAT", "ROLES", "SCHEMA_VERSION", "Message", "Session", "SessionError", "SessionStore",
           "SessionSummary", "TraceRecorder", "export_text", "make_title", "read_session", "session_from_dict",
           "timed_trace", "to_json", "to_markdown"]

MAX_FILE_BYTES = 64 * 1024 * 1024  # a session is text; anything bigger is not one of ours
TITLE_CHARS = 60
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")


class SessionError(UserError):
    """A session that cannot be found, read or trusted; the message names the file."""


# -- records ---------------------------------------------------------------------
@dataclass
class Message:
    role: str
    content: str
    # assistant replies: the turn's events as dicts, each with "t" = seconds since the turn started
    trace: Optional[list[dict[str, Any]]] = None

    def events(self) -> list[Event]:
        return [event_from_dict(without_time(e)) for e in self.trace or []]

    def done(self) -> Optional[Done]:
        for entry in reversed(self.trace or []):
            if entry.get("type") == "done":
                return event_from_dict(without_time(entry))  # type: ignore[return-value]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content, "trace": self.trace}


@dataclass
class Session:
    id: str
    title: str
    created: str
    updated: str
    target: str
    draft: Optional[str]
    settings: dict[str, Any]
    messages: list[Message] = field(default_factory=list)
    device: Optional[str] = None
    baseline_tps: Optional[float] = None  # target-only tok/s measured in the recorded run
    # id -> text of every token in the traces, so a replay needs no tokenizer
    token_text: dict[int, str] = field(default_factory=dict)
    revision: int = 0  # bumped on every save; a save that finds another revision on disk forks
    schema_version: int = SCHEMA_VERSION
    path: Optional[Path] = field(default=None, compare=False, repr=False)
    # token id -> text, from the loaded tokenizer; add_message uses it to fill token_text
    decoder: Optional[Callable[[int], str]] = field(default=None, compare=False, repr=False)
    _stamp: Optional[tuple[int, int, int]] = field(default=None, compare=False, repr=False)

    def add_message(self, role: str, content: str, trace: Optional[list[dict[str, Any]]] = None,
                    decoder: Optional[Callable[[int], str]] = None) -> Message:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        message = Message(role, content, timed_trace(trace) if trace is not None else None)
        self.messages.append(message)
        if role == "user" and not self.title:
            self.title = make_title(content)
        if message.trace and (decoder or self.decoder):
            self.remember_tokens(decoder or self.decoder, message.trace)  # type: ignore[arg-type]
        return message

    def remember_tokens(self, decoder: Callable[[int], str], trace: Iterable[dict[str, Any]]) -> None:
        for entry in trace:
            for token in list(entry.get("drafted") or []) + list(entry.get("emitted") or []):
                if token not in self.token_text:
                    try:
                        self.token_text[token] = str(decoder(token))
                    except Exception:  # an id the tokenizer does not know: replay shows the id
                        pass

    def decode(self, token: int) -> str:
        """Recorded text of a token id (the acceptance view's decoder in replay)."""
        text = self.token_text.get(token)
        if text is None:
            raise KeyError(token)
        return text

    # -- figures over the whole session (from the recorded Done stats) ---------
    def replies(self) -> list[Message]:
        return [m for m in self.messages if m.role == "assistant"]

    def generated_tokens(self) -> int:
        return sum(int(d.stats.get("generated_tokens", len(d.tokens))) for d in self._dones())

    def tokens_per_cycle(self) -> Optional[float]:
        """Emitted tokens per DFlash cycle over all replies; None with no DFlash cycles."""
        cycles = tokens = 0.0
        for d in self._dones():
            n = d.stats.get("cycles") or 0
            cycles += n
            tokens += (d.stats.get("tokens_per_cycle") or 0.0) * n
        return tokens / cycles if cycles else None

    def _dones(self) -> Iterator[Done]:
        for m in self.replies():
            d = m.done()
            if d is not None:
                yield d

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "target": self.target,
            "draft": self.draft,
            "device": self.device,
            "baseline_tps": self.baseline_tps,
            "settings": self.settings,
            "token_text": {str(k): v for k, v in sorted(self.token_text.items())},
            "revision": self.revision,
            "messages": [m.to_dict() for m in self.messages],
        }


@dataclass
class SessionSummary:
    id: str
    title: str
    target: str
    draft: Optional[str]
    created: str
    updated: str
    messages: int
    turns: int
    generated_tokens: int
    tokens_per_cycle: Optional[float]
    path: str

    @classmethod
    def of(cls, s: Session) -> "SessionSummary":
        return cls(s.id, s.title, s.target, s.draft, s.created, s.updated, len(s.messages), len(s.replies()),
                   s.generated_tokens(), s.tokens_per_cycle(), str(s.path or ""))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# -- small helpers -----------------------------------------------------------------
def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_id() -> str:
    """Sortable by time, unique across processes (random suffix)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def valid_id(text: str) -> bool:
    return bool(_ID.match(text))


def make_title(text: str) -> str:
    line = " ".join(text.split())
    if not line:
        return "untitled"
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


# -- reading and checking ----------------------------------------------------------
def session_from_dict(data: Any, values_checked: bool = False) -> Session:
    """Check (see session_schema) and build a Session; raises ValueError saying what is wrong."""
    data = check_session(data, valid_id, values_checked)
    messages = [Message(m["role"], m["content"], m.get("trace")) for m in data["messages"]]
    return Session(id=data["id"], title=data["title"], created=data["created"], updated=data["updated"],
                   target=data["target"], draft=data.get("draft"), settings=dict(data.get("settings", {})),
                   messages=messages, device=data.get("device"), baseline_tps=data.get("baseline_tps"),
                   token_text={int(k): v for k, v in data.get("token_text", {}).items()},
                   revision=data.get("revision", 0))


# only a \uD800-\uDFFF escape can put a lone surrogate into parsed JSON: without one, no text needs checking
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> None:
    raise _NotFinite(name)


def _read_json(path: Path) -> tuple[Any, bool]:
    """Parsed JSON of a session file, and whether its texts are known valid; raises SessionError naming it
    (read only: nothing is ever changed)."""
    name = path.name
    try:
        raw = read_regular_file(path, MAX_FILE_BYTES)
    except TooBig:
        raise SessionError(f"{name}: too big to be a session (over {MAX_FILE_BYTES} bytes)") from None
    except OSError as exc:
        raise SessionError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant), not _SURROGATE_ESCAPE.search(raw)
    except _NotFinite as exc:
        raise SessionError(f"{name}: a number that is not finite ({exc})") from None
    except UnicodeDecodeError:
        raise SessionError(f"{name}: not text (not UTF-8)") from None
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(raw.rstrip()) - 1
        raise SessionError(f"{name}: {'truncated' if truncated else 'corrupt'} JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise SessionError(f"{name}: corrupt JSON (nested too deep)") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise SessionError(f"{name}: corrupt JSON ({str(exc).split(':')[0]})") from None


def read_session(path: Path) -> Session:
    """Read one file; raises SessionError naming it."""
    data, values_checked = _read_json(path)
    try:
        session = session_from_dict(data, values_checked)
    except ValueError as exc:
        raise SessionError(f"{path.name}: {exc}") from None
    session.path = path
    return session


# -- the store ---------------------------------------------------------------------
def default_root() -> Path:
    from dflash_tui.config import data_dir  # $DFLASH_TUI_DATA_DIR or the platform's user data dir

    return data_dir() / "sessions"


def _stamp(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SessionStore:
    """The sessions directory. Several processes may use it at once."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def path_for(self, session_id: str) -> Path:
        if not valid_id(session_id):
            raise SessionError(f"not a session id: {session_id!r}")
        return self.root / f"{session_id}.json"

    def new(self, target: str, draft: Optional[str], settings: dict[str, Any], device: Optional[str] = None,
            decoder: Optional[Callable[[int], str]] = None) -> Session:
        """A session not yet on disk. `decoder` (token id -> text) lets replies record their tokens' text."""
        stamp = now_iso()
        return Session(id=new_id(), title="", created=stamp, updated=stamp, target=target, draft=draft,
                       settings=dict(settings), device=device, decoder=decoder)

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
    def resolve(self, id_or_path: Union[str, Path]) -> Path:
        """A session id in this store, or a path to a session file (read only)."""
        text = str(id_or_path)
        if valid_id(text):
            path = self.root / f"{text}.json"
            if path.is_file():
                return path
            if not Path(text).exists():
                raise SessionError(f"no session {text!r} in {self.root}")
        path = Path(text).expanduser()
        if not path.exists():
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

    def list(self) -> tuple[list[SessionSummary], list[str]]:
        """Summaries, newest first, and one line per file that could not be read."""
        summaries, problems = [], []
        if not self.root.is_dir():
            return summaries, problems
        sweep_stale_temps(self.root)
        for path in sorted(self.root.glob("*.json")):
            if path.name.startswith("."):
                continue  # a save in progress
            try:
                session = read_session(path)
                if path.stem != session.id:
                    raise SessionError(f"{path.name}: its id is {session.id!r}, not its file name")
                summaries.append(SessionSummary.of(session))
            except SessionError as exc:
                problems.append(str(exc))
            except (TypeError, ValueError, ArithmeticError) as exc:  # a check missed something: skip, never stop
                problems.append(f"{path.name}: cannot be summarised ({type(exc).__name__})")
        summaries.sort(key=lambda s: (s.updated, s.id), reverse=True)
        return summaries, problems

    def delete(self, session_id: str) -> Path:
        """Remove a session. Only a file that reads as a valid session is removed."""
        path = self.path_for(session_id)
        if not path.is_file():
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

    def export(self, session: Session, fmt: str, dest: Optional[Path] = None) -> Path:
        """Write a Markdown or JSON export; default under the data dir's `exports/`."""
        text = export_text(session, fmt)
        if dest is None:
            dest = self.root.parent / "exports" / f"{session.id}.{'json' if fmt == 'json' else 'md'}"
        dest = Path(dest).expanduser()
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, text.encode("utf-8"))
        return dest


# -- export --------------------------------------------------------------------------
def reply_summary(done: Optional[Done]) -> str:
    """One line of figures for a reply: tokens, tokens per cycle, acceptance, speed."""
    if done is None:
        return ""
    s = done.stats
    parts = [f"{s.get('generated_tokens', len(done.tokens))} tokens"]
    if s.get("mode") == "dflash":
        parts.append(f"{s.get('tokens_per_cycle', 0.0):.2f} tokens/cycle")
        parts.append(f"acceptance {100 * s.get('acceptance', 0.0):.0f}%")
    elif s.get("mode") == "baseline":
        parts.append("target only")
    if s.get("decode_tps"):
        parts.append(f"{s['decode_tps']:.1f} tok/s")
    if done.finish_reason == "cancelled":
        parts.append("stopped")
    return " · ".join(parts)


def to_markdown(session: Session) -> str:
    """A readable export; control characters in the data are shown as pictures, never written raw."""
    lines = [f"# {one_line(session.title or 'untitled')}", ""]
    lines.append(f"- target: `{one_line(session.target)}`")
    lines.append(f"- draft: `{one_line(session.draft)}`" if session.draft else "- draft: none (target only)")
    lines.append(f"- created: {session.created} · updated: {session.updated}")
    if session.settings:
        lines.append("- settings: " + ", ".join(f"{k} {v}" for k, v in session.settings.items()))
    tpc = session.tokens_per_cycle()
    if tpc is not None:
        lines.append(f"- tokens per cycle over the session: {tpc:.2f}")
    lines.append("")
    names = {"system": "System", "user": "You", "assistant": "Assistant"}
    for m in session.messages:
        lines += [f"## {names[m.role]}", "", m.content, ""]
        figures = reply_summary(m.done()) if m.role == "assistant" else ""
        if figures:
            lines += [f"*{figures}*", ""]
    return printable("\n".join(lines))


def to_json(session: Session) -> str:
    """The session file itself: shareable, and `dflash-tui replay` reads it (DEL and C1 escaped: the same data)."""
    return terminal_json(json.dumps(session.to_dict(), ensure_ascii=False, indent=1, allow_nan=False)) + "\n"


def export_text(session: Session, fmt: str) -> str:
    if fmt in ("markdown", "md"):
        return to_markdown(session)
    if fmt == "json":
        return to_json(session)
    raise ValueError(f"unknown export format {fmt!r} (markdown or json)")


def first_prefill(message: Message) -> Optional[Prefill]:
    for ev in message.events():
        if isinstance(ev, Prefill):
            return ev
    return None
