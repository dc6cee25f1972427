"""The demo pair in the app drafts its own block size (it is there to show acceptance) unless the user chose
a block size; every other pair adapts. Real app, real engine, the bundled pair."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from conftest import demo_pair_bundled  # noqa: E402
from dflash_tui.config import load_config  # noqa: E402
from dflash_tui.demo import demo_draft_path, demo_target_path  # noqa: E402
from dflash_tui.ui.app import DFlashApp  # noqa: E402
from dflash_tui.ui.chat_view import Note  # noqa: E402
from test_ui_app import finish_turn, ready, send, wait_for  # noqa: E402

SIZE = (120, 36)
PROMPT = "Wait until a predicate becomes true."  # a held-out request
DEMO_NOTE = "The demo drafts blocks of 16 always"
pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not demo_pair_bundled(), reason="no demo pair bundled")]


def demo_app(**kw) -> DFlashApp:
    return DFlashApp(model=str(demo_target_path()), draft=str(demo_draft_path()), probe_tokens=0, **kw)


def notes(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query(Note)]


async def load(pilot, app, dirs) -> None:
    app.load_model(str(dirs["target"]), str(dirs["draft"]))
    await wait_for(pilot, lambda: app.model_state == "loading", what="the load to start")
    await ready(pilot, app)


async def test_the_demo_drafts_its_own_block_and_another_pair_adapts(qwen3_dirs):
    app = demo_app()
    app.options.max_tokens = 40
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert app.options.block_size == 0 and app.meter_settings()["block_size"] == 16
        assert any(DEMO_NOTE in n for n in notes(app)), notes(app)
        assert "B 16 " in str(app.meter._body.render())

        await send(pilot, app, PROMPT)
        await finish_turn(pilot, app)
        stats = app.acceptance.stats
        # drafted blocks of 16 throughout: at most a last one-token step alone
        assert stats.cycles >= 2 and stats.target_steps <= 1, stats
        assert len(stats.position_drafted) == 15 and stats.position_drafted[0] == stats.cycles

        await load(pilot, app, qwen3_dirs)  # a real pair: the configured default, auto
        assert app.options.block_size == "auto"
        assert sum(DEMO_NOTE in n for n in notes(app)) == 0  # a new pair starts a new conversation

        await load(pilot, app, {"target": demo_target_path(), "draft": demo_draft_path()})
        assert app.options.block_size == 0 and any(DEMO_NOTE in n for n in notes(app))


async def test_a_block_size_the_user_chose_holds_for_the_demo_and_after(tmp_path, qwen3_dirs):
    path = tmp_path / "config.toml"
    path.write_text('block_size = "auto"\n')
    app = demo_app(config=load_config(path))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert app.options.block_size == "auto" and not any(DEMO_NOTE in n for n in notes(app))

    app = demo_app()  # no block size in any file: /block chooses one
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        shown = sum(DEMO_NOTE in n for n in notes(app))
        await send(pilot, app, "/block 4")
        assert app.options.block_size == 4
        await load(pilot, app, qwen3_dirs)
        assert app.options.block_size == 4
        await load(pilot, app, {"target": demo_target_path(), "draft": demo_draft_path()})
        assert app.options.block_size == 4 and sum(DEMO_NOTE in n for n in notes(app)) == shown == 1
