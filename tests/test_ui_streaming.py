"""A streaming reply costs the engine little: a plain tail per batch, Markdown at a low rate, panes that repaint seldom."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets._markdown import MarkdownFence

from dflash_tui.engine.events import Block, Done, Prefill
from ui_support import FakeConversation
from dflash_tui.ui import messages as msg
from dflash_tui.ui.chat_view import ChatView
from dflash_tui.ui.reply_text import display_text, open_fence_start
from dflash_tui.ui.meter import SystemMeter
from dflash_tui.ui.throttle import Throttle
from dflash_tui.ui.worker import EngineWorker, Generate

pytestmark = pytest.mark.anyio


class Host(App):
    CSS_PATH = str(Path(__file__).resolve().parents[1] / "dflash_tui" / "ui" / "app.tcss")  # the app's message styles

    def compose(self):
        yield ChatView()


def stream(app: Host, markdown_interval: float):
    handle = app.query_one(ChatView).start_assistant()
    handle.markdown_interval = markdown_interval
    return handle


async def test_a_reply_of_bare_code_streams_in_the_tail_and_is_parsed_once_at_the_end():
    async with Host().run_test(size=(100, 40)) as pilot:
        handle = stream(pilot.app, markdown_interval=0)  # prose would be parsed on every batch
        handle.append("def count_lines(path):\n    with open(path) as f:\n")
        await handle.written()
        message = handle.message
        # bare code is one open code block: it grows in the tail, never re-parsed or re-highlighted
        assert message.body.source == "" and message.tail.has_class("-code")
        assert message.tail_text == "def count_lines(path):\n    with open(path) as f:\n"
        for piece in ["        lines = f.read", "lines()\n", "        return len(", "lines)\n    # done"]:
            handle.append(piece)
            await handle.written()
        await pilot.pause()
        assert message.body.source == "" and not message.query(MarkdownFence)
        assert message.tail_text == handle.text  # every line so far, in the code-shaped tail
        assert message.tail.display and message.tail.has_class("-code")
        await handle.finish(footer="3 tokens")
        await pilot.pause()
        full = handle.text
        assert message.body.source == display_text(full)  # the final rendering: the whole reply as Markdown
        assert [f.code for f in message.query(MarkdownFence)] == [full.rstrip("\n")]
        assert not message.tail.display and message.tail_text == ""


async def test_markdown_catches_up_with_whole_lines_once_the_interval_has_passed():
    async with Host().run_test(size=(100, 40)) as pilot:
        handle = stream(pilot.app, markdown_interval=0)
        for piece in ["Here is the plan.\n\nFirst, op", "en the file.\nThen count."]:
            handle.append(piece)
            await handle.written()
        assert handle.message.body.source == "Here is the plan.\n\nFirst, open the file.\n"
        assert handle.message.tail_text == "Then count."  # a line not yet whole stays in the tail
        assert not handle.message.tail.has_class("-code")  # prose, not code
        await pilot.pause()


async def test_a_code_block_grows_in_the_tail_and_goes_into_the_markdown_once_closed():
    async with Host().run_test(size=(100, 40)) as pilot:
        handle = stream(pilot.app, markdown_interval=3600)  # prose waits; a code block's edges do not
        handle.append("Sure:\n```python\nimport os")
        await handle.written()
        message = handle.message
        assert message.body.source == "Sure:\n"  # the prose before a block that opens goes up at once
        assert message.tail_text == "import os" and message.tail.has_class("-code")
        handle.append("\nprint(os.sep)\n")
        await handle.written()
        assert message.body.source == "Sure:\n"  # still open: not parsed, however many lines it has
        assert message.tail_text == "import os\nprint(os.sep)\n" and message.tail.has_class("-code")
        handle.append("```\nThat prints the separator")
        await handle.written()
        await pilot.pause()
        # closed: parsed once, at once; the unfinished line after it is plain tail
        assert message.body.source == "Sure:\n```python\nimport os\nprint(os.sep)\n```\n"
        assert [f.code for f in message.query(MarkdownFence)] == ["import os\nprint(os.sep)"]
        assert message.tail_text == "That prints the separator" and not message.tail.has_class("-code")
        handle.append(".\nIt is / on Linux.\n")
        await handle.written()
        assert message.body.source.endswith("```\n")  # prose waits out the interval again
        await pilot.pause()


async def test_a_reply_cut_short_keeps_everything_it_streamed():
    async with Host().run_test(size=(100, 40)) as pilot:
        handle = stream(pilot.app, markdown_interval=3600)
        text = "def f(x):\n    return x\n\ndef g(y):\n    retu"
        for i in range(0, len(text), 7):
            handle.append(text[i:i + 7])
            await handle.written()
        assert handle.message.body.source != display_text(text)  # part of it was only in the tail
        await handle.finish(None, "failed")  # no final text from the engine: what streamed is the reply
        await pilot.pause()
        assert handle.message.body.source == display_text(text)
        assert handle.message.raw_text == text and not handle.message.tail.display


def test_open_fence_start():
    def open_fence(markdown: str) -> bool:
        return open_fence_start(markdown) is not None

    assert open_fence("```python\nx = 1\n")
    assert not open_fence("```python\nx = 1\n```\n")
    assert open_fence("~~~\na\n```\n")  # a backtick line does not close a tilde fence
    assert not open_fence("````\na\n```\n````\n")
    assert not open_fence("use ```x``` inline\n")  # backticks in the info string: not a fence
    assert not open_fence("plain text\n")
    assert open_fence_start("Sure:\n```python\nx = 1\n") == len("Sure:\n")
    assert open_fence_start("a\n```\nb\n```\n~~~\nc") == len("a\n```\nb\n```\n")  # the open one, not the first
    assert open_fence_start("a\n```\nb\n```\n") is None


def test_throttle_runs_at_once_then_folds_calls_until_the_interval_is_over():
    calls = []
    throttle = Throttle(lambda: calls.append(1), interval=3600)
    throttle()
    throttle()
    throttle()
    assert calls == [1] and throttle.pending
    throttle.now()
    assert calls == [1, 1] and not throttle.pending
    every = Throttle(lambda: calls.append(2))
    every()
    every()
    assert calls[-2:] == [2, 2]


def test_throttle_draws_a_folded_call_once_at_the_end_of_the_interval():
    calls, timers = [], []
    throttle = Throttle(lambda: calls.append(len(calls)), interval=0.2, later=lambda d, cb: timers.append((d, cb)) or cb)
    throttle()
    throttle()
    throttle()
    assert calls == [0] and len(timers) == 1  # two folded calls, one trailing call scheduled
    delay, trailing = timers[0]
    assert 0 < delay <= 0.2
    trailing()
    assert calls == [0, 1] and not throttle.pending  # the last state is drawn without another call
    trailing()
    assert calls == [0, 1]  # nothing pending: a stale timer draws nothing
    unscheduled = Throttle(lambda: calls.append(9), interval=3600, later=lambda d, cb: None)
    unscheduled()
    unscheduled()
    assert unscheduled.pending and not unscheduled._scheduled  # it tries again on the next call


class MeterApp(App):
    def __init__(self, repaint_interval: float) -> None:
        super().__init__()
        self.repaint_interval = repaint_interval

    def compose(self):
        yield SystemMeter(repaint_interval=self.repaint_interval)


def record_repaints(meter: SystemMeter, field: str) -> list:
    """The meter's state `field` at each repaint."""
    painted = []
    repaint = meter._paint.fn
    meter._paint.fn = lambda: (painted.append(getattr(meter.state, field)), repaint())
    return painted


