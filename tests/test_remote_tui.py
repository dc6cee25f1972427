"""The TUI with a remote engine, for real: `dflash-tui serve` and `mlx_lm.server` on localhost, driven by Pilot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from dflash_tui.remote.client import RemoteTarget
from dflash_tui.server.launch import ServerProcess
from dflash_tui.ui.acceptance import REMOTE_NONE, CountRow, text_only
from dflash_tui.ui.app import DFlashApp
from dflash_tui.ui.chat_view import AssistantMessage
from dflash_tui.ui.figure_text import fmt_rate

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


@pytest.fixture(scope="module")
def dflash_server(qwen3_dirs):
    args = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]), "--log-level", "warning"]
    with ServerProcess(args, env={"HF_HUB_OFFLINE": "1"}) as s:
        yield s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlx_lm_server(qwen3_dirs, tmp_path_factory):
    port = _free_port()
    hf_home = tmp_path_factory.mktemp("hf")
    (hf_home / "hub").mkdir()  # an empty cache: its /v1/models lists only --model (and fails with no cache at all)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home)}
    log = tmp_path_factory.mktemp("mlxlm") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", "--model", str(qwen3_dirs["target"]),
                                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                    if json.loads(r.read()).get("data"):
                        break
            except (OSError, ValueError):  # not listening yet, or not answering JSON yet
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("mlx_lm.server did not come up:\n" + log.read_text())
        yield url
    finally:
        proc.kill()  # by its PID
        proc.wait(10)


async def wait_for(pilot, cond, timeout: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def connect(pilot, app) -> None:
    await wait_for(pilot, lambda: app.model_state in ("ready", "failed"), what="the connection")
    assert app.model_state == "ready", [str(n.render()) for n in app.chat.query("Note")]


async def turn(pilot, app, text: str) -> None:
    before = app.turn_id
    app.prompt.value = text
    app.prompt.focus()
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.turn_id > before and not app.generating, 120, "the reply to finish")
    await pilot.pause(0.1)


def record_events(app) -> list:
    """Every event the remote client hands the worker, as the server's stream said it."""
    seen: list = []
    client = app.engine.client
    chat = client.chat

    def recording(*a, **kw):
        for ev in chat(*a, **kw):
            if ev is not None:  # None: the stream was quiet for a while
                seen.append(ev)
            yield ev

    client.chat = recording
    return seen


def meter_text(app) -> str:
    return "\n".join(str(w.render()) for w in app.meter.query("MeterText"))


async def test_dflash_serve_live_rows_equal_the_servers_blocks_and_the_session_replays(dflash_server):
    from dflash_tui.sessions import SessionStore
    from dflash_tui.ui.replay_screen import ReplayScreen

    app = DFlashApp(remote=RemoteTarget(dflash_server.base_url), probe_tokens=0)
    app.options.max_tokens = 24
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        assert app.server.kind == "dflash" and app.draft_name
        # the speedup's baseline is the server's own probe, as a local pair's is the local probe
        probe = app.server.target_alone_tps
        assert probe and app.server.dflash_probe_tps
        await wait_for(pilot, lambda: app.meter.state.baseline_tps == probe, 5, "the server's baseline")
        seen = record_events(app)
        await turn(pilot, app, "Write a function that reverses a list")
        blocks = [e for e in seen if e.type == "block"]
        assert any(b.drafted for b in blocks), "the server drafted nothing: the pane would show nothing to compare"
        assert list(app.acceptance.rows.rows) == blocks  # the rows are the server's blocks, each of them
        assert seen[-1].type == "done" and app.acceptance.stats.cycles == seen[-1].stats["cycles"]
        host = dflash_server.base_url.split("//")[1]
        assert f"dflash-tui serve at {host}" in meter_text(app) and f"engine on {dflash_server.base_url}" in meter_text(app)
        reply = app.chat.query(AssistantMessage).last()
        assert reply.raw_text == seen[-1].text
        done = seen[-1]
        assert done.finish_reason == "length" and done.stats["generated_tokens"] == 24
        assert app.meter.state.speedup_figure == (pytest.approx(done.stats["decode_tps"] / probe), "turn")
        assert f"vs {fmt_rate(probe)} tok/s target alone" in meter_text(app)
        # cells show the server's token texts, not ids
        drafted = next(b for b in blocks if b.drafted)
        assert app.decoder(drafted.drafted[0]) == app.engine.client.token_text[drafted.drafted[0]]

        # the session file: the server and the model, never a key; its replay shows the same rows
        (summary,), _ = SessionStore().list()
        saved = SessionStore().load(summary.id)
        assert saved.server == dflash_server.base_url and saved.target == app.server.model
        assert "api_key" not in saved.path.read_text()
        app.push_screen(ReplayScreen(saved, speed=50.0))
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen), 5, "the replay")
        replay = app.screen

        def replayed() -> int:
            try:
                return len(replay.acceptance.rows.rows)
            except Exception:  # the screen is still composing
                return -1

        await wait_for(pilot, lambda: replayed() == len(blocks), 30, "the replayed rows")
        assert list(app.screen.acceptance.rows.rows) == blocks


