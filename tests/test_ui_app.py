"""Pilot tests of the chat app on the real engine with a tiny random-weight pair."""

from __future__ import annotations

import threading
import time
import tomllib

import pytest

from ui_support import install_placeholders

install_placeholders()

from dflash_tui.config import config_path  # noqa: E402
from dflash_tui.engine import conversation as conversation_mod  # noqa: E402
from dflash_tui.ui.acceptance import AcceptanceView  # noqa: E402
from dflash_tui.ui.app import DFlashApp  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, Note, UserMessage  # noqa: E402
from dflash_tui.ui.reply_text import display_text, visible  # noqa: E402
from dflash_tui.ui.meter import SystemMeter  # noqa: E402

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


async def wait_for(pilot, cond, timeout: float = 30.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def ready(pilot, app) -> None:
    await wait_for(pilot, lambda: app.model_state in ("ready", "failed"), what="the model to load")
    assert app.model_state == "ready"
    # the baseline probe runs after load; wait for it so it does not overlap a test's turn
    await wait_for(pilot, lambda: app.baseline_tps is not None or app.probe_tokens == 0, what="the baseline probe")


async def send(pilot, app, text: str) -> None:
    app.prompt.value = text
    app.prompt.focus()
    await pilot.press("enter")
    await pilot.pause()


async def finish_turn(pilot, app, timeout: float = 60.0) -> None:
    await wait_for(pilot, lambda: not app.generating, timeout, "the reply to finish")
    await pilot.pause(0.1)


@pytest.fixture
def engine_events(monkeypatch):
    """Every event Conversation.generate/regenerate yields, as the engine made it, per call."""
    calls: list[list] = []
    for name in ("generate", "regenerate"):
        original = getattr(conversation_mod.Conversation, name)

        def wrapped(self, *args, _original=original, **kwargs):
            events: list = []
            calls.append(events)
            for ev in _original(self, *args, **kwargs):
                events.append(ev)
                yield ev

        monkeypatch.setattr(conversation_mod.Conversation, name, wrapped)
    return calls


@pytest.fixture
def view_blocks(monkeypatch):
    """The blocks the acceptance view was handed, in order."""
    seen: list = []
    original = AcceptanceView.add_blocks

    def spy(self, blocks):
        seen.extend(blocks)
        return original(self, blocks)

    monkeypatch.setattr(AcceptanceView, "add_blocks", spy)
    return seen


@pytest.fixture
def oracle(monkeypatch, qwen3_dirs):
    """A draft that is right ~70% of the time, so acceptance counts vary from cycle to cycle."""
    from conftest import oracle_proposer, reference_tokens

    from dflash_tui.engine.loading import load_pair

    def install(user_text: str, max_tokens: int) -> None:
        pair = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
        conv = conversation_mod.Conversation(pair)
        prompt = conv.prompt_tokens([{"role": "user", "content": user_text}])
        sequence = prompt + reference_tokens(pair, prompt, max_tokens)
        proposer = oracle_proposer(sequence, error_rate=0.3)
        original_init = conversation_mod.Conversation.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self.propose = proposer  # the worker's conversation drafts with the oracle

        monkeypatch.setattr(conversation_mod.Conversation, "__init__", init)

    return install


def make_app(qwen3_dirs, **kw) -> DFlashApp:
    kw.setdefault("probe_tokens", 8)
    app = DFlashApp(model=str(qwen3_dirs["target"]), draft=str(qwen3_dirs["draft"]), **kw)
    # a fixed block: the adaptive size follows timings, and on a busy host may run the target alone
    app.options.block_size = 8
    return app


async def test_reply_streams_and_acceptance_rows_match_the_engine(qwen3_dirs, engine_events, view_blocks, oracle):
    oracle("hello", 48)
    app = make_app(qwen3_dirs)
    app.options.max_tokens = 48
    meter_calls = []
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        original = app.meter.on_batches
        app.meter.on_batches = lambda batches: (meter_calls.extend((len(b), e) for b, e in batches), original(batches))
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)

        (events,) = engine_events
        blocks = [e for e in events if e.type == "block"]
        done = events[-1]
        assert done.type == "done" and done.finish_reason == "length"
        # the view got every cycle, in order, with the engine's own accepted counts
        assert [(b.index, b.accepted, b.drafted) for b in view_blocks] == [(b.index, b.accepted, b.drafted) for b in blocks]
        assert len({b.accepted for b in blocks if b.drafted}) > 1, "the oracle draft should give varied acceptance"
        # ...and shows one row per cycle with those counts, and figures over them
        view = app.acceptance
        assert [(r.index, r.accepted) for r in view.rows.rows] == [(b.index, b.accepted) for b in blocks]
        assert view.stats.accepted == sum(b.accepted for b in blocks)
        assert view.stats.cycles == done.stats["cycles"]
        assert view.stats.tokens_per_cycle == pytest.approx(done.stats["tokens_per_cycle"])
        # the conversation shows the user's text and the engine's final reply
        users = app.chat.query(UserMessage)
        replies = app.chat.query(AssistantMessage)
        assert [u.raw_text for u in users] == ["hello"]
        assert len(replies) == 1 and replies[0].raw_text == done.text
        assert "48 tokens" in replies[0]._footer
        # the meter saw the blocks, in batches covering all of them
        assert sum(n for n, _ in meter_calls) == len(blocks)
        assert all(elapsed >= 0 for _, elapsed in meter_calls)


