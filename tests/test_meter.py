"""The system meter: its figures, measured speedup only, no MLX, compact and wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.harness import PanesApp, trace_session
from dflash_tui.engine.events import Block, Done, Prefill
from dflash_tui.ui.figure_text import fmt_bytes, fmt_rate, sampling_label, short_name
from dflash_tui.ui.meter import MeterState, SystemMeter

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.anyio


def _blocks(n: int, tokens: int = 3) -> list[Block]:
    return [Block(i, [1] * 15, tokens - 1, [1] * tokens, "x") for i in range(n)]


def test_speed_tokens_per_cycle_and_prefill():
    s = MeterState()
    s.on_prefill(Prefill(prompt_tokens=120, cached_tokens=20, seconds=0.5))
    assert s.prefill_tps == pytest.approx(200.0) and s.ttft_s == 0.5 and s.generating
    s.on_blocks(_blocks(10), 0.5)  # 30 tokens in 0.5 s
    s.on_blocks(_blocks(10, tokens=5), 0.5)  # 50 tokens in 0.5 s
    assert s.tps == pytest.approx(80.0)
    assert s.live_tps == pytest.approx(80.0)  # both batches fit in the one-second window
    assert s.tokens_per_cycle == pytest.approx(4.0)
    s.on_blocks(_blocks(10), 1.0)
    assert s.live_tps == pytest.approx(30.0)  # the window moved on
    s.on_done(Done([1] * 110, "", "stop", {"mode": "dflash", "decode_tps": 75.0, "cycles": 30,
                                             "tokens_per_cycle": 3.6, "ttft_s": 0.51, "peak_memory": 2048}))
    assert not s.generating and s.tps == 75.0 and s.tokens_per_cycle == 3.6 and s.ttft_s == 0.51
    assert s.turns == [75.0] and s.peak_bytes == 2048


def test_speedup_only_from_a_measured_baseline():
    s = MeterState()
    s.on_prefill(Prefill(10, 0, 0.1))
    s.on_blocks(_blocks(10), 0.3)
    assert s.speedup is None  # no baseline measured: no guess
    s.baseline_tps = 25.0
    assert s.speedup == pytest.approx(4.0)
    s.on_done(Done([], "", "stop", {"mode": "baseline", "decode_tps": 25.0}))
    assert s.speedup is None and s.mode == "baseline"  # a target-only turn has no speedup over itself


def test_number_formats():
    assert fmt_rate(None) == "—" and fmt_rate(142.3) == "142" and fmt_rate(41.26) == "41.3" and fmt_rate(4.1) == "4.10"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(3 * 1024 ** 3) == "3.0 GiB" and fmt_bytes(1536, short=True) == "1.5K"
    assert fmt_bytes(None) == "—"
    assert sampling_label({"temperature": 0.0}) == "greedy"
    assert sampling_label({"temperature": 0.7, "top_p": 0.9, "top_k": 20}) == "temp 0.7 top-p 0.9 top-k 20"
    assert sampling_label({"temperature": 0.7, "min_p": 0.05}) == "temp 0.7 min-p 0.05"
    assert short_name("/models/cache/Qwen3-8B-4bit") == "Qwen3-8B-4bit" and short_name("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    from dflash_tui.demo import demo_draft_path, demo_target_path
    from dflash_tui.model_names import draft_label

    # the demo pair by its name, never its install path; its draft does not repeat that name
    assert short_name(str(demo_target_path())) == "demo (offline)"
    assert draft_label(str(demo_target_path()), str(demo_draft_path())) == "its draft"
    assert draft_label("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16") == "z-lab/Qwen3-8B-DFlash-b16"


def test_meter_replay_and_acceptance_modules_do_not_import_mlx():
    code = ("import sys; import dflash_tui.ui.meter, dflash_tui.ui.acceptance, dflash_tui.replay, "
            "dflash_tui.ui.replay_screen, dflash_tui.ui.sessions_screen, dflash_tui.commands.replay; "
            "bad = [m for m in sys.modules if m == 'mlx' or m.startswith('mlx.') or m.startswith('mlx_lm')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


async def test_compact_below_sixty_columns_and_wide_above():
    async with PanesApp().run_test(size=(80, 24)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("/models/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "gpu · Apple M3 Max")
        meter.set_baseline_tps(30.0)
        meter.on_prefill(Prefill(100, 0, 0.2))
        meter.on_blocks(_blocks(10), 0.25)
        await pilot.pause()
        compact = "\n".join(str(meter._body.render()).splitlines())
        assert meter.size.width < 60 and "speedup" in compact and "tok/cyc" in compact
        assert "4.00× speedup" in compact  # 120 tok/s over 30
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_baseline_tps(None)
        await pilot.pause()
        wide = str(meter._body.render())
        assert meter.size.width >= 60 and "no baseline measured yet" in wide


async def test_drafting_slower_than_the_target_alone_is_said_plainly():
    for size, slower_words in (((80, 24), "0.40×: slower than target alone"),
                               ((160, 48), "0.40× vs 300 tok/s target alone: drafting is slower here")):
        async with PanesApp().run_test(size=size) as pilot:
            meter = pilot.app.query_one(SystemMeter)
            meter.set_pair("/models/demo", "/models/demo-draft", "cpu")
            meter.set_baseline_tps(300.0)
            meter.on_prefill(Prefill(100, 0, 0.2))
            meter.on_blocks(_blocks(10), 0.25)  # 120 tok/s
            await pilot.pause()
            body = str(meter._body.render())
            assert slower_words in body and "speedup" not in body.split("\n")[0], body
            width = meter._body.content_region.width
            assert all(len(line) <= width for line in body.splitlines()), (width, body)  # nothing cut off
            lines = body.splitlines()  # the settings keep their line, inside the meter's fixed height
            assert lines[-1].startswith(("B ", "block ")) and len(lines) <= meter._body.size.height, body
            meter.set_baseline_tps(119.6)  # 1.003x shows as 1.00x: not "slower"
            await pilot.pause()
            body = str(meter._body.render())
            assert "1.00×" in body and "slower" not in body, body


async def test_target_only_is_said_plainly_with_no_draft_and_when_the_sizer_drops_to_block_1():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("mlx-community/Qwen3-14B-4bit", None, "cpu", no_draft="none known for qwen3-14b")
        meter.set_settings({"block_size": 1, "temperature": 0.0, "mode": "dflash"})
        meter.on_done(Done([1, 2], "", "stop", {"mode": "baseline", "decode_tps": 20.0}))
        await pilot.pause()
        body = str(meter._body.render())
        assert "target only (no draft: none known for qwen3-14b)" in body and "(baseline)" not in body
        assert body.splitlines()[-1].startswith("target only")  # no block size where nothing drafts

        # with a draft, an adaptive block size that chooses a target-alone step says so
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        meter.set_settings({"block_size": "auto", "temperature": 0.0, "mode": "dflash"})
        meter.on_prefill(Prefill(10, 0, 0.1))
        meter.on_blocks([Block(0, [], 0, [5], "a"), Block(1, [1, 2, 3], 3, [1, 2, 3, 4], "b")], 0.2)
        await pilot.pause()
        assert "block auto (now 4)" in str(meter._body.render())
        meter.on_blocks([Block(2, [], 0, [6], "c")], 0.1)
        await pilot.pause()
        body = str(meter._body.render())
        assert "block auto (now 1: target alone)" in body and "no draft" not in body


def _body(meter: SystemMeter) -> str:
    return str(meter._body.render())


def _text(meter: SystemMeter) -> str:
    """Every line of the meter as drawn: the speed line, the graph's and the body."""
    return "\n".join(str(w.render()) for w in meter.query("MeterText"))


