"""Replay: the player's cues and controls, its timing against the wall clock, and the replay screen."""

from __future__ import annotations

import time

import pytest

from fixtures.harness import trace_session
from dflash_tui.engine.events import Block, Done, Prefill, event_to_dict
from dflash_tui.replay import SPEEDS, Player, events_of, play, recorded_events
from dflash_tui.sessions import Session

pytestmark = pytest.mark.anyio


def _short_session(cycle_s: float = 0.02, cycles: int = 10) -> Session:
    """Two messages; the reply's cycles are `cycle_s` apart (recorded)."""
    s = Session(id="short", title="t", created="2025-01-04T09:00:00+00:00", updated="2025-01-04T09:00:00+00:00", target="t", draft="d", settings={})
    s.add_message("user", "hi")
    trace = [{"t": 0.01, **event_to_dict(Prefill(5, 0, 0.01))}]
    for i in range(cycles):
        trace.append({"t": 0.01 + cycle_s * (i + 1), **event_to_dict(Block(i, [1, 2, 3], 1, [1, 4], "ab"))})
    trace.append({"t": 0.01 + cycle_s * cycles, **event_to_dict(Done([1, 4] * cycles, "ab" * cycles, "stop", {}))})
    s.add_message("assistant", "ab" * cycles, trace)
    return s


# -- the player -------------------------------------------------------------------------
def test_cues_follow_the_recorded_timeline():
    session = trace_session()
    player = Player(session)
    kinds = [(c.message, c.kind) for c in player.cues if c.kind != "event"]
    assert kinds == [(0, "message"), (1, "message"), (2, "start"), (2, "end"), (3, "message"),
                     (4, "start"), (4, "end"), (5, "message"), (6, "start"), (6, "end")]
    times = [c.at for c in player.cues]
    assert times == sorted(times)
    reply = session.messages[2]
    start = player.starts[2]
    offsets = [c.at - start for c in player.cues if c.message == 2 and c.kind == "event"]
    assert offsets == pytest.approx([e["t"] for e in reply.trace])
    assert player.duration == pytest.approx(player.cues[-1].at)


def test_instant_replay_gives_back_the_recorded_events():
    session = trace_session()
    player = Player(session, speed=float("inf"))
    cues = player.poll(0.0)
    assert player.finished
    assert events_of(cues) == [e for evs in recorded_events(session) for e in evs]


def test_pause_step_speed_and_jumps():
    session = trace_session()
    p = Player(session, paused=True)
    assert p.advance(10.0) == []  # paused: time does not move
    first = p.step()
    assert isinstance(first[-1].event, Block) and [c.kind for c in first][:3] == ["message", "message", "start"]
    second = p.step()
    assert len(second) == 1 and second[0].event.index == 1
    assert p.paused
    assert p.faster() == 2.0 and p.faster() == 4.0
    for _ in range(10):
        p.faster()
    assert p.speed == SPEEDS[-1] == 16.0
    for _ in range(10):
        p.slower()
    assert p.speed == SPEEDS[0] == 0.25
    assert p.next_message() == 3 and p.current_message == 3
    assert p.next_message() == 4  # right after a jump, n moves on again
    assert p.position == pytest.approx(p.starts[4])
    p.toggle_pause()
    p.set_speed(1.0)
    p.advance(0.05)
    assert p.previous_message() == 4  # mid-message: back to its start
    assert p.previous_message() == 3  # at its start: the one before
    p.jump(6)
    assert p.next_message() is None
    p.toggle_instant()
    p.advance(0.0)
    assert p.finished


@pytest.mark.parametrize("speed", [1.0, 4.0, 0.5])
def test_replay_takes_recorded_time_over_speed(speed):
    session = _short_session(cycle_s=0.03, cycles=8)  # 0.25 s of recorded reply + the gap before it
    player = Player(session, speed=speed, gap_s=0.1)
    seen: list = []
    wall = play(player, seen.extend)
    expected = player.duration / speed
    assert player.finished and len(events_of(seen)) == 10
    assert wall == pytest.approx(expected, abs=0.05 + 0.1 * expected)


