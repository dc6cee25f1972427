"""Pilot: a session reopened after a restart of the app starts from its saved caches, not a prefill."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ui_support import install_placeholders

install_placeholders()

from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.ui.sessions_screen import SessionsScreen  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_a_reopened_session_after_a_restart_resumes_warm(qwen3_dirs):
    first = make_app(qwen3_dirs, probe_tokens=0)
    first.options.max_tokens = 12
    async with first.run_test(size=SIZE) as pilot:
        await ready(pilot, first)
        await send(pilot, first, "a first question, long enough to be worth keeping " * 3)
        await finish_turn(pilot, first)
        await wait_for(pilot, lambda: any(Path(os.environ["DFLASH_TUI_CACHE_DIR"]).rglob("*.safetensors")), 10,
                       "the turn's caches on disk")
    # the app restarted: nothing in memory; the session opened from the sessions screen
    second = make_app(qwen3_dirs, probe_tokens=0)
    second.options.max_tokens = 6
    async with second.run_test(size=SIZE) as pilot:
        await ready(pilot, second)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(second.screen, SessionsScreen), 5, "the sessions screen")
        await pilot.press("o")
        await wait_for(pilot, lambda: second.session is not None and len(second.engine.conversation.messages) == 2,
                       10, "the session to open")
        await send(pilot, second, "and a second one")
        await finish_turn(pilot, second)
        state = second.meter.state
        assert state.prompt_tokens and state.cached_tokens and state.cached_tokens > state.prompt_tokens // 2