async def test_mlx_lm_server_chats_and_the_pane_says_no_speculative_decoding(mlx_lm_server, qwen3_dirs):
    from dflash_tui.sessions import SessionStore

    app = DFlashApp(remote=RemoteTarget(mlx_lm_server), probe_tokens=0)
    app.options.max_tokens = 12
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        assert app.server.kind == "openai" and app.acceptance_mode() == "remote"
        seen = record_events(app)
        await turn(pilot, app, "hello")
        done = seen[-1]
        assert done.type == "done", done
        assert all(text_only(e) for e in seen if e.type == "block")
        assert app.acceptance.message == REMOTE_NONE and not app.acceptance.rows.rows
        assert REMOTE_NONE in str(app.acceptance.note.render())
        footer = app.chat.query(AssistantMessage).last()
        assert footer.raw_text == done.text and done.stats["generated_tokens"] > 0
        assert done.stats["ttft_s"] > 0 and "ttft" in meter_text(app)
        assert done.stats["decode_tps"] > 0 and app.meter.state.turn_tps == done.stats["decode_tps"]
        # no measured baseline from this server: no speedup, and the meter says why
        assert app.meter.state.speedup is None and "— speedup (the server reports no target-alone speed)" in meter_text(app)
        (summary,), _ = SessionStore().list()
        assert SessionStore().load(summary.id).server == mlx_lm_server


async def test_count_rows_from_a_servers_per_step_figures(anyio_backend):
    """The pane's count-row mode (vLLM's per-step counts, recorded shape: see test_remote_client.py)."""
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=SIZE) as pilot:
        app.acceptance.reset("remote")
        app.acceptance.show_reported({"spec_source": "vLLM per-request metrics", "cycles": 2, "spec_accepted": 3,
                                      "spec_drafted": 6, "spec_steps": [[3, 3], [0, 3]]})
        await pilot.pause()
        assert list(app.acceptance.rows.rows) == [CountRow(1, 3, 3), CountRow(2, 0, 3)]
        assert app.acceptance.stats.accepted == 3 and app.acceptance.stats.drafted == 6
        all_kept = "".join(seg.text for seg in app.acceptance.rows.render_line(0))
        assert " 3/3 " in all_kept and "✗" not in all_kept and "+" in all_kept
        none_kept = "".join(seg.text for seg in app.acceptance.rows.render_line(1))
        assert " 0/3 " in none_kept and none_kept.count("✗") == 1 and none_kept.count("·") == 2
        assert not any(ch.isalnum() for ch in all_kept.split("3/3", 1)[1])  # no token text is invented
        assert "per-step counts" in str(app.acceptance.note.render())


