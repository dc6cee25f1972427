"""The message tree: edit forks, regenerate adds a sibling, `[`/`]` switch, a pair is deleted; the tree in a
file (schema 3), older files migrated in memory, hostile trees refused; replay follows the branch in view."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from dflash_tui.engine.events import Block, Done, Prefill, event_to_dict
from dflash_tui.sessions import SCHEMA_VERSION, Session, SessionError, SessionStore, read_session

FIXTURE = Path(__file__).parent / "fixtures" / "trace_session.json"  # a schema 2 file: an old one, on purpose


def _trace(text: str, tpc: float = 3.0) -> list[dict]:
    events = [Prefill(6, 0, 0.01), Block(0, [], 0, [4], text[:1], 1.0, 1.0),
              Block(1, [5, 6, 7], 2, [5, 6, 9], text[1:], 1.0, 2.0),
              Done([4, 5, 6, 9], text, "stop", {"mode": "dflash", "cycles": 1, "tokens_per_cycle": tpc,
                                                 "generated_tokens": 4, "acceptance": 0.67, "decode_tps": 50.0})]
    return [{"t": 0.01 * (i + 1), **event_to_dict(e)} for i, e in enumerate(events)]


def _texts(session: Session) -> list[str]:
    return [m.content for m in session.messages]


def tree_session(store: SessionStore) -> Session:
    """system, q1, a1, q2 → a2 and a2' (regenerated); q2 edited to q2b → a3: three branches."""
    s = store.new("org/target", "org/draft", {"temperature": 0.0})
    s.add_message("system", "be brief")
    s.add_message("user", "q1")
    s.add_message("assistant", "a1", _trace("a1"))
    q2 = s.add_message("user", "q2")
    s.add_message("assistant", "a2", _trace("a2", 2.0))
    s.regenerate_reply("a2 again", _trace("a2 again", 4.0))
    s.edit(q2.id, "q2b")
    s.add_message("assistant", "a3", _trace("a3", 5.0))
    return s


def test_edit_forks_regenerate_adds_a_sibling_and_switching_follows_the_branch(tmp_path):
    s = tree_session(SessionStore(tmp_path))
    assert _texts(s) == ["be brief", "q1", "a1", "q2b", "a3"]
    q2b = s.messages[3]
    assert s.siblings(q2b.id) == (2, 2) and s.tree.leaves() == 3
    assert s.switch(q2b.id, +1) is None  # past the end: nothing changes
    old = s.switch(q2b.id, -1)
    assert old is not None and old.content == "q2" and s.siblings(old.id) == (1, 2)
    assert _texts(s) == ["be brief", "q1", "a1", "q2", "a2 again"]  # the reply last seen there: the newest
    reply = s.messages[-1]
    assert s.siblings(reply.id) == (2, 2)
    s.switch(reply.id, -1)
    assert _texts(s)[-1] == "a2" and s.tokens_per_cycle() == pytest.approx(2.5)  # figures follow the view
    s.switch(s.messages[3].id, +1)
    assert _texts(s)[-2:] == ["q2b", "a3"]
    s.switch(s.messages[3].id, -1)
    assert _texts(s)[-1] == "a2"  # switching back returns to the reply that was in view there
    assert [m["role"] for m in s.conversation()] == ["system", "user", "assistant", "user", "assistant"]
    assert s.title == "q1"  # an edit does not rename the session
    # every reply keeps its own trace
    assert {m.content: m.done().stats["tokens_per_cycle"] for m in s.tree.nodes.values() if m.trace} == {
        "a1": 3.0, "a2": 2.0, "a2 again": 4.0, "a3": 5.0}


