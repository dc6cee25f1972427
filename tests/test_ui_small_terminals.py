"""Too few rows for the side panes and a conversation both: the conversation keeps the screen (at 40×12
it got no row at all, the panes all of them); from 18 rows the panes are back. Too few columns for the
acceptance pane beside the meter (under 64): one of them alone, f4 switching, every cycle and figure drawn whole."""

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


def _drawn(widget) -> list[str]:
    """The widget's lines as drawn."""
    return ["".join(seg.text for seg in widget.render_line(y)) for y in range(widget.size.height)]


def _border_title(widget) -> str:
    return Content.from_markup(widget.border_title or "").plain


@pytest.mark.parametrize("cols", [40, 50, 60])
async def test_under_64_columns_f4_gives_the_row_to_the_meter_its_figures_whole(cols):
    """Under 64 columns the meter was left out and nothing said it was there: the pane's title names it and
    its key, f4 gives it the row (every figure whole, in the meter's short labels), and f4 again the pane."""
    from dflash_tui.ui.meter import MeterText

    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(cols, 30)) as pilot:
        app.prompt.cursor_blink = False
        await feed_trace(app, pilot, load_trace())
        assert app.acceptance.display and not app.meter.display
        assert _border_title(app.acceptance) == "acceptance · f4 system"
        await pilot.press("f4")
        await pilot.pause()
        assert app.meter.display and not app.acceptance.display
        assert _border_title(app.meter) == "system · f4 acceptance"
        assert app.meter.region.width == cols, app.meter.region  # the whole row
        lines = [line for w in app.meter.query(MeterText) for line in _drawn(w)]
        text = "\n".join(lines)
        assert "…" not in text and all(len(line.rstrip()) <= cols - 2 for line in lines), text
        # the short labels (tok/cyc, pre, mem, B) of a meter under 60 columns: the long ones do not fit
        # (the recorded reply ran at block 16 beside the app's auto: its speedup may say so instead of "speedup")
        for figure in ("471 tok/s turn", "15.18×", "5.80 tok/cyc", "pre 500 t/s", "ttft 84 ms", "mem 9.2G",
                       "pk 9.5G", "rss 10.3G", "Qwen/Qwen3-8B · gpu · Apple M3 Max", "B auto→16", "greedy", "≤512"):
            assert figure in text, (figure, text)
        await pilot.press("f4")
        await pilot.pause()
        assert app.acceptance.display and not app.meter.display


async def test_the_pane_or_meter_chosen_stays_through_a_resize_and_f4_does_nothing_wide():
    """Going wide shows both again, the titles plain and f4 not live; going narrow again shows what was chosen."""
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(60, 30)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert app.meter.display and not app.acceptance.display
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert app.meter.display and app.acceptance.display
        assert app.meter.region.width > 0 and app.acceptance.region.width > 0
        assert (_border_title(app.acceptance), _border_title(app.meter)) == ("acceptance", "system")
        assert "f4" not in app.screen.active_bindings
        await pilot.press("f4")  # nothing to switch: both show
        await pilot.resize_terminal(60, 30)
        await pilot.pause()
        assert app.meter.display and not app.acceptance.display, "the meter, as chosen before going wide"
        assert "f4" in app.screen.active_bindings
        await pilot.press("f4")
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        await pilot.resize_terminal(50, 30)
        await pilot.pause()
        assert app.acceptance.display and not app.meter.display


async def test_the_pane_laid_out_while_the_meter_had_the_row_shows_every_cycle_whole():
    """The cycles come in, and the terminal narrows, while the meter has the row: back on f4, the pane's
    rows fit the width it has then."""
    trace = load_trace()
    app = DFlashApp(start_engine=False)
    async with app.run_test(size=(60, 30)) as pilot:
        app.prompt.cursor_blink = False
        await pilot.press("f4")
        await feed_trace(app, pilot, trace)
        await pilot.resize_terminal(40, 30)
        await pilot.pause()
        assert app.meter.display and not app.acceptance.display
        await pilot.press("f4")
        await pilot.pause()
        rows = app.acceptance.rows
        assert app.acceptance.region.width == 40 and rows.size.width >= 20, rows.region
        assert rows.virtual_size.width <= rows.size.width
        assert all(len(line.rstrip()) <= rows.size.width for line in (await _drawn_rows(pilot, rows)).split("\n"))


def test_f4_is_in_the_f1_help_and_the_readme_keys():
    from pathlib import Path

    from dflash_tui.ui.commands import help_markdown
    from dflash_tui.ui.keys import help_rows

    assert "- `f4` — under 64 columns" in help_markdown(help_rows())
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    keys = readme.split("## Keys", 1)[1].split("\n## ", 1)[0]
    assert "| F4 |" in keys and "meter" in keys.split("| F4 |", 1)[1].split("\n", 1)[0]


async def test_the_replay_switches_its_pane_and_meter_the_same_way():
    from fixtures.harness import trace_session
    from dflash_tui.ui.replay_screen import ReplayApp

    app = ReplayApp(trace_session(), paused=True, theme="textual-dark")
    async with app.run_test(size=(50, 24)) as pilot:
        await pilot.press(*["n"] * 6, *["right"] * 6)
        await pilot.pause()
        screen = app.screen
        assert _border_title(screen.acceptance) == "acceptance · f4 system" and not screen.meter.display
        await pilot.press("f4")
        await pilot.pause()
        assert screen.meter.display and not screen.acceptance.display
        assert screen.meter.region.width == 50
        assert _border_title(screen.meter) == "system · recorded · f4 acceptance"
        await pilot.resize_terminal(100, 24)
        await pilot.pause()
        assert screen.meter.display and screen.acceptance.display
        assert _border_title(screen.meter) == "system · recorded"
        await pilot.resize_terminal(50, 24)
        await pilot.pause()
        assert screen.meter.display and not screen.acceptance.display
