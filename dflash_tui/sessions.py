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
import math
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from dflash_tui.engine.events import Block, Done, Event, Prefill, event_from_dict
from dflash_tui.errors import UserError

FORMAT = "dflash-tui-session"
SCHEMA_VERSION = 2
MAX_FILE_BYTES = 64 * 1024 * 1024  # a session is text; anything bigger is not one of ours
ROLES = ("system", "user", "assistant")
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
        return [event_from_dict(_without_time(e)) for e in self.trace or []]

    def done(self) -> Optional[Done]:
        for entry in reversed(self.trace or []):
            if entry.get("type") == "done":
                return event_from_dict(_without_time(entry))  # type: ignore[return-value]
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


def _without_time(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "t"}


def _cycle_seconds(entry: dict[str, Any]) -> float:
    return sum(float(entry.get(k) or 0.0) for k in ("draft_ms", "verify_ms", "rollback_ms")) / 1000.0


def timed_trace(trace: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copy of a trace where every entry has a non-decreasing "t".

    Entries recorded without one get it from the engine's own timings: prefill
    seconds, then each cycle's draft + verify + rollback time.
    """
    out: list[dict[str, Any]] = []
    t = 0.0
    for entry in trace:
        entry = dict(entry)
        given = entry.get("t")
        if isinstance(given, (int, float)) and not isinstance(given, bool) and math.isfinite(given):
            t = max(t, float(given))
        elif entry.get("type") == "prefill":
            t = max(t, float(entry.get("seconds") or 0.0))
        elif entry.get("type") == "block":
            t += _cycle_seconds(entry)
        elif entry.get("type") == "done":
            stats = entry.get("stats") or {}
            t = max(t, float(stats.get("prefill_s") or 0.0) + float(stats.get("decode_s") or 0.0))
        entry["t"] = round(t, 6)
        out.append(entry)
    return out


class TraceRecorder:
    """Turns the events of one reply into a trace with per-event times.

    Blocks often arrive in batches (the UI coalesces them); a batch that took
    `elapsed_s` is spread over that time in proportion to each cycle's own
    draft + verify + rollback time, so replay shows them one by one again.
    """

    def __init__(self, clock=time.perf_counter) -> None:
        self._clock = clock
        self._start = clock()
        # events as they came, turned into dicts only when the trace is read: while a reply
        # streams, the UI thread does as little as it can
        self._entries: list[tuple[float, Event]] = []

    @property
    def trace(self) -> list[dict[str, Any]]:
        from dflash_tui.engine.events import event_to_dict

        return [{"t": round(t, 6), **event_to_dict(event)} for t, event in self._entries]

    def _now(self, now: Optional[float]) -> float:
        return (self._clock() if now is None else now) - self._start

    def _last_t(self) -> float:
        return self._entries[-1][0] if self._entries else 0.0

    def add(self, event: Event, now: Optional[float] = None) -> None:
        self._entries.append((max(self._last_t(), self._now(now)), event))

    def add_blocks(self, blocks: list[Block], elapsed_s: float, now: Optional[float] = None) -> None:
        end = max(self._last_t(), self._now(now))
        begin = max(self._last_t(), end - max(0.0, elapsed_s))
        weights = [max((b.draft_ms + b.verify_ms + b.rollback_ms) / 1000.0, 1e-6) for b in blocks]
        total, acc = sum(weights), 0.0
        for block, w in zip(blocks, weights):
            acc += w
            self._entries.append((begin + (end - begin) * acc / total, block))


# -- reading and checking ----------------------------------------------------------
def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 (the first layout) nested the pair under "model" and kept untimed "events"."""
    model = data.get("model") or {}
    _check(isinstance(model, dict), "'model' is not an object")
    out = {k: v for k, v in data.items() if k != "model"}
    out.update(target=model.get("target", ""), draft=model.get("draft"), revision=0, schema_version=2)
    messages = []
    for m in data.get("messages") or []:
        _check(isinstance(m, dict), "a message is not an object")
        events = m.get("events")
        messages.append({"role": m.get("role"), "content": m.get("content"),
                         "trace": timed_trace(events) if isinstance(events, list) else None})
    out["messages"] = messages
    return out


MIGRATIONS = {1: _migrate_v1}  # version n -> a dict in version n + 1


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_trace(trace: Any, where: str) -> list[dict[str, Any]]:
    _check(isinstance(trace, list), f"{where}: trace is not a list")
    last = 0.0
    for i, entry in enumerate(trace):
        _check(isinstance(entry, dict), f"{where}: trace entry {i} is not an object")
        t = entry.get("t")
        _check(_number(t) and t >= last - 1e-9, f"{where}: trace entry {i} has a bad time")
        last = t
        try:
            event_from_dict(_without_time(entry))
        except ValueError as exc:
            raise ValueError(f"{where}: trace entry {i}: {exc}") from None
    return trace


def session_from_dict(data: Any) -> Session:
    """Check and build a Session; raises ValueError saying what is wrong."""
    _check(isinstance(data, dict), "not a JSON object")
    _check(data.get("format") == FORMAT, "not a dflash-tui session (foreign JSON)")
    version = data.get("schema_version")
    _check(isinstance(version, int) and not isinstance(version, bool) and version >= 1, "bad schema_version")
    if version > SCHEMA_VERSION:
        raise ValueError(f"written by a newer dflash-tui (schema {version}; this one reads up to {SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    sid = data.get("id")
    _check(isinstance(sid, str) and valid_id(sid), "bad session id")
    for key in ("title", "created", "updated", "target"):
        _check(isinstance(data.get(key), str), f"'{key}' is missing or not text")
    _check(_opt_str(data.get("draft")) and _opt_str(data.get("device")), "'draft'/'device' must be text or null")
    baseline = data.get("baseline_tps")
    _check(baseline is None or (_number(baseline) and baseline > 0), "bad baseline_tps")
    _check(isinstance(data.get("settings", {}), dict), "'settings' is not an object")
    raw_tokens = data.get("token_text", {})
    _check(isinstance(raw_tokens, dict), "'token_text' is not an object")
    token_text = {}
    for key, text in raw_tokens.items():
        _check(isinstance(key, str) and key.isdigit() and isinstance(text, str), "bad 'token_text' entry")
        token_text[int(key)] = text
    revision = data.get("revision", 0)
    _check(isinstance(revision, int) and not isinstance(revision, bool) and revision >= 0, "bad revision")
    raw_messages = data.get("messages")
    _check(isinstance(raw_messages, list), "'messages' is not a list")
    messages = []
    for i, m in enumerate(raw_messages):
        where = f"message {i}"
        _check(isinstance(m, dict), f"{where} is not an object")
        _check(m.get("role") in ROLES, f"{where} has an unknown role")
        _check(isinstance(m.get("content"), str), f"{where} has no text")
        trace = m.get("trace")
        messages.append(Message(m["role"], m["content"], None if trace is None else _check_trace(trace, where)))
    return Session(id=sid, title=data["title"], created=data["created"], updated=data["updated"],
                   target=data["target"], draft=data.get("draft"), settings=dict(data.get("settings", {})),
                   messages=messages, device=data.get("device"), baseline_tps=baseline, token_text=token_text,
                   revision=revision)


def read_session(path: Path) -> Session:
    """Read one file; raises SessionError naming it."""
    name = path.name
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SessionError(f"{name}: too big to be a session ({size} bytes)")
        raw = path.read_bytes()
    except OSError as exc:
        raise SessionError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SessionError(f"{name}: not text (not UTF-8)") from None
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(raw.rstrip()) - 1
        raise SessionError(f"{name}: {'truncated' if truncated else 'corrupt'} JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        session = session_from_dict(data)
    except ValueError as exc:
        raise SessionError(f"{name}: {exc}") from None
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
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError):
            return False  # unreadable: never overwrite it
        return isinstance(data, dict) and data.get("format") == FORMAT and data.get("id") == session.id \
            and data.get("revision") == session.revision and session.revision > 0

    def save(self, session: Session) -> Path:
        """Write atomically; raises OSError (the caller keeps the conversation in memory).

        If another process saved this session since we last did (or a foreign
        file has its name), the session forks to a new id instead of overwriting.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
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
            _atomic_write(path, payload)
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
        for path in sorted(self.root.glob("*.json")):
            if path.name.startswith("."):
                continue  # a save in progress
            try:
                session = read_session(path)
                if path.stem != session.id:
                    raise SessionError(f"{path.name}: its id is {session.id!r}, not its file name")
            except SessionError as exc:
                problems.append(str(exc))
                continue
            summaries.append(SessionSummary.of(session))
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
        _atomic_write(dest, text.encode("utf-8"))
        return dest


def _atomic_write(path: Path, payload: bytes) -> None:
    """Temp file in the same directory + os.replace: a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
    lines = [f"# {session.title or 'untitled'}", ""]
    lines.append(f"- target: `{session.target}`")
    lines.append(f"- draft: `{session.draft}`" if session.draft else "- draft: none (target only)")
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
    return "\n".join(lines)


def to_json(session: Session) -> str:
    """The session file itself: shareable, and `dflash-tui replay` reads it."""
    return json.dumps(session.to_dict(), ensure_ascii=False, indent=1, allow_nan=False) + "\n"


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