async def test_escape_stops_within_one_cycle_and_keeps_the_text(qwen3_dirs, engine_events):
    app = make_app(qwen3_dirs)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "/max-tokens 100000")
        assert app.options.max_tokens == 100000
        await send(pilot, app, "tell me everything")
        await wait_for(pilot, lambda: engine_events and len(engine_events[0]) > 20, what="some blocks")
        at_cancel = []
        original_cancel = app.engine.cancel
        # how far the engine had got at the moment Esc set the cancel flag
        app.engine.cancel = lambda: (at_cancel.append(len(engine_events[0])), original_cancel())
        await pilot.press("escape")
        assert at_cancel, "Esc did not reach the engine"
        yielded_at_escape = at_cancel[0]
        await finish_turn(pilot, app, timeout=10)
        events = engine_events[0]
        done = events[-1]
        assert done.type == "done" and done.finish_reason == "cancelled"
        # at most the cycle already running when Esc arrived, then Done
        assert len(events) <= yielded_at_escape + 2
        reply = app.chat.query(AssistantMessage).last()
        assert reply.raw_text == done.text and done.text
        assert "stopped" in reply._footer
        # what streamed into the tail is in the final Markdown, not lost with the tail
        assert reply.body.source == visible(display_text(done.text)) and not reply.tail.display
        # the partial reply stays in the conversation for the next turn
        assert app.engine.conversation.messages[-1] == {"role": "assistant", "content": done.text}


async def test_the_engine_is_a_textual_worker_and_cancelling_it_stops_the_thread(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        (worker,) = [w for w in app.workers if w.name == "engine"]
        assert worker is app.engine.worker and not app.engine.finished
        worker.cancel()
        await wait_for(pilot, lambda: app.engine.finished, 15.0, "the engine thread to end")
        assert app.engine.pair is None


async def test_quitting_mid_reply_ends_the_engine_thread_cleanly(qwen3_dirs, engine_events, monkeypatch):
    import mlx.core as mx

    cleared = []
    original_clear = mx.clear_streams
    monkeypatch.setattr(mx, "clear_streams", lambda: (cleared.append(threading.get_ident()), original_clear())[1])
    app = make_app(qwen3_dirs)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "/max-tokens 100000")
        await send(pilot, app, "tell me everything")
        await wait_for(pilot, lambda: engine_events and len(engine_events[0]) > 5, what="some blocks")
        assert app.generating
    # the app has exited: the engine thread stopped the reply, dropped the models and freed its
    # MLX streams itself, rather than leaving them to interpreter teardown
    assert app.engine.finished
    assert cleared == [app.engine.thread_id]
    assert app.engine.pair is None and app.engine.conversation is None
    done = engine_events[0][-1]
    assert done.type == "done" and done.finish_reason == "cancelled"


