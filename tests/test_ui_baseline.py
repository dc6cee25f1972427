"""The target-alone figure the speedup divides by: only from a reply or probe long enough to time
(MIN_TIMED_TOKENS), saved with the reply it applied to, and the same in a replay."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from fixtures.harness import trace_session  # noqa: E402
from dflash_tui.figure_rules import MIN_TIMED_TOKENS  # noqa: E402
from dflash_tui.sessions import SessionStore  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_a_short_target_only_reply_keeps_the_figure_and_a_long_one_replaces_it(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=4)  # asked for 4: the probe still runs the 16 a figure needs
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await wait_for(pilot, lambda: app.meter.state.baseline_tps is not None, what="the probe's figure")
        probe = app.meter.state.baseline_tps
        await send(pilot, app, "/baseline")
        await send(pilot, app, f"/max-tokens {MIN_TIMED_TOKENS - 4}")
        await send(pilot, app, "short")
        await finish_turn(pilot, app)
        short = app.session.replies()[-1].done()  # the engine's Done, as recorded
        assert short.stats["mode"] == "baseline" and 1 < len(short.tokens) < MIN_TIMED_TOKENS
        assert app.meter.state.baseline_tps == probe == app.baseline_tps  # too short to time: kept

        await send(pilot, app, f"/max-tokens {MIN_TIMED_TOKENS + 8}")
        await send(pilot, app, "long")
        await finish_turn(pilot, app)
        long = app.session.replies()[-1].done()
        assert len(long.tokens) >= MIN_TIMED_TOKENS, "the tiny target stopped early: pick another prompt"
        measured = long.stats["decode_tps"]
        assert app.meter.state.baseline_tps == measured == app.baseline_tps != probe
        on_disk = SessionStore().load(app.session.id)  # saved with this turn, not one turn late
        assert on_disk.baseline_tps == measured
        replies = [m.done().stats for m in on_disk.replies()]
        assert [r.get("baseline_tps") for r in replies] == [probe, measured]

        await send(pilot, app, "/baseline off")
        await send(pilot, app, "drafted")
        await finish_turn(pilot, app)
        replies = [m.done().stats for m in SessionStore().load(app.session.id).replies()]
        assert replies[-1]["mode"] == "dflash" and replies[-1]["baseline_tps"] == measured


async def test_replay_divides_each_reply_by_the_figure_it_was_shown_with():
    from dflash_tui.ui.meter import SystemMeter
    from dflash_tui.ui.replay_screen import ReplayApp

    session = trace_session()
    replies = [session.messages.index(m) for m in session.replies() if m.done() is not None]
    assert len(replies) >= 2
    for n, index in enumerate(replies):  # the file's own figure would be the last: each reply has its own
        done = next(e for e in reversed(session.messages[index].trace) if e["type"] == "done")
        done["stats"]["baseline_tps"] = 10.0 * (n + 1)
    session.baseline_tps = 99.0
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        meter = screen.query_one(SystemMeter)
        assert meter.state.baseline_tps == 99.0  # before any reply: the file's
        for n, index in reversed(list(enumerate(replies))):  # backwards too: a jump sets it, not only play
            screen.player.jump(index)
            await screen._jump(index)
            await pilot.press("right")  # the reply starts
            await pilot.pause()
            assert meter.state.baseline_tps == 10.0 * (n + 1), n