def test_cues_arrive_in_order_at_their_times():
    session = _short_session(cycle_s=0.05, cycles=4)
    player = Player(session, speed=2.0, gap_s=0.0)
    arrivals = []
    start = time.monotonic()
    play(player, lambda cues: arrivals.extend((time.monotonic() - start, c) for c in cues))
    for wall, cue in arrivals:
        assert wall >= cue.at / 2.0 - 0.005  # never early
        assert wall <= cue.at / 2.0 + 0.1  # and not much late


# -- the screen ------------------------------------------------------------------------------
async def _paused_app():
    from dflash_tui.ui.replay_screen import ReplayApp

    return ReplayApp(trace_session(), paused=True, theme="textual-dark")


async def test_replay_controls_drive_the_views():
    from dflash_tui.ui.acceptance import AcceptanceView
    from dflash_tui.ui.chat_view import ChatView
    from dflash_tui.ui.meter import SystemMeter
    from dflash_tui.ui.replay_screen import ReplayScreen

    app = await _paused_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        acc, meter, chat = screen.query_one(AcceptanceView), screen.query_one(SystemMeter), screen.query_one(ChatView)
        await pilot.pause(0.2)
        assert len(acc.rows.rows) == 0  # paused: nothing plays
        for _ in range(3):
            await pilot.press("right")
        await pilot.pause()
        assert [b.index for b in acc.rows.rows] == [0, 1, 2]
        assert acc.stats.cycles == 2
        assert meter.state.prompt_tokens == trace_session().messages[2].events()[0].prompt_tokens
        await pilot.press("plus", "plus")
        assert screen.player.speed == 4.0
        await pilot.press("minus")
        assert screen.player.speed == 2.0
        await pilot.press("n")  # to the second question
        await pilot.pause()
        assert screen.player.current_message == 3
        roles = [m.ROLE for m in chat.messages()]
        assert roles == ["system", "you", "assistant"]  # the first reply shown whole
        assert len(acc.rows.rows) == 0
        await pilot.press("n", "right")  # into the target-only reply
        await pilot.pause()
        assert acc.rows.rows[-1].drafted == [] and meter.state.mode == "baseline"
        await pilot.press("i", "space")  # instant, and play
        await pilot.pause(0.3)
        assert screen.player.finished
        assert [m.ROLE for m in chat.messages()][-2:] == ["you", "assistant"]
        last = trace_session().messages[-1]
        assert chat.last_assistant().raw_text == last.content
        assert meter.state.turn_tokens_per_cycle == pytest.approx(last.done().stats["tokens_per_cycle"])
        assert "finished" in str(screen.query_one("#replay-bar").render())
        await pilot.press("p")  # back to the start of the last reply, held there (instant would end it at once)
        await pilot.pause(0.3)
        assert screen.player.current_message == 6 and not screen.player.finished and screen.player.paused
        assert [m.ROLE for m in chat.messages()] == ["system", "you", "assistant", "you", "assistant", "you"]
        await pilot.press("space")  # and on from there, still instant
        await pilot.pause(0.3)
        assert screen.player.finished and chat.last_assistant().raw_text == last.content
        await pilot.press("escape")
        await pilot.pause()
    assert app.return_code == 0


def test_previous_message_goes_back_once_the_replay_has_finished():
    for instant in (False, True):
        p = Player(trace_session(), speed=float("inf") if instant else 8.0)
        p.advance(1e6)
        assert p.finished and p.current_message == 6
        assert p.previous_message() == 6 and p.paused and not p.finished  # the last reply, from its start
        assert p.advance(1e6) == []  # held there: it does not end again at once
        assert p.previous_message() == 5 and p.position == pytest.approx(p.starts[5])  # and further back
        p.toggle_pause()
        p.advance(1e6)
        assert p.finished