async def test_slash_commands_change_the_settings_the_engine_gets(qwen3_dirs, engine_events):
    app = make_app(qwen3_dirs)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        for command in ("/temp 0.5", "/top-p 0.9", "/block 4", "/max-tokens 7"):
            await send(pilot, app, command)
        assert (app.options.temperature, app.options.top_p, app.options.block_size, app.options.max_tokens) == (0.5, 0.9, 4, 7)
        settings = app.generation_settings()
        assert settings["temperature"] == 0.5 and settings["top_p"] == 0.9 and settings["block_size"] == 4

        await send(pilot, app, "/temp 0")
        await send(pilot, app, "hi")
        await finish_turn(pilot, app)
        events = engine_events[-1]
        assert events[-1].stats["block_size"] == 4
        assert len(events[-1].tokens) <= 7
        assert all(len(e.drafted) <= 3 for e in events if e.type == "block")

        await send(pilot, app, "/baseline")
        assert app.baseline
        await send(pilot, app, "again")
        await finish_turn(pilot, app)
        events = engine_events[-1]
        assert events[-1].stats["mode"] == "baseline"
        assert all(e.drafted == [] for e in events if e.type == "block")

        # bad values change nothing and say why; unknown commands are not sent as messages
        await send(pilot, app, "/temp hot")
        await send(pilot, app, "/tmep 1")
        assert app.options.temperature == 0
        assert len(engine_events) == 2
        texts = [n.message for n in app._notifications]
        assert any("temperature expected a number" in t for t in texts)
        assert any("unknown command /tmep" in t and "/temp" in t for t in texts)


async def test_system_prompt_reaches_the_conversation(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "/system Answer in one word.")
        await send(pilot, app, "/max-tokens 4")
        await send(pilot, app, "hi")
        await finish_turn(pilot, app)
        messages = app.engine.conversation.messages
        assert messages[0] == {"role": "system", "content": "Answer in one word."}
        assert messages[1] == {"role": "user", "content": "hi"}


async def test_regenerate_replaces_the_last_reply(qwen3_dirs, engine_events):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 6
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hi")
        await finish_turn(pilot, app)
        await pilot.press("ctrl+r")
        await pilot.pause()
        await finish_turn(pilot, app)
        assert len(engine_events) == 2
        assert len(app.chat.query(AssistantMessage)) == 1
        assert [m["role"] for m in app.engine.conversation.messages] == ["user", "assistant"]
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert app.session.siblings(app.session.messages[-1].id) == (2, 2)  # the first reply is kept beside it


async def test_prompt_history_walks_up_and_down(qwen3_dirs):
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        for text in ("/temp 0.1", "/temp 0.2"):
            await send(pilot, app, text)
        app.prompt.value = "half typed"
        await pilot.press("up")
        assert app.prompt.value == "/temp 0.2"
        await pilot.press("up", "up")
        assert app.prompt.value == "/temp 0.1"
        await pilot.press("down", "down")
        assert app.prompt.value == "half typed"


async def test_theme_switches_and_persists():
    user_themes = config_path().parent / "themes"
    user_themes.mkdir(parents=True)
    (user_themes / "mine.toml").write_text('name = "mine"\nprimary = "#ff00ff"\ndark = true\n')
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "dflash-dark"
        assert {"dflash-dark", "dflash-light", "dflash-amber", "mine"} <= set(app.available_themes)
        before = app.screen.styles.background
        await send(pilot, app, "/theme dflash-light")
        await pilot.pause(0.2)
        assert app.theme == "dflash-light"
        assert app.screen.styles.background != before
        await send(pilot, app, "/theme nope")
        assert app.theme == "dflash-light"
        await send(pilot, app, "/theme mine")
        await wait_for(pilot, lambda: config_path().exists(), 5, "the config to be written")
    assert tomllib.loads(config_path().read_text())["theme"] == "mine"
    again = DFlashApp(start_engine=False)
    async with again.run_test(size=SIZE):
        assert again.theme == "mine"


