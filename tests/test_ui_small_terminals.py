"""Too few rows for the side panes and a conversation both: the conversation keeps the screen (at 40×12
it got no row at all, the panes all of them); from 18 rows the panes are back. Too few columns for the
acceptance pane beside the meter (under 64): the pane alone, every cycle in it drawn whole."""

from __future__ import annotations

import re

import pytest
from textual.content import Content

from ui_support import feed_trace, install_placeholders, load_trace

install_placeholders()

from dflash_tui.ui.acceptance import visible_token  # noqa: E402
from dflash_tui.ui.app import DFlashApp  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("size", [(40, 12), (80, 17), (30, 8)])
async def test_a_short_narrow_terminal_shows_the_conversation_not_the_panes(size):
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert app.chat.region.height >= size[1] // 2, app.chat.region
        assert app.query_one("#side").region.height == 0
        assert app.prompt.region.height >= 1


async def test_from_18_rows_the_panes_are_back_under_the_conversation():
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(80, 18)) as pilot:
        await pilot.pause()
        assert app.query_one("#side").region.height > 0 and app.chat.region.height >= 4


def _cell(text: str) -> str:
    """A token cell as the pane may draw it: whole, or cut with an ellipsis where it alone is wider than a line."""
    return "(?:" + "|".join([re.escape(text)] + [re.escape(text[:k]) + "…" for k in range(len(text))]) + ")"


async def _drawn_rows(pilot, rows) -> str:
    """Every line of the rows as drawn, scrolled through from the top."""
    drawn: dict[int, str] = {}
    for top in range(0, rows.virtual_size.height, max(1, rows.size.height)):
        rows.scroll_to(y=top, animate=False, immediate=True)
        await pilot.pause()
        for y in range(rows.size.height):
            drawn[rows.scroll_offset.y + y] = "".join(seg.text for seg in rows.render_line(y))
    return "\n".join(drawn[k] for k in sorted(drawn))


@pytest.mark.parametrize("cols", [40, 50, 60, 64, 80])
async def test_every_cycle_is_drawn_whole_at_narrow_widths(cols):
    """Each cycle's kept tokens, the rejected proposal and the target's token are all drawn, none past the
    pane's right edge (its rows went 105 columns wide, cut at the edge; under 64 columns the pane had 10
    columns or none beside the meter); the figures and the legend are never cut either."""
    trace = load_trace()
    decode = {int(k): v for k, v in trace["decoder"].items()}.__getitem__
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(cols, 24)) as pilot:
        app.prompt.cursor_blink = False
        await feed_trace(app, pilot, trace)
        view, rows = app.acceptance, app.acceptance.rows
        assert rows.size.width >= 20, rows.region  # room for a row, whatever the meter takes
        assert rows.virtual_size.width <= rows.size.width  # nothing to scroll sideways to: nothing past the edge
        figures = view.figures.render().plain.split("\n")
        assert all(len(line) <= view.figures.size.width for line in figures), figures
        assert figures[1].count("▁") + sum(figures[1].count(b) for b in "▂▃▄▅▆▇█") == 15, figures
        assert view.figures.region.height == len(figures)
        legend = Content.from_markup(view.border_subtitle or "").plain
        assert "…" not in legend and len(legend) <= view.outer_size.width - 6 and "kept" in legend, legend
        text, at = await _drawn_rows(pilot, rows), 0
        for b in (e for e in trace["events"] if e["type"] == "block" and e["drafted"]):
            kept, own = b["drafted"][:b["accepted"]], b["emitted"][b["accepted"]]
            cells = [_cell(visible_token(decode(t))) for t in kept + [b["drafted"][b["accepted"]], own]]
            found = re.compile(rf"{b['accepted']}/15\s+" + r"\s*".join(cells)).search(text, at)
            assert found, (cols, b["index"], text[at:at + 200])
            at = found.end()


@pytest.mark.parametrize("cols,meter", [(50, False), (64, True)])
async def test_the_replay_gives_its_pane_the_room_too(cols, meter):
    """The replay lays its panes out as the chat does: under 64 columns, the pane without the meter."""
    from fixtures.harness import trace_session
    from dflash_tui.ui.replay_screen import ReplayApp

    app = ReplayApp(trace_session(), paused=True, theme="textual-dark")
    async with app.run_test(size=(cols, 24)) as pilot:
        await pilot.press(*["n"] * 6, *["right"] * 6)  # five cycles into the last reply
        await pilot.pause()
        rows = app.screen.acceptance.rows
        assert len(rows.rows) == 6 and rows.size.width >= 20, rows.region
        assert rows.virtual_size.width <= rows.size.width
        assert app.screen.meter.display == meter
