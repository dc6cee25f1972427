"""Each saved reply keeps the settings it ran with (the file's own are its last reply's): a sampled
conversation loads again, replay shows each reply's settings, export lists them."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send  # noqa: E402

from dflash_tui.sessions import SessionStore  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_each_reply_keeps_its_settings_and_a_sampled_session_loads_again(qwen3_dirs):
    from dflash_tui.ui.meter import SystemMeter
    from dflash_tui.ui.replay_screen import ReplayApp

    app = make_app(qwen3_dirs, probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "/max-tokens 5")
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        await send(pilot, app, "/max-tokens 9")
        await send(pilot, app, "/temp 0.5")  # sampled, with the seed the engine drew
        await send(pilot, app, "second question")
        await finish_turn(pilot, app)
        sid = app.session.id
    saved = SessionStore().load(sid)  # a sampled session loads again
    first, second = [m.done().stats for m in saved.replies()]
    assert (first["max_tokens"], first["temperature"]) == (5, 0.0)
    assert (second["max_tokens"], second["temperature"]) == (9, 0.5) and second["seed"] is not None
    assert (saved.settings["max_tokens"], saved.settings["temperature"]) == (9, 0.5)  # the last reply's
    assert [s.id for s in SessionStore().list()[0]] == [sid]

    replay = ReplayApp(saved, paused=True, theme="textual-dark")
    async with replay.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen, meter = replay.screen, replay.screen.query_one(SystemMeter)
        for index, (max_tokens, sampling) in zip([saved.messages.index(m) for m in saved.replies()],
                                                 [(5, "greedy"), (9, "temp 0.5")]):
            screen.player.jump(index)
            await screen._jump(index)
            await pilot.press("right")
            await pilot.pause()
            assert meter.state.settings["max_tokens"] == max_tokens
            body = str(meter._body.render())
            assert sampling in body and f"≤{max_tokens}" in body.replace(" ", ""), body