@pytest.mark.parametrize("in_file, for_run", [("my-theme", None), ("dflash-light", "dflash-lite"),
                                              ("dflash-light", "dflash-amber")])
async def test_a_missing_or_run_only_theme_never_reaches_config_toml(in_file, for_run):
    path = config_path()
    path.parent.mkdir(parents=True)
    mine = f'# mine\ntheme = "{in_file}"   # my own theme\n'
    path.write_text(mine)
    app = DFlashApp(start_engine=False, theme=for_run)
    async with app.run_test(size=SIZE) as pilot:
        shown = for_run if for_run in app.available_themes else "dflash-dark"  # a theme not found: the default
        assert app.theme == shown
        await pilot.pause(1.2)  # past the save timer
    assert path.read_text() == mine  # neither the fallback nor this run's theme was written
    again = DFlashApp(start_engine=False)
    async with again.run_test(size=SIZE) as pilot:
        await send(pilot, again, "/theme dflash-amber")  # a choice made in the app is written
        await wait_for(pilot, lambda: "dflash-amber" in path.read_text(), 5, "the config to be written")
    assert path.read_text() == mine.replace(in_file, "dflash-amber")  # its comments kept


async def test_bad_config_falls_back_to_defaults_and_is_left_alone():
    path = config_path()
    path.parent.mkdir(parents=True)
    broken = 'theme = "dflash-amber"\nmax_tokens = "lots"\n'
    path.write_text(broken)
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        assert app.options.max_tokens == 512  # the default
        assert app.theme == "dflash-amber"  # the good setting is kept
        notes = [n.render().plain if hasattr(n.render(), "plain") else str(n.render()) for n in app.chat.query(Note)]
        assert any("'max_tokens'" in t and "left as it is" in t for t in notes)
        await send(pilot, app, "/theme dflash-light")
        await pilot.pause(1.2)
    assert path.read_text() == broken


async def test_load_errors_are_shown_not_raised(tmp_path, qwen3_dirs):
    from dflash_tui import random_pair as rp

    # a draft built for a different hidden size does not fit the target
    cfg = rp.qwen3_config(vocab_size=400, hidden=32)
    rp.build_draft(tmp_path / "wrong", rp.draft_config_for(cfg, 3, layers=1), seed=3)
    for model, draft, expected in (
        (str(tmp_path / "missing"), None, "model not found"),
        (str(qwen3_dirs["target"]), str(tmp_path / "wrong"), "does not fit"),
    ):
        app = DFlashApp(model=model, draft=draft or str(qwen3_dirs["draft"]), probe_tokens=0)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.model_state in ("ready", "failed", "none") and app._pending_load is None,
                           what="the load to finish")
            assert app.model_state != "ready"
            errors = [str(n.render()) for n in app.chat.query(Note) if n.has_class("-error")]
            assert any(expected in e for e in errors), errors
            await send(pilot, app, "hello")  # refused politely, not crashed
            assert not app.generating
            assert app.prompt.value == "hello"


