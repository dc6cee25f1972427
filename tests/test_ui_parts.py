"""The UI's parts on their own: the worker's batching, the model picker, themes, slash parsing."""

from __future__ import annotations

import time

import pytest

from ui_support import FakeConversation, install_placeholders

install_placeholders()

from dflash_tui.ui import messages as msg  # noqa: E402
from dflash_tui.ui.commands import parse  # noqa: E402
from dflash_tui.ui.model_picker import ModelPicker  # noqa: E402
from dflash_tui.ui.model_sources import cached_models, known_pairs  # noqa: E402
from dflash_tui.ui.themes import ThemeError, load_themes, theme_from_dict  # noqa: E402
from dflash_tui.ui.worker import FLUSH_INTERVAL_S, EngineWorker, Generate  # noqa: E402


def run_fake(n: int, cycle_s: float, ui_keeps_up: bool = True) -> tuple[list, float]:
    import dflash_tui.engine.conversation  # noqa: F401  (imports are not part of the turn's time)

    posted: list = []

    def post(message):
        posted.append(message)
        if ui_keeps_up:
            worker.blocks_shown()  # what the app does once it painted a batch

    worker = EngineWorker(post)
    worker.conversation = FakeConversation(n, cycle_s)
    tic = time.perf_counter()
    worker._generate(Generate(1, "hi", {"max_tokens": 10}))
    return posted, time.perf_counter() - tic


def test_fast_cycles_are_coalesced_into_few_messages():
    posted, took = run_fake(300, 0.001)
    batches = [m for m in posted if isinstance(m, msg.TurnBlocks)]
    blocks = [b for m in batches for b in m.blocks]
    assert [b.index for b in blocks] == list(range(300))  # all of them, in order
    assert len(batches) <= took / 0.05 + 2  # about one message per 50 ms
    assert len(batches) < 300 / 10
    assert sum(m.elapsed_s for m in batches) == pytest.approx(took, abs=0.05)
    assert isinstance(posted[0], msg.TurnPrefill) and isinstance(posted[-1], msg.TurnDone)


def test_slow_cycles_go_out_one_by_one():
    posted, _ = run_fake(5, FLUSH_INTERVAL_S + 0.03)
    batches = [m for m in posted if isinstance(m, msg.TurnBlocks)]
    assert [len(m.blocks) for m in batches] == [1] * 5


def test_a_ui_that_has_not_painted_gets_one_bigger_batch_not_a_backlog():
    posted, _ = run_fake(200, 0.001, ui_keeps_up=False)
    batches = [m for m in posted if isinstance(m, msg.TurnBlocks)]
    assert len(batches) == 2  # the first, then everything since, at the end
    assert sum(len(m.blocks) for m in batches) == 200


def test_cancel_stops_the_fake_turn():
    posted: list = []
    worker = EngineWorker(posted.append)
    worker.conversation = FakeConversation(1000, 0.001)
    worker.cancel()
    worker._generate(Generate(1, "hi", {}))
    assert sum(len(m.blocks) for m in posted if isinstance(m, msg.TurnBlocks)) == 0
    worker.submit(Generate(2, "hi", {}))  # a new turn clears the cancel
    assert not worker._should_cancel()


def test_slash_parsing():
    assert parse("/temp 0.7") == ("temp", "0.7")
    assert parse("/System  be brief ") == ("system", "be brief")
    assert parse("hello /temp") is None
    assert parse("//literal") is None
    assert parse("/") is None


def _fake_cache(root, repo_id: str, config: dict) -> None:
    import json

    folder = root / ("models--" + repo_id.replace("/", "--"))
    snap = folder / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("a" * 40)
    (folder / "blobs").mkdir()
    blob = folder / "blobs" / "cfg"
    blob.write_text(json.dumps(config))
    (snap / "config.json").symlink_to(blob)


