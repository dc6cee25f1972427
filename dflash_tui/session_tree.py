"""A session's messages as a tree: an edit forks the conversation, a regenerated reply is a sibling.

Every message has an id (unique in its session), its parent (None for a
top-level message) and its children, oldest first. `view` is the branch in
view: message ids from a top-level message down, each a child of the one
before. Everything that shows, plays, exports or measures a session follows
the branch in view; the other branches are kept as they were, each reply with
its own acceptance trace.

`check_tree` checks the structure of a file's tree before anything uses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from dflash_tui.engine.events import Done, Event, event_from_dict
from dflash_tui.session_trace import without_time

MESSAGE_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


@dataclass
class Message:
    role: str
    content: str
    # assistant replies: the turn's events as dicts, each with "t" = seconds since the turn started
    trace: Optional[list[dict[str, Any]]] = None
    id: str = ""
    parent: Optional[str] = None
    children: list[str] = field(default_factory=list)

    def events(self) -> list[Event]:
        return [event_from_dict(without_time(e)) for e in self.trace or []]

    def done(self) -> Optional[Done]:
        for entry in reversed(self.trace or []):
            if entry.get("type") == "done":
                return event_from_dict(without_time(entry))  # type: ignore[return-value]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "parent": self.parent, "children": list(self.children), "role": self.role,
                "content": self.content, "trace": self.trace}


@dataclass
class MessageTree:
    nodes: dict[str, Message] = field(default_factory=dict)  # in the order they were made
    roots: list[str] = field(default_factory=list)  # the top-level messages, oldest first
    view: list[str] = field(default_factory=list)
    # parent id (None: the top level) -> the child last in view there, so switching back returns to it
    _last_child: dict[Optional[str], str] = field(default_factory=dict, compare=False, repr=False)

    # -- reading ---------------------------------------------------------------------
    def branch(self) -> list[Message]:
        """The messages of the branch in view, from the top."""
        return [self.nodes[i] for i in self.view]

    def get(self, message_id: str) -> Message:
        node = self.nodes.get(message_id)
        if node is None:
            raise KeyError(f"no message {message_id!r} in this session")
        return node

    def children_of(self, parent: Optional[str]) -> list[str]:
        return self.roots if parent is None else self.get(parent).children

    def siblings(self, message_id: str) -> tuple[int, int]:
        """(position from 1, count) among the message's siblings: `‹ 2/3 ›`."""
        group = self.children_of(self.get(message_id).parent)
        return group.index(message_id) + 1, len(group)

    def path_to(self, message_id: str) -> list[str]:
        """Ids from the top down to `message_id`."""
        path = [message_id]
        node = self.get(message_id)
        while node.parent is not None and len(path) <= len(self.nodes):
            path.append(node.parent)
            node = self.get(node.parent)
        return path[::-1]

    def leaves(self) -> int:
        """How many branches the tree has."""
        return sum(1 for n in self.nodes.values() if not n.children)

    # -- changing the branch in view ----------------------------------------------
    def set_view(self, ids: list[str]) -> None:
        self.view = list(ids)
        parent: Optional[str] = None
        for i in self.view:
            self._last_child[parent] = i
            parent = i

    def descend(self, message_id: str) -> list[str]:
        """Ids below `message_id` down to a leaf: the child last in view at each step, else the newest."""
        out: list[str] = []
        node = self.get(message_id)
        while node.children and len(out) < len(self.nodes):
            remembered = self._last_child.get(node.id)
            child = remembered if remembered in node.children else node.children[-1]
            out.append(child)
            node = self.get(child)
        return out

    def select(self, message_id: str) -> list[Message]:
        """Bring the branch through `message_id` into view (below it: as it was last seen)."""
        self.set_view(self.path_to(message_id) + self.descend(message_id))
        return self.branch()

    def switch(self, message_id: str, step: int) -> Optional[Message]:
        """The sibling `step` places away (`[` is -1, `]` is +1) into view; None past either end."""
        node = self.get(message_id)
        group = self.children_of(node.parent)
        at = group.index(message_id) + step
        if not 0 <= at < len(group):
            return None
        self.select(group[at])
        return self.nodes[group[at]]

    # -- growing -------------------------------------------------------------------------
    def _new_id(self) -> str:
        n = len(self.nodes) + 1
        while f"m{n}" in self.nodes:
            n += 1
        return f"m{n}"

    def _attach(self, message: Message, parent: Optional[str]) -> Message:
        message.id, message.parent, message.children = self._new_id(), parent, []
        self.nodes[message.id] = message
        self.children_of(parent).append(message.id)
        return message

    def append(self, message: Message) -> Message:
        """Add a message after the last one in view; it joins the view."""
        parent = self.view[-1] if self.view else None
        self._attach(message, parent)
        self.set_view(self.view + [message.id])
        return message

    def add_sibling(self, of: str, message: Message) -> Message:
        """Add a message beside `of` (same parent); the view becomes the branch ending at it."""
        parent = self.get(of).parent
        self._attach(message, parent)
        self.set_view((self.path_to(parent) if parent is not None else []) + [message.id])
        return message

    # -- removing ------------------------------------------------------------------------
    def pair_of(self, message_id: str) -> tuple[Message, Optional[Message]]:
        """The user message and its reply in view (or its newest) that `message_id` is one of."""
        node = self.get(message_id)
        if node.role == "assistant" and node.parent is not None and self.get(node.parent).role == "user":
            return self.get(node.parent), node
        if node.role != "user":
            raise ValueError("only a user message and its reply make a pair")
        replies = [c for c in node.children if self.get(c).role == "assistant"]
        if not replies:
            return node, None
        in_view = next((c for c in replies if c in self.view), None)
        remembered = self._last_child.get(node.id)
        return node, self.get(in_view or (remembered if remembered in replies else replies[-1]))

    def delete_pair(self, message_id: str) -> list[str]:
        """Remove a user message and its reply; the turns after them move up into their place.

        When the user message has other replies, it stays with those (only the
        reply goes). Returns the ids removed.
        """
        user, reply = self.pair_of(message_id)
        last = reply or user
        removed = [last.id]
        spliced = list(last.children)
        if reply is not None:
            user.children.remove(reply.id)
        if not user.children:  # no other reply keeps the user message
            removed.append(user.id)
        group = self.children_of(user.parent)
        at = group.index(user.id) + 1
        if user.id in removed:
            group.remove(user.id)
            at -= 1
        group[at:at] = spliced
        for child in spliced:
            self.nodes[child].parent = user.parent
        for i in removed:
            del self.nodes[i]
            self._last_child.pop(i, None)
        for key, child in list(self._last_child.items()):
            if child in removed:
                del self._last_child[key]
        self._after_delete([i for i in self.view if i not in removed], spliced, user.parent)
        return removed

    def _after_delete(self, kept: list[str], spliced: list[str], parent: Optional[str]) -> None:
        """The view after a delete: what is left of it (the turns that moved up joined on), down to a leaf."""
        if not (kept and self.is_path(kept)):
            anchor = next((c for c in spliced if c in kept), spliced[0] if spliced else parent)
            if anchor is None and self.roots:
                anchor = self.roots[-1]
            if anchor is None:
                self.set_view([])
                return
            below = kept[kept.index(anchor) + 1:] if anchor in kept else []
            kept = self.path_to(anchor) + below
            if not self.is_path(kept):
                kept = self.path_to(anchor)
        self.set_view(kept + self.descend(kept[-1]))

    def is_path(self, ids: list[str]) -> bool:
        """True when `ids` go from a top-level message down, each a child of the one before."""
        parent: Optional[str] = None
        for i in ids:
            node = self.nodes.get(i)
            if node is None or node.parent != parent:
                return False
            parent = i
        return True

    # -- to and from a file ----------------------------------------------------------------
    def to_dicts(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in self.nodes.values()]

    @classmethod
    def from_dicts(cls, messages: Iterable[dict[str, Any]], roots: list[str], view: list[str]) -> "MessageTree":
        """A tree from checked data (see `check_tree`)."""
        tree = cls()
        for m in messages:
            tree.nodes[m["id"]] = Message(m["role"], m["content"], m.get("trace"), m["id"], m.get("parent"),
                                          list(m["children"]))
        tree.roots = list(roots)
        tree.set_view(view)
        return tree