async def test_no_mlx_work_on_the_ui_thread(qwen3_dirs, monkeypatch):
    import mlx.core as mx

    from dflash_tui.engine import loading as loading_mod
    from dflash_tui.engine import target as target_mod

    ui_thread = threading.get_ident()
    seen: list[tuple[str, int]] = []
    recording = False

    def spy(name, fn):
        def wrapper(*args, **kwargs):
            if recording:
                seen.append((name, threading.get_ident()))
            return fn(*args, **kwargs)

        return wrapper

    for name in ("eval", "async_eval", "get_active_memory", "get_peak_memory", "reset_peak_memory"):
        monkeypatch.setattr(mx, name, spy(f"mx.{name}", getattr(mx, name)))
    monkeypatch.setattr(loading_mod, "load_target", spy("load_target", loading_mod.load_target))
    monkeypatch.setattr(target_mod.Target, "forward", spy("Target.forward", target_mod.Target.forward))
    monkeypatch.setattr(conversation_mod.Conversation, "generate", spy("generate", conversation_mod.Conversation.generate))

    recording = True
    app = make_app(qwen3_dirs)
    app.options.max_tokens = 12
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
    recording = False

    names = {n for n, _ in seen}
    assert {"load_target", "Target.forward", "mx.eval", "generate"} <= names
    threads = {t for _, t in seen}
    assert ui_thread not in threads, [n for n, t in seen if t == ui_thread]
    # load and generate in the same long-lived thread (MLX's generation stream is per thread)
    assert threads == {app.engine.thread_id}


async def test_copy_a_message_and_its_code(qwen3_dirs):
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        message = app.chat.add_assistant("Here:\n\n```python\nprint(1)\n```\n\nand\n\n```\nx = 2\n```\n")
        await pilot.pause()
        message.focus()
        await pilot.press("c")
        assert app.clipboard == message.raw_text
        await pilot.press("y")
        assert app.clipboard == "print(1)\n\nx = 2"
        app.prompt.focus()
        await pilot.press("ctrl+y")
        assert app.clipboard == message.raw_text


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_control_characters_are_made_visible(anyio_backend):
    assert visible("a\x13b\n\tc\x7f") == "a\u2413b\n\tc\u2421"


async def test_layout_stacks_at_80x24_and_spreads_when_wide(qwen3_dirs):
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        chat, side = app.query_one("#chat").region, app.query_one("#side").region
        assert side.y >= chat.bottom and side.width == 80  # stacked under the conversation
        assert chat.height >= 8 and chat.height > side.height
        acc, meter = app.query_one(AcceptanceView).region, app.query_one(SystemMeter).region
        assert acc.y == meter.y and acc.right <= meter.x  # side by side
        await pilot.press("f2")
        await pilot.pause()
        assert app.query_one("#chat").region.height > chat.height
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        chat, side = app.query_one("#chat").region, app.query_one("#side").region
        assert side.x >= chat.right and chat.height == side.height  # side by side
        assert chat.width >= 80


async def test_turns_are_saved_and_a_session_reopens(qwen3_dirs):
    from dflash_tui.sessions import SessionStore
    from dflash_tui.ui.sessions_screen import SessionsScreen

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 5
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "first question")
        await finish_turn(pilot, app)
        summaries, problems = SessionStore().list()
        assert len(summaries) == 1 and not problems
        saved = SessionStore().load(summaries[0].id)
        assert [m.role for m in saved.messages] == ["user", "assistant"]
        assert saved.messages[1].content == app.engine.conversation.messages[1]["content"]
        assert [e["type"] for e in saved.messages[1].trace][:2] == ["prefill", "block"]
        # the tokens' text is recorded, so a replay without the model can show the cells
        drafted = {t for e in saved.messages[1].trace if e["type"] == "block" for t in e["drafted"]}
        assert drafted and all(saved.token_text.get(t) is not None for t in drafted)

        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: not app.chat.query(UserMessage) and app.engine.conversation.messages == [],
                       5, "a new conversation")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), 5, "the sessions screen")
        await pilot.press("o")
        await wait_for(pilot, lambda: app.session is not None and app.chat.query(UserMessage), 10, "the session to open")
        await pilot.pause(0.2)
        assert [u.raw_text for u in app.chat.query(UserMessage)] == ["first question"]
        assert app.engine.conversation.messages == [{"role": m.role, "content": m.content} for m in saved.messages]
        # the next turn continues the same session file
        await send(pilot, app, "second")
        await finish_turn(pilot, app)
        again = SessionStore().load(saved.id)
        assert [m.role for m in again.messages] == ["user", "assistant", "user", "assistant"]