def test_the_tree_survives_a_save_and_a_load(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    s = tree_session(store)
    path = store.save(s)
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 3
    assert data["view"] == s.tree.view and data["roots"] == [s.tree.view[0]]
    nodes = {m["id"]: m for m in data["messages"]}
    assert all(nodes[c]["parent"] == i for i, m in nodes.items() for c in m["children"])
    loaded = store.load(s.id)
    assert loaded == s and _texts(loaded) == _texts(s)
    loaded.switch(loaded.messages[3].id, -1)
    store.save(loaded)
    assert _texts(store.load(s.id))[-2:] == ["q2", "a2 again"]  # the branch in view is what was saved


def test_delete_pair_moves_later_turns_up_and_keeps_other_replies(tmp_path):
    s = Session(id="d", title="", created="2025-01-04T09:00:00+00:00", updated="2025-01-04T09:00:00+00:00", target="t", draft=None, settings={})
    for i in range(3):
        s.add_message("user", f"q{i}")
        s.add_message("assistant", f"a{i}")
    middle = s.messages[2]
    removed = s.delete_pair(middle.id)
    assert len(removed) == 2 and _texts(s) == ["q0", "a0", "q2", "a2"]
    assert s.tree.is_path(s.tree.view) and s.messages[2].parent == s.messages[1].id
    # a user message with two replies: deleting the pair in view keeps the user message with the other reply
    s.regenerate_reply("a2 again")
    q2 = s.messages[2]
    again = s.messages[-1]
    assert again.content == "a2 again" and s.delete_pair(again.id) == [again.id]
    assert q2.id in s.tree.nodes and [s.tree.nodes[c].content for c in q2.children] == ["a2"]
    assert _texts(s) == ["q0", "a0", "q2", "a2"]  # the reply that is left comes into view
    s.delete_pair(s.messages[0].id)  # the first pair: the rest moves to the top
    assert _texts(s) == ["q2", "a2"] and s.tree.roots == [s.messages[0].id]
    s.delete_pair(s.messages[0].id)
    assert s.messages == [] and s.tree.nodes == {} and s.tree.view == []
    with pytest.raises(KeyError):
        s.delete_pair("m404")
    s.add_message("system", "sys")
    with pytest.raises(ValueError, match="pair"):
        s.delete_pair(s.messages[0].id)


def test_an_old_file_is_one_branch_in_memory_and_left_as_it_is(tmp_path):
    root = tmp_path / "sessions"
    root.mkdir()
    path = root / "fixture-trace-session.json"
    path.write_bytes(FIXTURE.read_bytes())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    old = json.loads(FIXTURE.read_text())
    assert old["schema_version"] == 2
    store = SessionStore(root)
    s = store.load("fixture")  # a prefix of its id
    assert [(m.role, m.content, m.trace) for m in s.messages] == [
        (m["role"], m["content"], m["trace"]) for m in old["messages"]]
    assert s.tree.view == [f"m{i + 1}" for i in range(len(old["messages"]))] and s.tree.leaves() == 1
    store.list()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # loading and listing never rewrite it
    s.regenerate_reply("another answer")
    store.save(s)
    saved = json.loads(path.read_text())
    assert saved["schema_version"] == 3 and len(saved["messages"]) == len(old["messages"]) + 1
    assert store.load(s.id) == s


def _tree_file(**changes) -> dict:
    data = json.loads(FIXTURE.read_text())
    s = Session(id="t", title="t", created="2025-01-04T09:00:00+00:00", updated="2025-01-04T09:00:00+00:00", target="x", draft=None, settings={})
    s.add_message("user", "q")
    s.add_message("assistant", "a")
    data.update(s.to_dict())
    data.update(changes)
    return data


def _messages(edit) -> list:
    messages = copy.deepcopy(_tree_file()["messages"])
    edit(messages)
    return messages


HOSTILE_TREES = {
    "a bad id": dict(messages=_messages(lambda ms: ms[1].update(id="../x")), view=["m1"]),
    "used twice": dict(messages=_messages(lambda ms: ms[1].update(id="m1"))),
    "does not name its parent": dict(messages=_messages(lambda ms: ms[1].update(parent=None))),
    "missing": dict(messages=_messages(lambda ms: ms[0].update(children=["m2", "m9"]))),
    "appears twice": dict(messages=_messages(lambda ms: ms[0].update(children=["m2", "m2"]))),
    "not reachable": dict(roots=[]),  # m1 -> m2 -> m1 would be a cycle: nothing reaches it
    "bad parent": dict(messages=_messages(lambda ms: ms[1].update(parent=5))),
    "bad children": dict(messages=_messages(lambda ms: ms[0].update(children="m2"))),
    "'roots' is not a list": dict(roots="m1"),
    "'view' is not a branch": dict(view=["m2"]),
    "'view' is empty": dict(view=[]),
    "'view' is not a list": dict(view=None),
    "unknown role": dict(messages=_messages(lambda ms: ms[1].update(role="tool"))),
}


@pytest.mark.parametrize("reason", sorted(HOSTILE_TREES))
def test_a_hostile_tree_is_refused_with_its_reason(tmp_path, reason):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_tree_file(**HOSTILE_TREES[reason])))
    with pytest.raises(SessionError, match=f"t.json: .*{reason}"):
        read_session(path)


def test_a_cycle_is_refused(tmp_path):
    messages = _messages(lambda ms: (ms[0].update(parent="m2"), ms[1].update(children=["m1"])))
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_tree_file(messages=messages, roots=[], view=[])))
    with pytest.raises(SessionError, match="not reachable"):
        read_session(path)
    assert json.loads(path.read_text())["messages"] == messages  # left as it is


# -- replay follows the branch in view ---------------------------------------------------------
@pytest.mark.anyio
async def test_replay_plays_the_branch_in_view_of_a_saved_tree(tmp_path, monkeypatch):
    """Build a tree through the API, save, reload by a prefix of its id through the replay command, and play
    it in the real ReplayApp: the branch in view, and none of the others."""
    from dflash_tui.cli import main
    from dflash_tui.ui.replay_screen import ReplayApp, ReplayScreen

    store = SessionStore(tmp_path / "data" / "sessions")
    s = tree_session(store)
    s.switch(s.messages[3].id, -1)  # q2 ...
    s.switch(s.messages[-1].id, -1)  # ... and its first reply, a2
    store.save(s)
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    started: list[Session] = []
    monkeypatch.setattr(ReplayApp, "run", lambda self: started.append(self.session))
    assert main(["replay", s.id[:17]]) == 0  # the date part and one more character: unique
    replayed = started[0]
    assert _texts(replayed) == ["be brief", "q1", "a1", "q2", "a2"]

    from dflash_tui.demo import demo_draft_path, demo_target_path

    replayed.target, replayed.draft = str(demo_target_path()), str(demo_draft_path())
    app = ReplayApp(replayed, speed=float("inf"))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        await pilot.pause(0.3)
        assert screen.player.finished
        shown = [m.raw_text for m in screen.chat.messages()]
        assert shown == ["be brief", "q1", "a1", "q2", "a2"]
        rows = screen.acceptance.query_one("AcceptanceRows").rows
        assert "".join(b.text for b in rows) == "a2"  # the last reply's cycles: a2's, not a sibling's
        assert (screen.meter.state.target, screen.meter.state.draft) == ("demo (offline)", "demo (offline)")