def engine_view(messages: Iterable[Message]) -> list[dict[str, str]]:
    """A branch as the engine takes it (`Restore`): the system prompt last set on it at the top (a
    /system mid-conversation is recorded where it was set, and an empty one clears it, as the
    engine applies it to the whole conversation), then the turns."""
    branch = list(messages)
    system = next((m.content for m in reversed(branch) if m.role == "system"), "")
    turns = [{"role": m.role, "content": m.content} for m in branch if m.role != "system"]
    return ([{"role": "system", "content": system}] if system else []) + turns


def system_of(view: list[dict[str, str]]) -> str:
    """The system prompt of an engine view (`engine_view`), "" for none."""
    return view[0]["content"] if view and view[0]["role"] == "system" else ""


def linear(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One branch as tree fields: ids m1..mN, each the parent of the next (an older file's messages)."""
    ids = [f"m{i + 1}" for i in range(len(messages))]
    nodes = []
    for i, m in enumerate(messages):
        node = dict(m)
        node.update(id=ids[i], parent=ids[i - 1] if i else None, children=ids[i + 1:i + 2])
        nodes.append(node)
    return {"messages": nodes, "roots": ids[:1], "view": ids}


# -- checking a file's tree ---------------------------------------------------------------
def _fail(what: str) -> None:
    raise ValueError(what)


def check_tree(messages: list[dict[str, Any]], roots: Any, view: Any) -> None:
    """Ids unique and well formed, parents and children agreeing, every message reachable from the
    top exactly once (so no cycles), and the view a path from the top. Raises ValueError saying what."""
    parents: dict[str, Optional[str]] = {}
    children: dict[str, list[str]] = {}
    for i, m in enumerate(messages):
        mid, parent, kids = m.get("id"), m.get("parent"), m.get("children")
        if type(mid) is not str or not MESSAGE_ID.match(mid):
            _fail(f"message {i} has a bad id")
        if mid in parents:
            _fail(f"message id {mid!r} is used twice")
        if parent is not None and type(parent) is not str:
            _fail(f"message {mid!r} has a bad parent")
        if type(kids) is not list or not all(type(k) is str for k in kids):
            _fail(f"message {mid!r} has bad children")
        parents[mid], children[mid] = parent, kids
    if type(roots) is not list or not all(type(r) is str for r in roots):
        _fail("'roots' is not a list of message ids")
    seen: set[str] = set()
    stack: list[tuple[Optional[str], list[str]]] = [(None, roots)]
    while stack:
        parent, group = stack.pop()
        for mid in group:
            if mid not in parents:
                _fail(f"message {mid!r} is named but missing")
            if mid in seen:
                _fail(f"message {mid!r} appears twice in the tree")
            if parents[mid] != parent:
                _fail(f"message {mid!r} does not name its parent")
            seen.add(mid)
            stack.append((mid, children[mid]))
    if len(seen) != len(parents):
        _fail("a message is not reachable from the top")
    if type(view) is not list:
        _fail("'view' is not a list of message ids")
    parent = None
    for mid in view:
        if type(mid) is not str or parents.get(mid, "") != parent:
            _fail("'view' is not a branch of the tree")
        parent = mid
    if parents and not view:
        _fail("'view' is empty")