def test_cached_models_lists_targets_not_drafts(tmp_path):
    assert cached_models(tmp_path / "nothing-here") == []
    _fake_cache(tmp_path, "mlx-community/Qwen3-8B-4bit", {"architectures": ["Qwen3ForCausalLM"]})
    _fake_cache(tmp_path, "z-lab/Qwen3-8B-DFlash-b16", {"architectures": ["DFlashDraftModel"]})
    _fake_cache(tmp_path, "someone/unknown-model", {"architectures": ["LlamaForCausalLM"]})
    found = {c.target: c for c in cached_models(tmp_path)}
    assert set(found) == {"mlx-community/Qwen3-8B-4bit", "someone/unknown-model"}
    assert found["mlx-community/Qwen3-8B-4bit"].draft == "z-lab/Qwen3-8B-DFlash-b16"
    assert "not downloaded" not in found["mlx-community/Qwen3-8B-4bit"].detail
    assert found["someone/unknown-model"].draft is None


def test_known_pairs_come_from_the_registry():
    from dflash_tui.engine.registry import KNOWN_PAIRS

    pairs = known_pairs()
    assert {p.draft for p in pairs} == set(KNOWN_PAIRS.values())


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_model_picker_returns_the_chosen_pair(tmp_path, anyio_backend):
    from textual.app import App
    from textual.widgets import OptionList

    _fake_cache(tmp_path, "Qwen/Qwen3-4B", {"architectures": ["Qwen3ForCausalLM"]})
    results = []

    class Host(App):
        def on_mount(self):
            self.push_screen(ModelPicker(cache_dir=tmp_path), results.append)

    app = Host()
    async with app.run_test(size=(110, 36)) as pilot:
        options = app.screen.query_one(OptionList)
        for _ in range(50):
            if options.option_count:
                break
            await pilot.pause(0.05)
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any("Qwen/Qwen3-4B" in p and "in your cache" in p for p in prompts)
        assert any("known pair" in p for p in prompts)
        cached_index = next(i for i, p in enumerate(prompts) if "in your cache" in p)
        options.highlighted = cached_index
        await pilot.pause()
        options.action_select()
        await pilot.pause()
    assert results == [("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16")]


def test_theme_files_are_checked(tmp_path):
    with pytest.raises(ThemeError, match="not a colour"):
        theme_from_dict({"name": "x", "primary": "blurple"})
    with pytest.raises(ThemeError, match="needs a 'name'"):
        theme_from_dict({"primary": "#fff"})
    (tmp_path / "good.toml").write_text('name = "good"\nprimary = "#112233"\ndark = false\n')
    (tmp_path / "bad.toml").write_text('name = "bad"\nprimary = \n')
    import os
    import threading

    os.mkfifo(tmp_path / "fifo.toml")  # reading it would wait for a writer forever
    (tmp_path / "zero.toml").symlink_to("/dev/zero")
    (tmp_path / "deep.toml").write_text('name = "deep"\nprimary = "#fff"\nv = ' + "[" * 5000 + "]" * 5000 + "\n")
    got = []
    reader = threading.Thread(target=lambda: got.append(load_themes([tmp_path])), daemon=True)
    reader.start()
    reader.join(10)
    assert got, "loading the themes hung"
    themes, problems = got[0]
    assert [t.name for t in themes] == ["good"] and not themes[0].dark
    assert sorted(p.split(":")[0].rsplit("/", 1)[-1] for p in problems) == ["bad.toml", "deep.toml", "fifo.toml",
                                                                            "zero.toml"]
    assert any("not a regular file (a fifo)" in p for p in problems)


def test_bundled_themes_load():
    themes, problems = load_themes()
    assert problems == []
    assert {"dflash-dark", "dflash-light", "dflash-amber"} <= {t.name for t in themes}


def test_chat_command_picks_the_pair(monkeypatch):
    import argparse

    from dflash_tui.commands import chat
    from dflash_tui.errors import UserError

    def args(**kw):
        base = dict(model=None, draft=None, demo=False)
        base.update(kw)
        return argparse.Namespace(**base)

    assert chat._pair(args(model="m", draft="d"), "") == ("m", "d")
    assert chat._pair(args(), "configured/model") == (None, None)  # the app reads config.toml
    with pytest.raises(UserError, match="--draft needs --model"):
        chat._pair(args(draft="d"), "")
    with pytest.raises(UserError, match="cannot be combined"):
        chat._pair(args(demo=True, model="m"), "")
    monkeypatch.setattr(chat, "_demo", lambda: (_ for _ in ()).throw(UserError("no demo here")))
    assert chat._pair(args(), "") == (None, None)  # no demo either: the app opens the picker