async def test_esc_stops_a_turn_at_once_while_the_server_is_silent(anyio_backend):
    """A real server that streams a first piece and then says nothing: Esc ends the turn now (the client
    would otherwise wait out its read limit), the piece that came is kept, and the server sees the hang-up."""
    from stall_server import StallServer

    with StallServer() as server:
        app = DFlashApp(remote=RemoteTarget(server.url), probe_tokens=0)
        async with app.run_test(size=SIZE) as pilot:
            await connect(pilot, app)
            app.prompt.value = "hello"
            app.prompt.focus()
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.generating and "Hello" in (app.chat.query(AssistantMessage).last().raw_text
                                                                          if app.chat.query(AssistantMessage) else ""),
                           20, "the first piece")
            await pilot.pause(0.5)  # the server is silent now
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.generating, 5, "the turn to stop")
            assert app.chat.query(AssistantMessage).last().raw_text == "Hello"
            assert server.hung_up.wait(5), "the server did not see the client go"
            assert app.engine.messages[-1] == {"role": "assistant", "content": "Hello"}


def _saved_session(target: str, server, reply: str = "an old reply"):
    from dflash_tui.sessions import SessionStore

    store = SessionStore()
    session = store.new(target, None, {}, server=server)
    session.add_message("user", "an old question")
    session.add_message("assistant", reply)
    store.save(session)
    return store.load(session.id)


def _spy_loads(app) -> list:
    calls: list = []
    original = app.load_model

    def load_model(*a, **kw):
        calls.append(a)
        return original(*a, **kw)

    app.load_model = load_model
    return calls


def notes(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query("Note")]


async def _open_and_continue(pilot, app, saved) -> None:
    loads = _spy_loads(app)
    await app.open_session(saved)
    await pilot.pause(0.2)
    assert loads == [], "the other engine's model name was loaded here"
    assert app.model_state == "ready"
    assert any(n.startswith("This session ran ") and "goes on with" in n for n in notes(app)), notes(app)
    await turn(pilot, app, "a new question")
    assert app.session.id != saved.id and app.session.messages[0].content == "an old question"
    assert [m.content for m in app.session.messages][:2] == ["an old question", "an old reply"]
    assert len(app.session.messages) == 4 and app.session.messages[-1].role == "assistant"
    reloaded = type(saved)  # the saved session stays as it was
    from dflash_tui.sessions import SessionStore

    again = SessionStore().load(saved.id)
    assert isinstance(again, reloaded) and [m.content for m in again.messages] == ["an old question", "an old reply"]


async def test_a_remote_session_opened_here_continues_on_the_local_pair(qwen3_dirs):
    from dflash_tui.sessions import SessionStore

    saved = _saved_session("a-model-only-the-server-has", "http://127.0.0.1:9")
    app = DFlashApp(model=str(qwen3_dirs["target"]), draft=str(qwen3_dirs["draft"]), probe_tokens=0)
    app.options.max_tokens = 6
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        local = app.target_name
        await _open_and_continue(pilot, app, saved)
        assert app.target_name == local and app.engine.conversation.messages[0]["content"] == "an old question"
        mine = SessionStore().load(app.session.id)
        assert mine.server is None and mine.target == local


async def test_a_local_session_opened_on_a_server_continues_there(dflash_server):
    from dflash_tui.sessions import SessionStore

    saved = _saved_session("/no/such/local/model", None)
    app = DFlashApp(remote=RemoteTarget(dflash_server.base_url), probe_tokens=0)
    app.options.max_tokens = 6
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        served = app.server.model
        await _open_and_continue(pilot, app, saved)
        assert app.server.model == served and app.engine.messages[0]["content"] == "an old question"
        mine = SessionStore().load(app.session.id)
        assert mine.server == dflash_server.base_url and mine.target == served


def _two_model_server():
    from remote_fakes import FakeServer, chunk, models, sse

    fake = FakeServer()
    fake.routes[("GET", "/v1/models")] = (200, "application/json", models("alpha", "beta"))
    fake.routes[("POST", "/v1/chat/completions")] = (200, "text/event-stream",
                                                     sse(chunk("Hi"), chunk(" there"), chunk(None, "stop")))
    return fake.start()