async def test_p_goes_back_after_the_replay_finished_playing():
    """Played to its end at 8× (and after `i`), `p` still goes back: the status leaves "finished"."""
    from dflash_tui.ui.replay_screen import ReplayApp

    app = ReplayApp(trace_session(), speed=8.0, theme="textual-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        bar = lambda: str(screen.query_one("#replay-bar").render())  # noqa: E731
        for key in ("", "i"):
            if key:
                await pilot.press(key, "space")  # instant, and played on to the end again
            deadline = time.monotonic() + 20
            while not screen.player.finished and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.pause(0.2)
            assert "■ finished" in bar() and "message 7/7" in bar(), bar()
            await pilot.press("p")
            await pilot.pause(0.3)
            assert "‖ paused" in bar() and "message 7/7" in bar(), bar()
            assert [m.ROLE for m in screen.chat.messages()][-1] == "you"  # the last reply is to come
            await pilot.press("p")
            await pilot.pause(0.3)
            assert "‖ paused" in bar() and "message 6/7" in bar(), bar()
            assert [m.ROLE for m in screen.chat.messages()][-1] == "assistant"


async def test_replay_plays_in_real_time_on_its_own():
    app = await _paused_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        screen.player.jump(5)
        await screen._jump(5)
        screen.player.set_speed(16.0)
        screen.player.toggle_pause()
        deadline = time.monotonic() + 5
        while not screen.player.finished and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert screen.player.finished
        assert screen.acceptance.stats.cycles == trace_session().messages[6].done().stats["cycles"]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot_replay_mid_way(snap_compare, size):
    from dflash_tui.ui.replay_screen import ReplayApp

    app = ReplayApp(trace_session(), paused=True, theme="textual-dark")
    # message 7 is the last reply: step five cycles into it
    assert snap_compare(app, terminal_size=size, press=["n"] * 6 + ["right"] * 6)


async def test_a_session_run_at_the_drafts_own_size_replays_with_that_size():
    """No block size set means the draft's own: the live meter showed its number, so does the replay."""
    from dflash_tui.ui.meter import SystemMeter
    from dflash_tui.ui.replay_screen import ReplayApp

    session = trace_session()
    session.settings["block_size"] = None
    recorded = next(m.done().stats["block_size"] for m in session.replies()
                    if m.done() is not None and m.done().stats.get("mode") == "dflash")
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        meter = app.screen.query_one(SystemMeter)
        assert meter.state.settings["block_size"] == recorded
        body = str(meter._body.render())
        assert f"block {recorded}" in body or f"B {recorded}" in body, body


async def test_replayed_replies_have_the_live_chats_footers():
    """The same reply reads the same in the chat that made it and in its replay (both ways a reply is
    shown in replay: played, and shown whole when jumped past)."""
    from dflash_tui.ui.chat_view import AssistantMessage
    from dflash_tui.ui.replay_screen import ReplayApp
    from dflash_tui.figure_rules import reply_summary

    session = trace_session()
    wanted = [reply_summary(m.done()) for m in session.replies()]
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("n")  # the first reply shown whole
        await pilot.press("i", "space")  # the rest played, instantly
        for _ in range(100):
            if app.screen.player.finished:
                break
            await pilot.pause(0.05)
        shown = [str(b.query_one(".message-footer").render()) for b in app.screen.query(AssistantMessage)]
    assert shown == wanted and all(shown)


def _meter_text(app) -> str:
    from dflash_tui.ui.meter import SystemMeter

    return str(app.screen.query_one(SystemMeter)._body.render())


async def _play_to_the_end(app, pilot) -> None:
    await pilot.press("i", "space")  # instant, and play
    for _ in range(100):
        if app.screen.player.finished:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.1)
    assert app.screen.player.finished


