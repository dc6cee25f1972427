"""A session in memory: its messages (a tree; see session_tree), figures and summary, read from a file.

Reading a file parses JSON and checks every field (session_schema); nothing in
it is executed, and a file that fails is named with the reason and never
changed. The store (sessions.py) saves, lists and searches.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from dflash_tui.engine.events import Done, Prefill
from dflash_tui.errors import UserError
from dflash_tui.figure_rules import reply_summary  # noqa: F401 (a reply's figures: sessions and the export read them here)
from dflash_tui.files import TooBig, read_regular_file
from dflash_tui.model_names import model_label
from dflash_tui.session_schema import FORMAT, ROLES, SCHEMA_VERSION, check_session
from dflash_tui.session_trace import timed_trace
from dflash_tui.session_tree import Message, MessageTree, engine_view, system_of

MAX_FILE_BYTES = 64 * 1024 * 1024  # a session is text; anything bigger is not one of ours
TITLE_CHARS = 60
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")


class SessionError(UserError):
    """A session that cannot be found, read or trusted; the message names the file."""


@dataclass
class Session:
    id: str
    title: str
    created: str
    updated: str
    target: str
    draft: Optional[str]
    settings: dict[str, Any]
    tree: MessageTree = field(default_factory=MessageTree)
    device: Optional[str] = None
    server: Optional[str] = None  # a remote engine's URL (no key, user or query: remote/client.public_url)
    baseline_tps: Optional[float] = None  # target-only tok/s measured in the recorded run
    # id -> text of every token in the traces, so a replay needs no tokenizer
    token_text: dict[int, str] = field(default_factory=dict)
    revision: int = 0  # bumped on every save; a save that finds another revision on disk forks
    schema_version: int = SCHEMA_VERSION
    path: Optional[Path] = field(default=None, compare=False, repr=False)
    # token id -> text, from the loaded tokenizer; new replies use it to fill token_text
    decoder: Optional[Callable[[int], str]] = field(default=None, compare=False, repr=False)
    _stamp: Optional[tuple[int, int, int]] = field(default=None, compare=False, repr=False)

    @property
    def messages(self) -> list[Message]:
        """The branch in view, from the top: what the chat shows, replay plays and export writes."""
        return self.tree.branch()

    def conversation(self) -> list[dict[str, str]]:
        """The branch in view as the engine takes it (`Restore`): its cache reuses the common prefix."""
        return engine_view(self.messages)

    def system_prompt(self) -> str:
        """The system prompt in effect at the end of the branch in view ("" for none)."""
        return system_of(self.conversation())

    # -- growing the tree (the API the chat UI calls) --------------------------------
    def add_message(self, role: str, content: str, trace: Optional[list[dict[str, Any]]] = None,
                    decoder: Optional[Callable[[int], str]] = None) -> Message:
        """A message after the last one in view."""
        message = self.tree.append(self._message(role, content, trace, decoder))
        if role == "user" and not self.title:
            self.title = make_title(content)
        return message

    def regenerate_reply(self, content: str, trace: Optional[list[dict[str, Any]]] = None,
                         decoder: Optional[Callable[[int], str]] = None) -> Message:
        """A new reply beside the reply in view (its sibling), now in view; the old one is kept. System
        prompts set after that reply (the new one was written under them) follow the new reply too."""
        branch = self.messages
        trailing = []
        while len(branch) > 1 and branch[-1].role == "system" and branch[-2].role in ("assistant", "system"):
            trailing.insert(0, branch.pop())
        last = branch[-1] if branch else None
        message = self._message("assistant", content, trace, decoder)
        if last is None or last.role != "assistant":
            return self.tree.append(message)
        self.tree.add_sibling(last.id, message)
        for system in trailing:
            self.tree.append(Message("system", system.content))
        return message

    def edit(self, message_id: str, content: str) -> Message:
        """An edited copy of an earlier message beside it: the conversation forks there, the old branch
        is kept. The new message ends the branch in view; the UI asks for its reply next."""
        old = self.tree.get(message_id)
        return self.tree.add_sibling(message_id, self._message(old.role, content, None, None))

    def siblings(self, message_id: str) -> tuple[int, int]:
        """(position from 1, count): the `‹ 2/3 ›` on a message."""
        return self.tree.siblings(message_id)

    def switch(self, message_id: str, step: int) -> Optional[Message]:
        """`[` (step -1) or `]` (+1): that sibling's branch into view; None past either end."""
        return self.tree.switch(message_id, step)

    def select(self, message_id: str) -> list[Message]:
        """The branch through `message_id` into view; returns it."""
        return self.tree.select(message_id)

    def delete_pair(self, message_id: str) -> list[str]:
        """A user message and its reply removed, the turns after them moved up; the removed ids."""
        return self.tree.delete_pair(message_id)

    def _message(self, role: str, content: str, trace: Optional[list[dict[str, Any]]],
                 decoder: Optional[Callable[[int], str]]) -> Message:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        message = Message(role, content, timed_trace(trace) if trace is not None else None)
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

    # -- figures over the branch in view (from the recorded Done stats) ---------
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
            "server": self.server,
            "baseline_tps": self.baseline_tps,
            "settings": self.settings,
            "token_text": {str(k): v for k, v in sorted(self.token_text.items())},
            "revision": self.revision,
            "messages": self.tree.to_dicts(),
            "roots": list(self.tree.roots),
            "view": list(self.tree.view),
        }


