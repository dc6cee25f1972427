"""A remote reply stopped with Esc keeps its figures, and the block size a remote turn runs with is the
user's choice or else the server's own: real `dflash-tui serve` processes on localhost, the TUI driven by Pilot."""

from __future__ import annotations

import pytest

from dflash_tui.remote.client import RemoteTarget
from dflash_tui.server.launch import ServerProcess
from dflash_tui.ui.app import DFlashApp
from dflash_tui.ui.chat_view import AssistantMessage
from test_remote_tui import SIZE, command, connect, record_events, turn, wait_for

pytestmark = pytest.mark.anyio


def _serve(qwen3_dirs, *extra: str) -> ServerProcess:
    args = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]), "--log-level", "warning"]
    return ServerProcess([*args, *extra], env={"HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def dflash_server(qwen3_dirs):
    """A server with no --block-size: its draft's own (16)."""
    with _serve(qwen3_dirs) as s:
        yield s


@pytest.fixture(scope="module")
def block4_server(qwen3_dirs):
    """A server whose own block size (4) is below its draft's (16)."""
    with _serve(qwen3_dirs, "--block-size", "4") as s:
        yield s


async def test_a_stopped_remote_reply_ends_with_the_figures_of_what_came(dflash_server):
    from dflash_tui.sessions import SessionStore

    app = DFlashApp(remote=RemoteTarget(dflash_server.base_url), probe_tokens=0)
    app.options.max_tokens = 4000
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        seen = record_events(app)
        app.prompt.value = "Parse an ISO date string."
        app.prompt.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: sum(1 for e in seen if e.type == "block" and e.drafted) >= 6, 60, "a few cycles")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, 10, "the turn to stop")
        await pilot.pause(0.2)

        done = seen[-1]
        assert done.type == "done" and done.finish_reason == "cancelled"
        prefill = next(e for e in seen if e.type == "prefill")
        blocks = [e for e in seen if e.type == "block"]
        cycles = [b for b in blocks if b.drafted]
        s = done.stats
        # the engine's definitions over what came (engine/conversation.py)
        assert s["cycles"] == len(cycles) >= 6
        assert s["tokens_per_cycle"] == pytest.approx(sum(len(b.emitted) for b in cycles) / len(cycles))
        assert s["acceptance"] == pytest.approx(sum(b.accepted for b in cycles) / sum(len(b.drafted) for b in cycles))
        assert s["generated_tokens"] == sum(b.reply_tokens for b in blocks) == len(done.tokens)
        assert done.text == "".join(b.text for b in blocks)
        assert s["decode_tps"] > 0 and s["prompt_tokens"] == prefill.prompt_tokens
        # as the request asked: nothing chosen, so the server's own (its draft's 16); greedy
        assert s["block_size"] == 16 and s["mode"] == "dflash" and s["temperature"] == 0.0
        assert s["server"] == dflash_server.base_url

        footer = app.chat.query(AssistantMessage).last()._footer
        assert f"{s['tokens_per_cycle']:.2f} tok/cycle" in footer and f"{s['decode_tps']:.1f} tok/s" in footer, footer
        assert footer.endswith("stopped")
        assert app.acceptance.stats.cycles == s["cycles"]

        # the saved Done keeps them: sessions show/export and replay read these
        (summary,), _ = SessionStore().list()
        saved = SessionStore().load(summary.id)
        kept = saved.replies()[-1].done()
        assert kept.stats["cycles"] == s["cycles"] and kept.stats["block_size"] == 16
        assert saved.tokens_per_cycle() == pytest.approx(s["tokens_per_cycle"])


async def test_a_remote_turn_runs_the_servers_block_size_unless_the_user_chose_one(block4_server):
    app = DFlashApp(remote=RemoteTarget(block4_server.base_url), probe_tokens=0)
    app.options.max_tokens = 48
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        seen = record_events(app)
        await turn(pilot, app, "Write a function that reverses a list")
        rows = [e for e in seen if e.type == "block"]
        assert any(r.drafted for r in rows) and all(len(r.drafted) <= 3 for r in rows)  # the server's 4, not auto
        assert seen[-1].stats["block_size"] == 4 and seen[-1].stats["mode"] == "dflash"

        await command(pilot, app, "/block 0")  # the draft's own, whatever the server's --block-size
        seen.clear()
        await turn(pilot, app, "And in C?")
        rows = [e for e in seen if e.type == "block"]
        assert seen[-1].stats["block_size"] == 16 and max(len(r.drafted) for r in rows) == 15

        await command(pilot, app, "/block auto")  # the user's choice goes, as before
        seen.clear()
        await turn(pilot, app, "And in Go?")
        assert seen[-1].stats["block_size"] == "auto"


async def test_block_goes_up_to_the_drafts_own_size_on_a_server_with_a_smaller_one(block4_server):
    app = DFlashApp(remote=RemoteTarget(block4_server.base_url), probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        await command(pilot, app, "/block 16")
        assert app.options.block_size == 16