async def test_after_a_jump_the_meter_shows_the_settings_of_the_reply_in_view():
    """The session's settings are its last reply's (block 8): gone back to an earlier reply, the meter
    shows that reply's figures beside its own settings (block 16, target only), never the last's."""
    from dflash_tui.ui.replay_screen import ReplayApp

    session = trace_session()
    session.settings["block_size"] = 8
    last = session.messages[6]  # ran at block 8
    next(e for e in last.trace if e.get("type") == "done")["stats"]["block_size"] = 8
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await _play_to_the_end(app, pilot)
        assert "7.55 tokens/cycle" in _meter_text(app) and "block 8 " in _meter_text(app), _meter_text(app)
        await pilot.press("p")  # the last reply from its start: the baseline reply's figures in view
        await pilot.pause(0.2)
        body = _meter_text(app)
        assert app.screen.player.current_message == 6
        assert "target only" in body.splitlines()[-1] and "block" not in body, body
        await pilot.press("p", "p")  # back to the baseline reply: the first DFlash reply's figures
        await pilot.pause(0.2)
        body = _meter_text(app)
        assert app.screen.player.current_message == 4
        assert "5.08 tokens/cycle" in body and "block 16 " in body, body
        await pilot.press("right")  # into the baseline reply: its own settings
        await pilot.pause(0.1)
        assert "target only" in _meter_text(app).splitlines()[-1], _meter_text(app)


async def test_a_reply_stopped_in_its_prefill_replays_with_the_block_size_it_ran_with():
    """No cycle, so its Done has no block size: the session's (4) is the one it ran with, not "auto"."""
    from dflash_tui.ui.replay_screen import ReplayApp

    session = trace_session()
    session.settings["block_size"] = 4
    last = session.messages[6]
    stopped = {"mode": "dflash", "prompt_tokens": 247, "cached_tokens": 231, "prefill_s": 0.02, "ttft_s": 0.02,
               **{k: 0 for k in ("generated_tokens", "decode_s", "decode_tps", "cycles", "tokens_per_cycle",
                                 "acceptance", "draft_ms", "verify_ms", "rollback_ms", "prefill_tps")}}
    last.trace = [{"t": 0.02, **event_to_dict(Done([], "", "cancelled", stopped))}]
    last.content = ""
    for recorded in ({}, {"block_size": None}):  # no block size, or None: the session's
        last.trace[0]["stats"] = {**stopped, **recorded}
        app = ReplayApp(session, paused=True, theme="textual-dark")
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            await _play_to_the_end(app, pilot)
            body = _meter_text(app)
            assert "block 4 " in body and "auto" not in body, body


async def test_the_peak_memory_is_the_reply_in_views_from_its_start():
    """While a reply plays, the meter's peak is the one the live meter showed for it (the peak since load,
    this reply's included), from its first cycle: not the replies before it until it ends."""
    from dflash_tui.ui.figure_text import fmt_bytes
    from dflash_tui.ui.replay_screen import ReplayApp

    session = trace_session()
    peaks = [m.done().stats["peak_memory"] for m in session.replies()]
    assert peaks[2] > peaks[0] > peaks[1]  # the last reply's peak is the highest
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await pilot.press("right")  # the first cycle of the first reply
        await pilot.pause(0.1)
        assert f"{fmt_bytes(peaks[0])} peak" in _meter_text(app), _meter_text(app)
        await pilot.press("n", "n", "n", "right")  # the first cycle of the last reply
        await pilot.pause(0.1)
        assert app.screen.player.current_message == 6
        assert f"{fmt_bytes(peaks[2])} peak" in _meter_text(app), _meter_text(app)
        await _play_to_the_end(app, pilot)  # and the same once it is done
        assert f"{fmt_bytes(peaks[2])} peak" in _meter_text(app), _meter_text(app)
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:  # the baseline reply: lower than the one before
        await pilot.pause()
        await pilot.press("n", "n", "n", "n", "right")  # the first cycle of the baseline reply
        await pilot.pause(0.1)
        assert app.screen.player.current_message == 4
        assert f"{fmt_bytes(peaks[0])} peak" in _meter_text(app), _meter_text(app)