@dataclass
class SessionSummary:
    id: str
    title: str
    target: str
    draft: Optional[str]
    created: str
    updated: str
    messages: int  # in the branch in view
    turns: int
    generated_tokens: int
    tokens_per_cycle: Optional[float]
    path: str
    model: str = ""  # what to call the target (model_label)
    branches: int = 1

    @classmethod
    def of(cls, s: Session) -> "SessionSummary":
        return cls(id=s.id, title=s.title, target=s.target, draft=s.draft, created=s.created, updated=s.updated,
                   messages=len(s.messages), turns=len(s.replies()), generated_tokens=s.generated_tokens(),
                   tokens_per_cycle=s.tokens_per_cycle(), path=str(s.path or ""), model=model_label(s.target),
                   branches=s.tree.leaves())

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
    """The first line that has text, its spaces collapsed, cut to TITLE_CHARS."""
    line = next((" ".join(ln.split()) for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return "untitled"
    return cut_title(line)


def cut_title(title: str) -> str:
    """At most TITLE_CHARS characters, a cut one ending in "…": the app's titles, and how a list shows one
    (a file edited by hand may hold a longer one)."""
    return title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1].rstrip() + "…"


def first_prefill(message: Message) -> Optional[Prefill]:
    for ev in message.events():
        if isinstance(ev, Prefill):
            return ev
    return None


# -- reading and checking ----------------------------------------------------------
def session_from_dict(data: Any, values_checked: bool = False) -> Session:
    """Check (see session_schema) and build a Session; raises ValueError saying what is wrong."""
    data = check_session(data, valid_id, values_checked)
    tree = MessageTree.from_dicts(data["messages"], data["roots"], data["view"])
    return Session(id=data["id"], title=data["title"], created=data["created"], updated=data["updated"],
                   target=data["target"], draft=data.get("draft"), settings=dict(data.get("settings", {})),
                   tree=tree, device=data.get("device"), server=data.get("server"), baseline_tps=data.get("baseline_tps"),
                   token_text={int(k): v for k, v in data.get("token_text", {}).items()},
                   revision=data.get("revision", 0))


# only a \uD800-\uDFFF escape can put a lone surrogate into parsed JSON: without one, no text needs checking
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> None:
    raise _NotFinite(name)


def read_json(path: Path) -> tuple[Any, bool]:
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
    data, values_checked = read_json(path)
    try:
        session = session_from_dict(data, values_checked)
    except ValueError as exc:
        raise SessionError(f"{path.name}: {exc}") from None
    session.path = path
    return session