async def test_an_unwritable_data_dir_is_reported_and_the_chat_goes_on(qwen3_dirs, monkeypatch):
    from dflash_tui.sessions import SessionStore

    def refuse(self, session):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SessionStore, "save", refuse)
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        assert any("could not save the session" in n.message and "stays in memory" in n.message
                   for n in app._notifications)
        await send(pilot, app, "still here?")
        await finish_turn(pilot, app)
        assert [m["role"] for m in app.engine.conversation.messages] == ["user", "assistant", "user", "assistant"]
        assert len(app.session.messages) == 4


async def test_a_conversation_that_could_not_be_saved_is_never_left_without_asking(qwen3_dirs, tmp_path, monkeypatch):
    from dflash_tui.ui.sessions_screen import ConfirmScreen

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be: every save fails, for real\n")
    monkeypatch.setenv("DFLASH_TUI_DATA_DIR", str(blocker))
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "keep me")
        await finish_turn(pilot, app)
        assert any("could not save the session" in n.message for n in app._notifications)
        for key in ("ctrl+n", "ctrl+q"):
            await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the question")
            assert "This conversation is not saved" in str(app.screen.query_one("Static").render())
            await pilot.press("n")  # stay
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen) and app.is_running
            assert [m.content for m in app.session.messages][:1] == ["keep me"] and app.chat.query(UserMessage)
        app.export_conversation(str(tmp_path / "kept.md"))  # the way out the question names
        assert "keep me" in (tmp_path / "kept.md").read_text()
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the question")
        await pilot.press("y")  # leave it: a new conversation
        await wait_for(pilot, lambda: not app.chat.query(UserMessage), 5, "the new conversation")
        assert app.session is None
        await pilot.press("ctrl+n")  # nothing unsaved now: no question
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


async def test_palette_lists_the_app_commands(qwen3_dirs):
    from textual.command import CommandPalette

    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"toggle baseline")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.baseline is True


async def test_the_view_follows_the_stream_only_at_the_bottom(qwen3_dirs, engine_events):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 100000
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        chat = app.chat
        await send(pilot, app, "go")  # the fixture pair rambles on for hundreds of tokens here
        await wait_for(pilot, lambda: chat.max_scroll_y > 1 or not app.generating, what="the reply to outgrow the pane")
        assert app.generating, "this prompt should give a long reply on the fixture pair"
        assert chat.scroll_y == chat.max_scroll_y  # following
        chat.scroll_home(animate=False)  # the user scrolls up to read
        await pilot.pause(0.1)
        grown_from = chat.max_scroll_y
        await wait_for(pilot, lambda: chat.max_scroll_y > grown_from, what="more text")
        assert chat.scroll_y == 0  # left where the user put it
        chat.scroll_end(animate=False)  # back at the bottom: following again
        await pilot.pause(0.1)
        grown_from = chat.max_scroll_y
        await wait_for(pilot, lambda: chat.max_scroll_y > grown_from, what="more text")
        await pilot.pause(0.1)
        assert chat.scroll_y == chat.max_scroll_y
        await pilot.press("escape")
        await finish_turn(pilot, app, timeout=10)