# -- a reply that failed (an error, no Done) -----------------------------------------------------------
def _with_a_failed_reply(index: int) -> Session:
    """The recorded session with reply `index` broken off after four cycles: an error and no Done, as a
    stream that broke off mid-reply ends (a DFlash reply's prefill and first cycles, then the error)."""
    from dflash_tui.engine.events import Error

    session = trace_session()
    part = [dict(e) for e in session.messages[6].trace[:5]]
    assert [e["type"] for e in part] == ["prefill"] + ["block"] * 4
    reply = session.messages[index]
    reply.trace = part + [{"t": part[-1]["t"] + 0.01, **event_to_dict(Error("the server's stream is broken"))}]
    reply.content = "".join(e["text"] for e in part[1:])
    return session


def _meter_whole(app) -> str:
    """The meter as it reads: its head (tok/s) and body."""
    return "\n".join(str(w.render()) for w in app.screen.meter.query("MeterText"))


async def test_a_failed_reply_played_leaves_the_figures_before_it_and_says_so():
    """Played through, a reply that failed measured nothing: the meter goes back to the reply before it
    (as the live meter did), figures and settings, and says the reply in view failed."""
    from dflash_tui.ui.figure_text import fmt_rate
    from dflash_tui.ui.replay_screen import ReplayApp

    session = _with_a_failed_reply(6)
    before = session.messages[4].done().stats  # the target-only reply
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await pilot.press("n", "n", "n", "n", "n", "n", "right", "right")  # two cycles into the failed reply
        await pilot.pause(0.1)
        meter = app.screen.meter
        assert meter.state.generating and "this turn" in _meter_whole(app) and not meter.border_subtitle
        await _play_to_the_end(app, pilot)
        text = _meter_whole(app)
        assert not meter.state.generating, text
        assert f"{fmt_rate(before['decode_tps'])} tok/s last turn" in text, text
        assert "target only" in text.splitlines()[-1], text  # its settings too (block 1)
        assert meter.border_subtitle == "reply failed: figures from before"