def test_a_chunk_streamed_before_mount_shows_once():
    import asyncio

    from textual.app import App
    from textual.widgets import Markdown

    from dflash_tui.ui.chat_view import ChatView

    class Host(App):
        def compose(self):
            yield ChatView()

    async def go() -> str:
        app = Host()
        async with app.run_test() as pilot:
            handle = app.query_one(ChatView).start_assistant()
            handle.append("Hello")  # before the message is mounted
            handle.append(" world")
            await handle.written()  # wait for the write itself, not a fixed pause (slow under load)
            await pilot.pause()
            md = handle.message.query_one(Markdown)
            return md.source + handle.message.tail_text  # a line not yet whole waits in the tail

    assert asyncio.run(go()) == "Hello world"


def test_bare_code_replies_are_shown_fenced_and_prose_is_left_alone():
    from dflash_tui.ui.reply_text import code_blocks, display_text, looks_like_bare_code

    code = "def f(xs):\n    return len(xs)\n"
    assert looks_like_bare_code(code) and looks_like_bare_code("@cache\ndef g(): pass")
    assert display_text(code) == "```python\ndef f(xs):\n    return len(xs)\n```"
    assert code_blocks(display_text(code)) == ["def f(xs):\n    return len(xs)"]
    for text in ("Define a function first.", "Here:\n```python\ndef f(): pass\n```", "default value is 3"):
        assert not looks_like_bare_code(text)
        assert display_text(text) == text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_streamed_bare_code_reply_renders_as_one_code_block(anyio_backend):
    from textual.app import App
    from textual.widgets import Markdown
    from textual.widgets._markdown import MarkdownFence

    from dflash_tui.ui.chat_view import ChatView

    class Host(App):
        def compose(self):
            yield ChatView()

    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        chat = app.query_one(ChatView)
        handle = chat.start_assistant(markdown_interval=0)  # every batch parsed
        for piece in ["de", "f count_lines(path):", "\n    with open(path) as f:", "\n        return len(f.readlines())\n"]:
            handle.append(piece)
            await pilot.pause()
        await handle.written()
        md = handle.message.query_one(Markdown)
        # while it streams, the whole reply is one open code block in the code-shaped tail, line breaks kept
        assert not md.query(MarkdownFence) and handle.message.tail.has_class("-code")
        assert handle.message.tail_text.startswith("def count_lines(path):\n    with open(path) as f:\n")
        await handle.finish()
        await pilot.pause()
        fences = list(md.query(MarkdownFence))
        assert len(fences) == 1 and fences[0].code.startswith("def count_lines(path):\n    with open(path)")
        assert handle.message.raw_text.startswith("def count_lines")  # what is saved stays the model's text