async def test_loading_shows_progress_and_a_failure_clears_it():
    from dflash_tui.ui import messages as msg
    from dflash_tui.ui.chat_view import LoadingPanel

    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.load_model("someone/big-model")
        await pilot.pause()
        assert app.model_state == "loading"
        # what the worker posts while a big model downloads and loads
        app.post_message(msg.EngineLoading("someone/big-model", "downloading weights", 0.4))
        await pilot.pause()
        panel = app.chat.query_one(LoadingPanel)
        assert panel.query_one("ProgressBar").progress == pytest.approx(40)
        assert "downloading weights" in str(panel.query_one(".loading-stage").render())
        await send(pilot, app, "too early")
        assert not app.generating and app.prompt.value == "too early"
        app.post_message(msg.EngineFailed("someone/big-model", "out of memory while loading someone/big-model"))
        await pilot.pause()
        assert not app.chat.query(LoadingPanel)
        assert app.model_state == "failed"
        assert any("out of memory" in str(n.render()) for n in app.chat.query(Note))


async def test_after_load_the_meter_shows_the_pair_device_memory_and_a_measured_baseline(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.pause(0.2)
        state = app.meter.state
        assert state.target == str(qwen3_dirs["target"]) and state.draft == str(qwen3_dirs["draft"])
        assert state.device and state.device.startswith(("cpu", "gpu"))
        assert state.baseline_tps and state.baseline_tps > 0  # measured by the probe, not guessed
        assert state.rss_bytes and state.rss_bytes > 0 and state.active_bytes is not None
        # the adaptive block size's cost curve is measured at load too, not in the first reply's wait
        await wait_for(pilot, lambda: app.engine.conversation._sizer is not None, what="the cost curve")
        costs = app.engine.conversation._sizer.costs
        assert costs and all(c > 0 for c in costs.values())


async def test_a_target_with_no_known_draft_runs_alone_and_the_meter_says_why(qwen3_dirs, engine_events):
    app = DFlashApp(model=str(qwen3_dirs["target"]), draft=None, probe_tokens=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert app.draft_name is None
        await send(pilot, app, "hello")
        await finish_turn(pilot, app)
        assert engine_events[-1][-1].stats["mode"] == "baseline"  # the engine really ran the target alone
        body = str(app.meter._body.render())
        assert "target only (no draft: none known for target)" in body
        notes = [str(n.render()) for n in app.chat.query(Note)]
        assert any("with no draft (none known for target): the target runs alone" in n for n in notes), notes


async def test_a_turn_runs_with_a_short_gil_switch_and_frozen_collector_and_restores_both(qwen3_dirs, engine_events):
    import gc
    import sys

    from dflash_tui.ui import turns as turns_mod

    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 100000
    before = sys.getswitchinterval()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "go")
        await wait_for(pilot, lambda: engine_events and len(engine_events[0]) > 5, what="some blocks")
        assert sys.getswitchinterval() == pytest.approx(turns_mod.TURN_SWITCH_INTERVAL_S)
        assert gc.get_freeze_count() > 0  # a full collection skips what existed when the turn began
        asked = []
        shown = app.engine.blocks_shown
        app.engine.blocks_shown = lambda hold_s=0.0: (asked.append(hold_s), shown(hold_s))
        await wait_for(pilot, lambda: asked, what="a batch to be painted")
        assert 0 <= asked[0] <= turns_mod.MAX_HOLD_S  # the UI paces the batches by what drawing them cost
        await pilot.press("escape")
        await finish_turn(pilot, app, timeout=10)
        assert sys.getswitchinterval() == pytest.approx(before)
        assert gc.get_freeze_count() == 0


async def test_engine_messages_after_the_screens_are_gone_are_dropped(qwen3_dirs):
    """The engine thread can post while the app shuts down: a memory sample, a block batch or
    a finished turn that arrives once the screens are gone must not crash the exit."""
    from dflash_tui.ui import messages as msg

    app = make_app(qwen3_dirs)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        # shutting down, Textual prunes a screen's widgets before it empties the stack
        await app._prune(app.main_screen)
        assert app.screen_stack and not app.main_screen.query("#meter")
        app.on_memory_sample(msg.MemorySample(1, 2, 3))
    assert not app.screen_stack
    app.on_memory_sample(msg.MemorySample(1, 2, 3))
    app.on_engine_notice(msg.EngineNotice("late"))