async def test_jumps_around_a_failed_reply_say_whose_figures_the_meter_shows():
    """Jumped to, a reply in view that failed has no figures: the meter shows the ones before it and
    says so; the reply before it in view, or the next one played, and it says nothing of the kind."""
    from dflash_tui.ui.replay_screen import ReplayApp

    app = ReplayApp(_with_a_failed_reply(4), paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        meter = app.screen.meter
        await pilot.press("n", "n", "n", "n", "n")  # the message after the failed reply
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 5
        body = _meter_text(app)
        assert "5.08 tokens/cycle" in body and "block 16 " in body, body  # the first reply's
        assert meter.border_subtitle == "reply failed: figures from before"
        await pilot.press("p")  # the failed reply from its start: the first reply in view
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 4
        assert "5.08 tokens/cycle" in _meter_text(app) and not meter.border_subtitle
        await pilot.press("right")  # its first cycle: its own figures, streaming
        await pilot.pause(0.1)
        assert meter.state.generating and not meter.border_subtitle
        await _play_to_the_end(app, pilot)  # past it, the last reply's figures
        assert "7.55 tokens/cycle" in _meter_text(app) and not meter.border_subtitle, _meter_text(app)
        await pilot.press("p")  # the last reply from its start: the failed one in view again
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 6
        assert "5.08 tokens/cycle" in _meter_text(app), _meter_text(app)
        assert meter.border_subtitle == "reply failed: figures from before"
    app = ReplayApp(_with_a_failed_reply(2), paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:  # the first reply failed: nothing before it
        await pilot.pause()
        await pilot.press("n", "n", "n")
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 3
        assert "— tok/s" in _meter_whole(app) and app.screen.meter.border_subtitle == "reply failed: no figures"
    session = trace_session()
    session.messages[4].trace = None  # a reply kept as text alone (a session continued on another engine)
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await pilot.press("n", "n", "n", "n", "n")  # the message after it
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 5
        assert "5.08 tokens/cycle" in _meter_text(app), _meter_text(app)
        assert app.screen.meter.border_subtitle == "none recorded: figures from before"


# -- the meter at a jump: as the live one read there, on the branch in view --------------------------
def _stats_of(reply) -> dict:
    return next(e for e in reply.trace if e.get("type") == "done")["stats"]


def _branched_session() -> Session:
    """The recorded session as the app saves it now: each reply with the target-alone figure its speedup
    divided by (the first had none: the /baseline reply measured the first); the last reply's prompt
    mostly cached. That reply was then regenerated as a /baseline reply that measured the target alone
    at 400 tok/s (the session's own figure, the app's last), and the view went back to the first
    version, which a user message follows."""
    session = trace_session()
    m = session.messages
    measured = m[4].done().stats["decode_tps"]
    for i, baseline in ((2, None), (4, measured), (6, measured)):
        _stats_of(m[i]).pop("baseline_tps", None)
        if baseline:
            _stats_of(m[i])["baseline_tps"] = baseline
    prefill = next(e for e in m[6].trace if e.get("type") == "prefill")
    prefill["cached_tokens"] = _stats_of(m[6])["cached_tokens"] = 240  # 7 new tokens: too few to time
    first = m[6]
    other = [{"t": 0.01, **event_to_dict(Prefill(247, 240, 0.01))},
             {"t": 0.2, **event_to_dict(Done([5] * 40, "b" * 40, "stop", {
                 "mode": "baseline", "decode_tps": 400.0, "generated_tokens": 40, "prompt_tokens": 247,
                 "cached_tokens": 240, "baseline_tps": 400.0, "block_size": 1}))}]
    session.regenerate_reply("b" * 40, other)
    session.tree.select(first.id)  # back to the first version: the branch in view
    session.baseline_tps = 400.0
    session.add_message("user", "thanks")
    assert session.messages[6] is first and len(session.messages) == 8
    return session


async def test_a_jump_shows_the_meter_as_the_live_one_read_there_on_the_branch_in_view():
    """Jumped past a reply, the meter shows that reply's prefill ("cached") and the speedup by the live
    meter's rule, divided by the target-alone figure that reply recorded (none: no speedup), never
    an earlier reply's prefill or a figure measured on another branch; as played through to there."""
    from dflash_tui.ui.replay_screen import ReplayApp

    session = _branched_session()
    last = session.messages[6].done().stats
    speedup = f"{last['decode_tps'] / last['baseline_tps']:.2f}× vs"
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await pilot.press(*"nnnnnnn")  # the message after the last reply
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 7
        jumped = _meter_text(app)
        assert "prefill cached" in jumped and speedup in jumped and "last full reply" not in jumped, jumped
        await pilot.press("p", "p", "p", "p")  # the message after the first reply: no baseline then
        await pilot.pause(0.2)
        assert app.screen.player.current_message == 3
        assert "— speedup" in _meter_text(app) and "×" not in _meter_text(app), _meter_text(app)
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:  # played through: the same meter
        await pilot.pause()
        await _play_to_the_end(app, pilot)
        assert _meter_text(app) == jumped


async def test_played_instantly_the_meter_draws_the_replys_graph():
    """All of a reply's cycles at once (instant) draw its tok/s graph, as playing it at 1× does."""
    from textual.widgets import Sparkline

    from dflash_tui.ui.replay_screen import ReplayApp

    session = trace_session()
    app = ReplayApp(session, paused=True, theme="textual-dark")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await _play_to_the_end(app, pilot)
        spark = app.screen.meter.query_one(Sparkline)
        assert len(app.screen.meter.state.samples) > 1 and len(spark.data) > 1, spark.data
        assert spark.styles.visibility == "visible"