def test_a_reply_start_is_held_back_only_while_it_could_still_be_code():
    from dflash_tui.ui.reply_text import start_undecided

    for start in ("", "  ", "de", "def", "async", "from os", "@"):
        assert start_undecided(start), start
    for start in ("Hello", "def f(x):", "from os import path", "Sure, here", "class\n", "default"):
        assert not start_undecided(start), start


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_model_picker_lists_each_pair_once_with_its_size_and_whether_it_downloads(tmp_path, anyio_backend):
    from textual.app import App
    from textual.widgets import OptionList

    from dflash_tui.demo import demo_draft_path, demo_target_path

    _fake_cache(tmp_path, "Qwen/Qwen3-4B", {"architectures": ["Qwen3ForCausalLM"]})
    demo_target, demo_draft = str(demo_target_path()), str(demo_draft_path())

    class Host(App):
        def on_mount(self):
            # the demo is the pair loaded now: listed once, as such
            self.push_screen(ModelPicker(demo_target, cache_dir=tmp_path, current_draft=demo_draft))

    app = Host()
    async with app.run_test(size=(160, 40)) as pilot:
        options = app.screen.query_one(OptionList)

        def prompts() -> list[str]:
            return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]

        for _ in range(200):  # the list, then the known pairs' download sizes (offline here: said at once)
            if options.option_count and not any("asking the hub" in p for p in prompts()):
                break
            await pilot.pause(0.05)
        shown = prompts()
        assert not any(demo_target in p or demo_draft in p for p in shown), shown  # names, never install paths
        demo_rows = [p for p in shown if "demo (offline)" in p]
        assert len(demo_rows) == 1 and demo_rows[0].startswith("● demo (offline)  loaded now"), demo_rows
        assert "MiB on disk, no download" in demo_rows[0]  # binary units, named so
        (cached,) = [p for p in shown if "Qwen/Qwen3-4B" in p]  # the known pair's target is cached: once
        assert "in your cache" in cached and "B on disk" in cached and "(needs a download)" in cached
        known = [p for p in shown if "known pair" in p]
        assert known and all("needs a download (size unknown offline)" in p for p in known), known
        assert len(shown) == len(set(shown))


def test_a_loaded_local_folder_is_listed_by_its_folder_name_not_its_path(tmp_path):
    from dflash_tui.ui.model_sources import model_choices

    target, draft = tmp_path / "models" / "my-qwen", tmp_path / "models" / "my-qwen-draft"
    for folder in (target, draft):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    loaded = model_choices(str(target), str(draft), tmp_path / "no-cache")[0]
    assert loaded.group == "loaded" and loaded.target == str(target)  # loading still takes the path
    assert loaded.detail.endswith("draft my-qwen-draft") and str(tmp_path) not in loaded.detail, loaded
    assert loaded.name == "my-qwen"  # what the list shows


def test_a_known_pairs_download_size_comes_from_the_hub_or_is_said_unknown(monkeypatch):
    from dflash_tui.ui import model_sources as ms

    choice = ms.ModelChoice("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "", "known", None, True)
    asked = []

    def answer(repo, patterns):  # the hub cannot be reached from the tests: what it would say
        asked.append(repo)
        return {"Qwen/Qwen3-8B": 16_400_000_000, "z-lab/Qwen3-8B-DFlash-b16": 1_000_000_000}[repo]

    monkeypatch.setattr(ms, "hub_size", answer)
    sized, answered = ms.with_download_size(choice, {}, None)
    assert answered and sized.size == 17_400_000_000 and "needs a download of 16.2 GiB" in sized.detail
    sized, _ = ms.with_download_size(choice, {"z-lab/Qwen3-8B-DFlash-b16": 10}, None)  # the draft is cached
    assert sized.size == 16_400_000_000 and asked[-1] == "Qwen/Qwen3-8B"

    def no_answer(repo, patterns):
        raise OSError("no route to host")

    monkeypatch.setattr(ms, "hub_size", no_answer)
    sized, answered = ms.with_download_size(choice, {}, None)
    assert not answered and "size unknown: no answer from the hub" in sized.detail and sized.size is None
    sized, _ = ms.with_download_size(choice, {}, ms.OFFLINE)
    assert "(size unknown offline)" in sized.detail


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_pickers_hint_wraps_inside_its_border_in_a_narrow_terminal(tmp_path, anyio_backend):
    from pathlib import Path

    from textual.app import App
    from textual.widgets import Label

    import dflash_tui.ui as ui_pkg

    class Host(App):
        CSS_PATH = str(Path(ui_pkg.__file__).parent / "app.tcss")  # the app's own styles

        def on_mount(self):
            self.push_screen(ModelPicker(cache_dir=tmp_path))  # an empty cache: the longest hint

    async with Host().run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        hint = pilot.app.screen.query_one("#picker-hint", Label)
        box = pilot.app.screen.query_one("#picker")
        assert "No models in your Hugging Face cache" in str(hint.render())
        assert hint.region.right <= box.content_region.right and hint.size.height >= 2