def _style_of(meter: SystemMeter, needle: str):
    text = meter._body.render()
    start = text.plain.index(needle)
    return next(span.style for span in text.spans if span.start <= start < span.end)


async def test_the_probe_speedup_shows_once_measured_and_is_coloured_by_value():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        await pilot.pause()  # laid out: the wide labels
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        meter.set_settings({"block_size": "auto", "mode": "dflash"})
        assert "— speedup (no baseline measured yet)" in _body(meter)
        meter.set_baseline_tps(25.0)
        assert "— speedup (DFlash not measured yet)" in _body(meter)
        meter.set_probe_tps(50.0)  # no reply yet: the probe's own figure
        assert "2.00× vs 25.0 tok/s target alone (probe)" in _body(meter)
        assert _style_of(meter, "2.00×") == meter._body.style("good")
        meter.set_probe_tps(20.0)  # slower than the target alone: a warning, never green
        assert "0.80× vs 25.0 tok/s target alone (probe)" in _body(meter)
        assert _style_of(meter, "0.80×") == meter._body.style("warn") != meter._body.style("good")
        await pilot.pause()


def _turn(meter: SystemMeter, tokens: int, seconds: float, finish: str = "stop") -> None:
    meter.on_prefill(Prefill(40, 0, 0.1))
    meter.on_blocks([Block(i, [1] * 3, 3, [1] * 4, "x") for i in range(tokens // 4)], seconds)
    meter.on_done(Done([1] * tokens, "", finish, {"mode": "dflash", "decode_tps": tokens / seconds,
                                                   "generated_tokens": tokens, "cycles": tokens // 4,
                                                   "tokens_per_cycle": 4.0}))


async def test_a_stopped_or_short_reply_does_not_replace_the_speedup():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        await pilot.pause()  # laid out: the wide labels
        meter.set_settings({"block_size": 16, "mode": "dflash"})
        meter.set_baseline_tps(25.0)
        meter.set_probe_tps(40.0)
        _turn(meter, 40, 0.5)  # 80 tok/s over 40 tokens: a full reply replaces the probe's figure
        assert "3.20× vs 25.0 tok/s target alone" in _body(meter) and "(probe)" not in _body(meter)
        _turn(meter, 8, 1.0)  # 8 tokens: too short to time the pair
        assert "3.20× vs 25.0 tok/s target alone (last full reply)" in _body(meter)
        _turn(meter, 40, 4.0, finish="cancelled")  # stopped with Esc
        assert "3.20× vs 25.0 tok/s target alone (last full reply)" in _body(meter)
        assert meter.state.tps == pytest.approx(10.0)  # the turn's own speed is still shown above
        # while a reply streams, its own figure once it has 16 tokens, the kept one before
        meter.on_prefill(Prefill(40, 0, 0.1))
        meter.on_blocks([Block(1, [1] * 3, 3, [1] * 4, "x")] * 3, 0.1)  # 12 tokens
        assert "3.20× vs 25.0 tok/s target alone (last full reply)" in _body(meter)  # not this reply's: said so
        meter.on_blocks([Block(2, [1] * 3, 3, [1] * 4, "x")] * 2, 0.1)  # 20 tokens in 0.2 s
        assert "4.00× vs 25.0 tok/s target alone" in _body(meter) and "(last full reply)" not in _body(meter)
        await pilot.pause()


async def test_a_one_token_reply_has_no_speed_and_the_graph_is_each_replys_own():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        meter.set_settings({"block_size": 16, "mode": "dflash"})
        _turn(meter, 40, 0.5)
        assert meter.state.samples  # the reply's live speed as it went
        meter.on_prefill(Prefill(40, 0, 0.1))
        assert not meter.state.samples  # a new reply starts its own graph
        meter.on_blocks([Block(0, [], 0, [7], "x")], 0.05)  # the prefill's token, and that is all
        meter.on_done(Done([7], "x", "length", {"mode": "dflash", "generated_tokens": 1, "cycles": 0,
                                                 "decode_tps": 0.0}))
        assert meter.state.tps is None and not meter.state.samples  # nothing after the first token to time
        assert "0.00 tok/s" not in _text(meter)
        await pilot.pause()


async def test_a_failed_reply_leaves_every_figure_as_it_was_before_it():
    """A reply that ends in an error (TurnFailed, no Done) measured nothing: the head, the speedup, the
    prefill and the sparkline read as before it, not its own speed frozen mid-reply as if live."""
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        await pilot.pause()  # laid out: the wide labels
        meter.set_settings({"block_size": 16, "mode": "dflash"})
        meter.set_baseline_tps(25.0)
        _turn(meter, 40, 0.5)  # 80 tok/s: 3.20×
        head, body = str(meter._head.render()), _body(meter)
        samples = list(meter.state.samples)
        assert "80.0 tok/s last turn" in head and "3.20× vs 25.0 tok/s target alone" in body
        meter.on_prefill(Prefill(400, 0, 2.0))  # a slow reply that then fails mid-way
        meter.on_blocks([Block(i + 1, [1] * 3, 3, [1] * 4, "x") for i in range(8)], 4.0)  # 32 tokens, 8 tok/s
        assert "0.32×" in _body(meter) and "live" in str(meter._head.render())
        meter.on_failed()
        assert str(meter._head.render()) == head and _body(meter) == body
        assert not meter.state.generating and meter.state.speedup_figure == (pytest.approx(3.2), "turn")
        assert list(meter.state.samples) == samples and meter.state.before_turn is None
        meter.on_failed()  # a turn that fails before its prefill (nothing of it reached the meter)
        assert str(meter._head.render()) == head and _body(meter) == body
        _turn(meter, 40, 0.25)  # the next full reply counts as ever
        assert "6.40× vs 25.0 tok/s target alone" in _body(meter) and meter.state.turns == [80.0, 160.0]
        await pilot.pause()


async def test_prefill_speed_only_from_sixteen_new_tokens_else_cached():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        await pilot.pause()  # laid out: the wide labels
        meter.on_prefill(Prefill(prompt_tokens=48, cached_tokens=0, seconds=0.1))
        assert "prefill 480 tok/s" in _body(meter)
        meter.on_done(Done([1], "", "stop", {"mode": "dflash", "prefill_tps": 480.0, "prompt_tokens": 48,
                                             "cached_tokens": 0}))
        meter.on_prefill(Prefill(prompt_tokens=300, cached_tokens=290, seconds=0.02))  # 10 new tokens
        assert "prefill cached · ttft 20 ms · 300 prompt (290 cached)" in _body(meter)
        meter.on_done(Done([1], "", "stop", {"mode": "dflash", "prefill_tps": 500.0, "prompt_tokens": 300,
                                             "cached_tokens": 290}))
        assert "prefill cached" in _body(meter) and "500" not in _body(meter)
        meter.on_prefill(Prefill(prompt_tokens=14, cached_tokens=3, seconds=0.07))  # a short new prompt: no speed
        assert "prefill — tok/s · ttft 70 ms · 14 prompt (3 cached)" in _body(meter)
        await pilot.pause()


async def test_block_auto_shows_the_sizers_next_choice_within_the_drafts_size():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        await pilot.pause()  # laid out: the wide labels
        meter.set_settings({"block_size": "auto", "max_block": 8, "mode": "dflash"})
        meter.on_prefill(Prefill(40, 0, 0.1))
        meter.on_blocks([Block(1, [1] * 11, 2, [1] * 3, "x")], 0.1)  # a cycle of 12, past the draft's 8
        assert "block auto (now 8)" in _body(meter)
        meter.set_sizer_plan(6)
        assert "block auto (next 6)" in _body(meter)
        meter.set_sizer_plan(1)
        assert "block auto (next 1: target alone)" in _body(meter)
        await pilot.pause()


async def test_a_new_pair_resets_every_figure_and_a_session_the_turns():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        await pilot.pause()  # laid out: the wide labels
        meter.set_settings({"block_size": "auto", "mode": "dflash", "max_block": 16})
        meter.set_baseline_tps(25.0)
        meter.set_probe_tps(40.0)
        meter.set_sizer_plan(8)
        _turn(meter, 40, 0.5)
        meter.reset_turns()  # a session opened on the same pair
        assert meter.state.turns == [] and meter.state.tps is None and meter.state.kept_tps is None
        assert "1.60× vs 25.0 tok/s target alone (probe)" in _body(meter)  # the pair's own figures stay
        meter.reset_pair()  # another pair
        state = meter.state
        assert (state.baseline_tps, state.probe_tps, state.next_block, state.turns, state.prefill_tps) == (
            None, None, None, [], None)
        assert state.settings["max_block"] == 16
        await pilot.pause()


def _feed_mid_reply(app) -> None:
    """The first reply, two thirds of the way through, as the worker would feed it."""
    session = trace_session()
    meter = app.query_one(SystemMeter)
    meter.set_pair("mlx-community/Qwen3-8B-4bit", "z-lab/Qwen3-8B-DFlash-b16", "gpu · Apple M3 Max")
    meter.set_settings({"block_size": 16, "temperature": 0.0, "max_tokens": 512, "mode": "dflash"})
    meter.set_baseline_tps(session.baseline_tps)
    meter.set_memory(5_400_000_000, 6_100_000_000, 6_900_000_000)
    reply = session.messages[6]
    last = 0.0
    for entry, ev in zip(reply.trace, reply.events()):
        if isinstance(ev, Prefill):
            meter.on_prefill(ev)
            last = entry["t"]
        elif isinstance(ev, Block) and ev.index <= 10:
            meter.on_blocks([ev], entry["t"] - last)
            last = entry["t"]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot_meter_mid_reply(snap_compare, size):
    assert snap_compare(PanesApp(feed=_feed_mid_reply), terminal_size=size)


@pytest.mark.parametrize("columns", [143, 146])
async def test_no_wide_line_is_cut_off(columns):
    """At the narrowest wide meters: a slow last full reply and a long, mostly cached prompt are never cut
    (prefill takes the line the body keeps spare; "drafting is slower here" shortens; the cached count goes
    where nothing else fits; the pair's names lose their owners before the device is cut)."""
    async with PanesApp().run_test(size=(columns, 45)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        await pilot.pause()  # laid out: the wide labels
        width = meter._body.content_region.width
        assert 60 <= width < 64, width  # the narrowest wide meters
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "gpu · Apple M3 Max")
        meter.set_settings({"block_size": 16, "mode": "dflash", "max_tokens": 4096})
        meter.set_baseline_tps(2500.0)
        _turn(meter, 40, 0.5)  # 80 tok/s: far slower than the target alone
        _turn(meter, 8, 1.0)  # too short to time: the last full reply's figure stays
        meter.on_prefill(Prefill(32768, 32000, 1.5))
        await pilot.pause()
        lines = _body(meter).splitlines()
        assert all(len(line) <= width for line in lines), (width, lines)
        assert lines[0] == "0.03× vs 2500 tok/s target alone (last full reply): slower", lines
        wide_enough = width >= len("prefill 512 tok/s · ttft 1.50 s · 32768 prompt (32000 cached)")
        assert lines[2] == "prefill 512 tok/s · ttft 1.50 s · 32768 prompt" + (" (32000 cached)" if wide_enough else ""), lines
        assert lines[-2] == "Qwen3-8B ← Qwen3-8B-DFlash-b16 · gpu · Apple M3 Max", lines  # the names, not the device, shorten
        assert lines[-1].startswith("block 16") and len(lines) <= meter._body.size.height, lines


async def test_the_narrow_meter_says_where_its_speedup_is_from():
    async with PanesApp().run_test(size=(80, 24)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        await pilot.pause()
        width = meter._body.content_region.width
        assert width < 60  # the narrow labels
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        meter.set_settings({"block_size": 16, "mode": "dflash"})
        meter.set_baseline_tps(25.0)
        meter.set_probe_tps(20.0)  # slower, from the probe
        first = _body(meter).splitlines()[0]
        assert first.startswith("0.80× (probe): slower") and len(first) <= width, first
        _turn(meter, 40, 4.0)  # 10 tok/s over a full reply
        _turn(meter, 8, 1.0)  # too short: the full reply's figure stays, and says so
        first = _body(meter).splitlines()[0]
        assert first.startswith("0.40× (last full reply): slower") and len(first) <= width, first
        meter.set_baseline_tps(5.0)
        first = _body(meter).splitlines()[0]
        assert first.startswith("2.00× speedup (last full reply)") and len(first) <= width, first
        await pilot.pause()


def test_the_live_speed_counts_the_tokens_after_the_first_as_the_engines_does():
    """The engine's tok/s is the tokens after the first (the prefill's, block 0) over the time since it;
    the live figure is the same, so it does not jump when the engine's replaces it."""
    s = MeterState()
    s.on_prefill(Prefill(prompt_tokens=40, cached_tokens=0, seconds=0.2))
    first = Block(0, [], 0, [5], "a")  # the prefill's token: nothing drafted
    s.on_blocks([first, *_blocks(4)[1:]], 0.5)  # then 3 cycles of 3 tokens
    assert s.tps == pytest.approx(9 / 0.5)
    s.on_blocks([Block(4, [], 0, [6], "b")], 0.5)  # a target-alone step later on counts
    assert s.tps == pytest.approx(10 / 1.0) and s.turn_tokens == 10


def _contrast(a: tuple, b: tuple) -> float:
    def lum(c: tuple) -> float:
        def ch(v: float) -> float:
            v /= 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
        return 0.2126 * ch(c[0]) + 0.7152 * ch(c[1]) + 0.0722 * ch(c[2])
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


async def test_the_meters_coloured_figures_are_readable_in_every_theme_offered():
    """Bold figures at 3:1 against the meter's background at least, light themes included (textual-light drew
    the warning figure at 1.5:1); ansi-* themes take the terminal's own colours and cannot be measured."""
    from dflash_tui.ui.themes import load_themes

    app = PanesApp()
    async with app.run_test(size=(120, 40)) as pilot:
        for theme in load_themes()[0]:
            app.register_theme(theme)
        body = app.query_one(SystemMeter)._body
        low = []
        for name in sorted(t for t in app.available_themes if not t.startswith("ansi")):
            app.theme = name
            await pilot.pause()
            background = body.background_colors[1].rgb
            for figure in ("big", "good", "warn"):
                ratio = _contrast(tuple(body.style(figure).color.get_truecolor()), background)
                if ratio < 3.0:
                    low.append((name, figure, round(ratio, 2)))
        assert not low, low