async def test_the_meter_repaints_seldom_while_a_reply_streams_and_at_once_when_it_ends():
    async with MeterApp(repaint_interval=3600).run_test(size=(100, 30)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        painted = record_repaints(meter, "turn_tokens")
        meter.on_prefill(Prefill(10, 0, 0.1))
        for i in range(5):
            meter.on_blocks([Block(i, [1, 2, 3], 2, [1, 2, 3], "abc")], 0.05)
        meter.set_memory(1, 2, 3)
        assert painted == [3]  # the first batch painted, the prefill's figures with it; the rest wait
        meter.on_done(Done([1] * 15, "", "length", {"mode": "dflash", "decode_tps": 99.0}))
        assert painted == [3, 15]  # the end is drawn at once, with every batch in it
        meter.set_memory(4, 5, 6)
        assert len(painted) == 3  # between replies, every change is drawn
        await pilot.pause()


async def test_a_memory_sample_during_a_reply_waits_for_the_next_batch_instead_of_a_frame_of_its_own():
    async with MeterApp(repaint_interval=0).run_test(size=(100, 30)) as pilot:  # every batch repaints
        meter = pilot.app.query_one(SystemMeter)
        painted = record_repaints(meter, "active_bytes")
        meter.on_prefill(Prefill(10, 0, 0.1))
        meter.on_blocks([Block(0, [1, 2], 2, [1, 2], "ab")], 0.05)
        meter.set_memory(7, 8, 9)
        assert painted == [None]  # the first batch (the prefill's figures drawn with it); the sample waits
        meter.on_blocks([Block(1, [1, 2], 2, [1, 2], "ab")], 0.05)
        assert painted == [None, 7]  # the next batch draws it
        await pilot.pause()


async def test_the_first_words_are_drawn_alone_and_the_panes_catch_up_with_the_next_batch():
    from dflash_tui.ui.app import DFlashApp

    def cycle(i: int, text: str) -> Block:
        return Block(index=i, drafted=[1, 2, 3], accepted=2, emitted=[1, 2, 9], text=text)

    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        app.post_message(msg.EngineReady("target", "draft", "cpu", 16, str, 0.1))
        await pilot.pause()
        app.start_turn("hi")
        turn = app.turn_id
        app.post_message(msg.TurnPrefill(turn, Prefill(5, 0, 0.01)))
        app.post_message(msg.TurnBlocks(turn, [cycle(0, "Hello "), cycle(1, "there")], 0.02))
        await pilot.pause()
        await app._handle.written()
        assert app._handle.showing and "Hello there" in app._handle.message.tail_text  # the words, at once
        assert not app.acceptance.rows.rows and app.meter.state.turn_tokens == 0  # the panes wait
        app.post_message(msg.TurnBlocks(turn, [cycle(2, ", you")], 0.01))
        await pilot.pause()
        assert [r.index for r in app.acceptance.rows.rows] == [0, 1, 2]  # caught up, in order
        assert app.meter.state.turn_tokens == 9 and len(app.meter.state.live) == 2  # each batch its own sample
        app.post_message(msg.TurnBlocks(turn, [cycle(3, "!")], 0.01))
        app.post_message(msg.TurnDone(turn, Done([1, 2, 9] * 4, "Hello there, you!", "length", {"mode": "dflash"}), []))
        await pilot.pause()
        while app.generating:
            await pilot.pause(0.05)
        assert [r.index for r in app.acceptance.rows.rows] == [0, 1, 2, 3]


def test_the_worker_holds_the_next_batch_as_long_as_the_ui_asks():
    posted: list = []

    def post(message):
        posted.append((time.perf_counter(), message))
        worker.blocks_shown(hold_s=0.25)  # a UI that found its last batch costly

    worker = EngineWorker(post, flush_interval=0.01)
    worker.conversation = FakeConversation(400, 0.002)
    worker._generate(Generate(1, "hi", {}))
    sent = [t for t, m in posted if isinstance(m, msg.TurnBlocks)]
    blocks = [b for _, m in posted if isinstance(m, msg.TurnBlocks) for b in m.blocks]
    assert [b.index for b in blocks] == list(range(400))  # nothing lost, in order
    gaps = [b - a for a, b in zip(sent, sent[1:-1])]  # the last batch goes with Done, hold or not
    assert gaps and min(gaps) >= 0.25  # a floor the worker keeps, however fast or slow the machine
    assert isinstance(posted[-1][1], msg.TurnDone)


def test_batches_wait_by_what_drawing_cost_but_the_first_words_do_not():
    from types import SimpleNamespace

    from dflash_tui.ui import app as app_mod
    from dflash_tui.ui import turns as turns_mod

    asked: list[float] = []
    ui = SimpleNamespace(_handle=SimpleNamespace(showing=False), engine=SimpleNamespace(blocks_shown=asked.append))
    ui._painted_cpu = time.thread_time() - 1.0  # a second of UI time since the last paint: a costly one
    app_mod.DFlashApp._blocks_painted(ui)
    ui._handle.showing = True
    ui._painted_cpu = time.thread_time() - 1.0
    app_mod.DFlashApp._blocks_painted(ui)
    ui._painted_cpu = time.thread_time()  # nothing spent: no wait
    app_mod.DFlashApp._blocks_painted(ui)
    assert asked[0] == 0.0  # nothing of the reply on screen yet: no wait
    assert asked[1] == turns_mod.MAX_HOLD_S  # costly drawing: the longest wait, no longer
    assert 0.0 <= asked[2] < 0.05