async def _pick(pilot, app, name: str) -> list[str]:
    """F3, then the picker's entry for `name`; returns every entry's text."""
    from textual.widgets import OptionList

    from dflash_tui.ui.model_picker import ModelPicker

    await pilot.press("f3")
    await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.choices, 20, "the picker's list")
    picker = app.screen
    shown = [str(picker.query_one(OptionList).get_option_at_index(i).prompt) for i in range(len(picker.choices))]
    picker.query_one(OptionList).highlighted = [c.target for c in picker.choices].index(name)
    await pilot.pause()
    picker.query_one(OptionList).action_select()
    await wait_for(pilot, lambda: not isinstance(app.screen, ModelPicker), 5, "the picker to close")
    return shown


async def test_the_picker_lists_the_servers_models_and_switches_there(anyio_backend):
    from dflash_tui.ui.remote_worker import RemoteWorker

    fake = _two_model_server()
    try:
        app = DFlashApp(remote=RemoteTarget(fake.url), probe_tokens=0)
        async with app.run_test(size=SIZE) as pilot:
            await connect(pilot, app)
            assert app.server.model == "alpha"
            shown = await _pick(pilot, app, "beta")
            assert len(shown) == 2 and shown[0].startswith("● alpha") and "beta  on the server" in shown[1]
            await wait_for(pilot, lambda: app.model_state == "ready" and app.server.model == "beta", 10, "the switch")
            assert isinstance(app.engine, RemoteWorker) and app.target_name == "beta"
            await turn(pilot, app, "hello")
            asked = [body for method, path, body in fake.seen if path == "/v1/chat/completions"]
            assert asked[-1]["model"] == "beta"
            assert app.chat.query(AssistantMessage).last().raw_text == "Hi there"
    finally:
        fake.stop()


async def test_config_remote_is_offered_beside_local_models_and_moves_the_engine_there(qwen3_dirs):
    from dflash_tui.ui.remote_worker import RemoteWorker

    fake = _two_model_server()
    try:
        app = DFlashApp(model=str(qwen3_dirs["target"]), draft=str(qwen3_dirs["draft"]), probe_tokens=0)
        app.options.remote = fake.url
        async with app.run_test(size=SIZE) as pilot:
            await connect(pilot, app)
            assert app.server is None
            shown = await _pick(pilot, app, fake.url)
            assert any(s.startswith(f"  {fake.url}  remote") for s in shown), shown
            await wait_for(pilot, lambda: app.model_state == "ready" and app.server is not None, 20, "the server")
            assert isinstance(app.engine, RemoteWorker) and app.server.model == "alpha" and app.remote.url == fake.url
            await turn(pilot, app, "hello")
            assert app.chat.query(AssistantMessage).last().raw_text == "Hi there"
    finally:
        fake.stop()


async def test_a_vllm_stream_fills_count_rows_end_to_end(anyio_backend):
    """vLLM cannot run here: its stream is the recorded example (test_remote_client.py, built from vLLM's
    docs), played by a real loopback server; the rows come from its per-step counts, through the client."""
    from remote_fakes import FakeServer, models
    from test_remote_client import VLLM_SPEC, VLLM_STREAM

    fake = FakeServer()
    fake.routes[("GET", "/v1/models")] = (200, "application/json", models("m"))
    fake.routes[("POST", "/v1/chat/completions")] = (200, "text/event-stream", VLLM_STREAM)
    fake.start()
    try:
        app = DFlashApp(remote=RemoteTarget(fake.url), probe_tokens=0)
        async with app.run_test(size=SIZE) as pilot:
            await connect(pilot, app)
            await turn(pilot, app, "hello")
            assert app.chat.query(AssistantMessage).last().raw_text == "Hello there!"
            steps = list(zip(VLLM_SPEC["per_step_accepted"], VLLM_SPEC["per_step_drafted"]))
            assert list(app.acceptance.rows.rows) == [CountRow(i + 1, a, d) for i, (a, d) in enumerate(steps)]
            assert app.acceptance.stats.accepted == VLLM_SPEC["num_accepted_draft_tokens"]
            assert app.acceptance.stats.drafted == VLLM_SPEC["num_draft_tokens"]
    finally:
        fake.stop()


