"""The meter and the acceptance pane on the real app and engine: measured figures, pair changes, failed loads."""

from __future__ import annotations

import shutil

import pytest

from ui_support import install_placeholders

install_placeholders()

from dflash_tui.engine import conversation as conversation_mod  # noqa: E402
from dflash_tui.ui.app import DFlashApp  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, Note, UserMessage  # noqa: E402
from test_ui_app import finish_turn, make_app, ready, send, wait_for  # noqa: E402

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


def _body(app) -> str:
    return str(app.meter._body.render())


def _notes(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query(Note)]


async def test_the_probe_speedup_is_on_the_meter_before_the_first_reply(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await wait_for(pilot, lambda: app.meter.state.probe_tps is not None, 60, "the DFlash probe")
        await pilot.pause()
        state = app.meter.state
        assert not state.turns  # no reply yet
        ratio = state.probe_tps / state.baseline_tps  # the compact meter at 120 columns
        expected = f"{ratio:.2f}× (probe): slower" if round(ratio, 2) < 1 else f"{ratio:.2f}× speedup (probe)"
        assert expected in _body(app), _body(app)
        await send(pilot, app, f"/block {app.options.block_size or app.draft_block_size}")  # the same size
        assert app.meter.state.probe_tps is not None
        await send(pilot, app, "/block 4")  # not the size the probe ran: its figure goes
        await pilot.pause()
        assert app.meter.state.probe_tps is None and "(probe)" not in _body(app), _body(app)


async def test_after_a_new_block_size_the_last_replys_speedup_says_the_size_it_ran_at(qwen3_dirs):
    """A reply at block 8, then `/block 4`: its speedup stays, but never as block 4's; it says whose it is."""
    app = make_app(qwen3_dirs)
    app.options.max_tokens = 24
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        state = app.meter.state
        assert state.kept_tps and state.kept_is_last, state
        figure = f"{state.kept_tps / state.baseline_tps:.2f}×"
        assert figure in _body(app) and "last full reply" not in _body(app), _body(app)
        await send(pilot, app, "/block 4")
        await pilot.pause()
        body = _body(app)
        assert body.startswith(figure) and "(last full reply, block 8)" in body and "B 4" in body, body
        await send(pilot, app, "/block 8")  # the size it ran at again: its own figure, nothing to say
        await pilot.pause()
        assert figure in _body(app) and "last full reply" not in _body(app), _body(app)


async def test_a_block_above_the_drafts_own_is_refused_with_the_reason(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert app.draft_block_size == 16
        await send(pilot, app, "/block 32")
        assert app.options.block_size == 8  # unchanged
        assert any("block size 32 refused" in n.message and "trained to draft blocks of 16" in n.message
                   for n in app._notifications)
        for bad in ("-3", "1", "big"):  # refused in the words of the one rule, as 32 is, naming the draft's size
            await send(pilot, app, f"/block {bad}")
            assert app.options.block_size == 8
            alone = "; 1 drafts nothing: /baseline runs the target alone" if bad == "1" else ""
            assert any(n.message == f"block size {bad} refused: a block size is auto, 0 (the draft's own) or a "
                       f"number from 2 up to the draft's own (16){alone}" for n in app._notifications), \
                [n.message for n in app._notifications]
        await send(pilot, app, "/block 16")
        assert app.options.block_size == 16


async def test_a_block_size_from_the_command_line_above_the_drafts_own_falls_back_with_a_note(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.block_size = 40
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert app.options.block_size == 0  # the draft's own
        assert any("block size 40 refused" in n and "Using the draft's own, 16" in n for n in _notes(app))
        assert "B 16" in _body(app)


async def test_a_failed_load_keeps_the_pair_and_the_conversation(qwen3_dirs, tmp_path):
    broken = tmp_path / "broken-target"
    shutil.copytree(qwen3_dirs["target"], broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors at all")  # found and named right; fails only as it loads
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        before = list(app.engine.conversation.messages)
        for model in (str(tmp_path / "no-such-model"), "nobody/offline-model", str(broken)):
            await send(pilot, app, f"/model {model}")
            await wait_for(pilot, lambda: app.model_state != "loading", 60, f"the load of {model} to fail")
            assert app.model_state == "ready" and app.target_name == str(qwen3_dirs["target"])
            assert any(f"Could not load {model}" in n for n in _notes(app)), _notes(app)
            names = f"Still on {qwen3_dirs['target'].name} with draft {qwen3_dirs['draft'].name}; the conversation"
            assert any(n.startswith(names) for n in _notes(app)), _notes(app)  # names, never install paths
            assert [u.raw_text for u in app.chat.query(UserMessage)] == ["hello"]
            assert app.engine.conversation is not None and app.engine.conversation.messages == before
        await send(pilot, app, "and again")  # the conversation goes on with the pair it had
        await finish_turn(pilot, app)
        assert [m["role"] for m in app.engine.conversation.messages] == ["user", "assistant", "user", "assistant"]
        assert len(app.chat.query(AssistantMessage)) == 2


async def test_a_new_pair_resets_the_figures_and_the_conversation_only_once_it_is_loaded(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 20
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        assert app.meter.state.turns and app.acceptance.rows.rows
        app.load_model(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
        assert app.chat.query(UserMessage)  # still there while the pair loads
        await wait_for(pilot, lambda: app.model_state == "ready", 60, "the reload")
        await pilot.pause()
        state = app.meter.state
        assert state.turns == [] and state.tps is None and state.prefill_tps is None and state.baseline_tps is None
        assert not app.acceptance.rows.rows and app.acceptance.stats.cycles == 0
        assert not app.chat.query(UserMessage) and app.engine.conversation.messages == []


async def test_opening_a_session_resets_the_turn_figures(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 20
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        session = app.session
        await pilot.press("ctrl+n")  # a second conversation, another session, other rows
        await wait_for(pilot, lambda: app.session is not session, 5, "a new conversation")
        await send(pilot, app, "more")
        await finish_turn(pilot, app)
        assert len(app.meter.state.turns) == 2
        app.meter.set_baseline_tps(app.meter.state.turn_tps / 0.75)  # as a /baseline reply would measure it
        kept = app.meter.state.speedup_figure
        assert kept and kept[1] == "turn"  # the last reply (20 tokens: a full one)
        other = [(b.drafted, b.emitted) for b in app.acceptance.rows.rows]
        memory = app.meter.state.active_bytes, app.meter.state.rss_bytes
        assert all(memory)
        await app.open_session(session)
        await pilot.pause()
        assert app.meter.state.turns == [] and app.meter.state.tps is None
        assert (app.meter.state.active_bytes, app.meter.state.rss_bytes) == memory  # the process's: it stays
        # the speedup is the pair's, from the last full reply of this run: it stays, and says where it is from
        assert app.meter.state.speedup_figure == kept and "0.75× (last full reply)" in _body(app), _body(app)
        # the pane shows the opened session's reply in view, nothing of what was on screen before
        recorded = [(e["drafted"], e["emitted"]) for e in session.messages[-1].trace if e["type"] == "block"]
        shown = [(b.drafted, b.emitted) for b in app.acceptance.rows.rows]
        assert shown and shown == recorded[-len(shown):] and shown != other[-len(shown):]
        assert app.acceptance.stats.cycles == session.messages[-1].done().stats["cycles"]


async def test_when_the_sizer_runs_the_target_alone_the_pane_and_the_meter_say_so(qwen3_dirs, monkeypatch):
    # a device where drafting costs a lot more than a target step (the random draft is rarely right):
    # fixed costs, so the choice does not follow this host's load
    monkeypatch.setattr(conversation_mod, "measure_costs", lambda target, draft, sizes: {b: 1.0 + 0.6 * (b - 1)
                                                                                        for b in sizes})
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.block_size = "auto"
    app.options.max_tokens = 20  # 12 steps alone, the re-check, then a few alone again
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        await pilot.pause()
        blocks = list(app.acceptance.rows.rows)
        assert sum(1 for b in blocks if b.index > 0 and not b.drafted) >= 12  # the target stepped alone
        assert app.acceptance.note.display
        assert "drafting does not pay here: target alone, re-checking every 12 steps" in str(app.acceptance.note.render())
        assert "B auto→1 alone · greedy · ≤20" in _body(app), _body(app)  # the compact meter at 120 columns


async def test_the_copy_toast_says_where_the_text_went():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        message = app.chat.add_assistant("text\n\n```\ncode\n```\n")
        await pilot.pause()
        message.focus()
        await pilot.press("c", "y")
        toasts = [n.message for n in app._notifications]
        assert len(toasts) == 2
        assert all("terminal's clipboard (OSC 52; some terminals ignore it" in t for t in toasts), toasts
