"""At 80 columns, the screens with many keys show every one of them in their footer (Close included)."""

from __future__ import annotations

import pytest
from textual.widgets._footer import FooterKey

from fixtures.harness import trace_session
from test_sessions_screen import Host, _store

pytestmark = pytest.mark.anyio


def _footer(screen) -> dict[str, FooterKey]:
    return {k.description: k for k in screen.query(FooterKey)}


async def _assert_footer_fits(app, screen_type) -> None:
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, screen_type)
        keys = _footer(screen)
        shown = {b.description for b in screen._bindings.shown_keys}
        assert set(keys) == shown and "Close" in keys, sorted(keys)
        for label, key in keys.items():
            assert key.region.width > 0 and key.region.right <= screen.size.width, (label, key.region)
        regions = sorted(k.region.x for k in keys.values())
        assert len(set(regions)) == len(regions)  # no key drawn over another


async def test_the_sessions_screens_footer_fits_80_columns(tmp_path):
    from dflash_tui.ui.sessions_screen import SessionsScreen

    await _assert_footer_fits(Host(_store(tmp_path)), SessionsScreen)


async def test_the_replay_screens_footer_fits_80_columns():
    from dflash_tui.ui.replay_screen import ReplayApp, ReplayScreen

    await _assert_footer_fits(ReplayApp(trace_session(), paused=True, theme="textual-dark"), ReplayScreen)