async def command(pilot, app, text: str) -> None:
    app.prompt.value = text
    app.prompt.focus()
    await pilot.press("enter")
    await pilot.pause()


async def test_a_restarted_server_s_target_alone_figure_is_the_one_replies_use(qwen3_dirs):
    args = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]), "--log-level", "warning"]
    port = _free_port()
    with ServerProcess(args, env={"HF_HUB_OFFLINE": "1"}, port=port) as first:
        app = DFlashApp(remote=RemoteTarget(first.base_url), probe_tokens=0)
        app.options.max_tokens = 16
        async with app.run_test(size=SIZE) as pilot:
            await connect(pilot, app)
            await wait_for(pilot, lambda: app.baseline_tps is not None, 10, "the server's figures")
            before = app.baseline_tps
            first.stop()
            with ServerProcess(args, env={"HF_HUB_OFFLINE": "1"}, port=port) as second:  # the same address
                again = json.loads(urllib.request.urlopen(second.base_url + "/v1/models").read())
                measured = again["data"][0]["dflash"]["probe"]["target_alone_tps"]
                assert measured != before  # its own probe, timed anew
                await turn(pilot, app, "Write a function that reverses a list")
                assert app.baseline_tps == app.meter.state.baseline_tps == measured
                done = app.session.messages[-1].done()
                assert done.stats["baseline_tps"] == measured  # the reply's record divides by the new one


@pytest.mark.parametrize("block, shown", [(None, True), (0, True), (16, True), (4, False), (8, False)])
async def test_the_servers_probe_speedup_shows_only_at_the_size_it_ran(dflash_server, block, shown):
    app = DFlashApp(remote=RemoteTarget(dflash_server.base_url), probe_tokens=0)
    if block is not None:  # chosen by the user (--block-size): the server's probe ran its own, 16
        app.options.block_size = block
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        await wait_for(pilot, lambda: app.meter.state.baseline_tps is not None, 10, "the server's figures")
        await pilot.pause(0.1)
        assert app.server.dflash_probe_tps  # the server measured it
        assert (app.meter.state.probe_tps is not None) == shown
        assert ("(probe)" in meter_text(app)) == shown, meter_text(app)


async def test_baseline_and_block_size_reach_a_dflash_serve(dflash_server):
    app = DFlashApp(remote=RemoteTarget(dflash_server.base_url), probe_tokens=0)
    app.options.max_tokens = 24
    async with app.run_test(size=SIZE) as pilot:
        await connect(pilot, app)
        seen = record_events(app)
        await command(pilot, app, "/baseline")
        assert app.baseline
        await turn(pilot, app, "Write a function that reverses a list")
        blocks = [e for e in seen if e.type == "block"]
        rows = list(app.acceptance.rows.rows)
        assert blocks and rows == blocks  # the pane shows the server's target-only steps ...
        assert all(r.drafted == [] for r in rows)  # ... with nothing drafted: the server ran its target alone
        assert seen[-1].type == "done" and seen[-1].stats["mode"] == "baseline"
        assert app.acceptance.mode == "baseline" and app.acceptance.stats.cycles == 0

        await command(pilot, app, "/baseline off")
        await command(pilot, app, "/block 4")
        assert not app.baseline and app.options.block_size == 4
        seen.clear()
        await turn(pilot, app, "And in C?")
        rows = list(app.acceptance.rows.rows)
        assert rows == [e for e in seen if e.type == "block"]
        assert any(r.drafted for r in rows) and all(len(r.drafted) <= 3 for r in rows)
        assert seen[-1].stats["block_size"] == 4 and seen[-1].stats["mode"] == "dflash"
