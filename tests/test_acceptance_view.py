"""The acceptance view: figures that agree with the engine, rows that say what happened, bounded cost."""

from __future__ import annotations

import pytest

from fixtures.harness import PanesApp, trace_session
from dflash_tui.engine.events import Block
from dflash_tui.ui.acceptance import AcceptanceRows, AcceptanceStats, AcceptanceView, bar, visible_token

pytestmark = pytest.mark.anyio


def _blocks(message_index: int) -> list[Block]:
    return [e for e in trace_session().messages[message_index].events() if isinstance(e, Block)]


def test_figures_agree_with_the_engines_own_stats():
    session = trace_session()
    for reply in session.replies():
        stats = AcceptanceStats()
        stats.add([e for e in reply.events() if isinstance(e, Block)])
        done = reply.done().stats
        assert stats.cycles == done["cycles"]
        if done["cycles"]:
            assert stats.tokens_per_cycle == pytest.approx(done["tokens_per_cycle"])
            assert stats.acceptance == pytest.approx(done["acceptance"])
        else:
            blocks = [e for e in reply.events() if isinstance(e, Block)]
            # block 0 is the prefill's token; a last step cut at the token limit gave none
            assert stats.tokens_per_cycle is None and stats.target_steps == len([b for b in blocks[1:] if b.emitted])
            assert sum(b.reply_tokens for b in blocks) == done["generated_tokens"]
        # the figures add up to the reply: its first token (the prefill's) + the cycles' + one per target-only
        # step, less the end-of-text token where one ended it
        ended = any(b.eos for b in reply.events() if isinstance(b, Block))
        assert 1 + stats.cycle_tokens + stats.target_steps - ended == done["generated_tokens"]


def test_position_profile_and_length_histogram():
    stats = AcceptanceStats()
    stats.add([Block(0, [], 0, [5], ""), Block(1, [1, 2, 3, 4], 2, [1, 2, 9], ""),
               Block(2, [1, 2, 3, 4], 4, [1, 2, 3, 4, 5], ""), Block(3, [1, 2, 3, 4], 0, [7], ""),
               Block(4, [], 0, [6], "")])  # the prefill's token is not a target-only step; block 4 is
    assert stats.position_rates() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert stats.accepted_lengths == [1, 0, 1, 0, 1]
    assert stats.target_steps == 1 and stats.cycles == 3
    assert stats.tokens_per_cycle == pytest.approx((3 + 5 + 1) / 3)
    assert bar(None) == " " and bar(0.0) == "▁" and bar(1.0) == "█"


def test_token_text_is_made_visible():
    assert visible_token(" a\tb\n") == "·a→b⏎"
    assert visible_token("\x1b[2J") == "␛[2J"  # a control sequence cannot reach the terminal
    assert visible_token("") == "∅"
    assert visible_token("abcdefghijklmnop") == "abcdefghi…"


def _styled(lines) -> list[tuple[str, str]]:
    """(text, which cell style) for a row's lines, by comparing with the component styles."""
    return [(seg.text.strip(), seg.style) for line in lines for seg in line if seg.text.strip()]


async def test_rows_mark_accepted_rejected_target_and_dimmed():
    decoder = {1: "a", 2: " b", 3: "c", 4: "d", 5: "\n", 7: "E", 9: "X"}.__getitem__
    app = PanesApp()
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.query_one(AcceptanceView)
        view.set_decoder(decoder)
        view.add_blocks([Block(0, [], 0, [5], "\n"), Block(1, [1, 2, 3, 4], 2, [1, 2, 9], "a bX"),
                         Block(2, [1, 2, 3], 3, [1, 2, 3, 4], "a bcd"),
                         Block(3, [1, 2, 3], 1, [1, 7], "a", eos=True),  # the target's own token is the EOS (7)
                         Block(4, [1, 7, 3], 2, [1, 7], "a", eos=True)])  # the draft got the EOS right
        await pilot.pause()
        rows: AcceptanceRows = view.rows
        st = rows.get_component_rich_style
        acc, rej, own, dim = (st(f"acceptance--{n}") for n in ("accepted", "rejected", "target", "dimmed"))
        plain, partial, full, cut, kept_end = (_styled(rows._row_lines(i)) for i in range(5))
        assert plain[-1] == ("⏎", own)  # nothing drafted: just the target's token
        cells = partial[2:]  # after the index and the count
        assert partial[1][0] == "2/4"
        assert cells == [("a", acc), ("·b", acc), ("c", rej), ("X", own), ("d", dim)]
        # the target's own token sits right against the rejected proposal
        texts = "".join(seg.text for line in rows._row_lines(1) for seg in line)
        assert "c" + "X" in texts
        assert full[2:] == [("a", acc), ("·b", acc), ("c", acc), ("d", own)]  # all kept, plus the bonus token
        end = st("acceptance--end")
        assert cut[2:] == [("a", acc), ("·b", rej), ("⏹", end), ("c", dim)]  # the target ended the reply
        # an EOS the draft proposed and the target kept: the reply ends there; what follows is unused, not rejected
        assert kept_end[2:] == [("a", acc), ("E", acc), ("⏹", end), ("c", dim)]


async def test_rows_are_capped_and_batches_repaint_once():
    app = PanesApp()
    async with app.run_test(size=(100, 30)) as pilot:
        view = app.query_one(AcceptanceView)
        view.rows.rows = type(view.rows.rows)(maxlen=50)
        calls = []
        original = view.rows.refresh
        view.rows.refresh = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
        batch = [Block(i, [1, 2, 3], i % 4, [1] * (i % 4 + 1), "x") for i in range(1, 121)]
        view.add_blocks(batch[:60])
        view.add_blocks(batch[60:])
        assert len(calls) <= 4  # two batches, not 120 blocks' worth of repaints
        await pilot.pause()
        assert len(view.rows.rows) == 50 and view.rows.rows[0].index == 71
        assert view.stats.cycles == 120  # the figures still count every cycle
        assert view.rows.virtual_size.height == 50
        assert view.rows.is_vertical_scroll_end  # following the newest row
        view.rows.scroll_to(0, 3, animate=False, immediate=True)  # the user looks back
        await pilot.pause()
        view.add_blocks(batch[:5])
        await pilot.pause()
        assert view.rows.scroll_offset.y == 3  # left where they are
        view.rows.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        for i in range(0, 30, 6):  # quick batches, no repaint between them
            view.add_blocks(batch[i:i + 6])
        await pilot.pause(0.1)
        assert view.rows.is_vertical_scroll_end and view.rows.rows[-1].index == 30
        view.reset()
        await pilot.pause()
        assert view.stats.cycles == 0 and len(view.rows.rows) == 0


def _feed_last_reply(app) -> None:
    session = trace_session()
    view = app.query_one(AcceptanceView)
    view.set_decoder(session.decode)
    blocks = _blocks(6)
    for i in range(0, len(blocks), 4):
        view.add_blocks(blocks[i:i + 4])


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot_acceptance_after_a_reply(snap_compare, size):
    assert snap_compare(PanesApp(feed=_feed_last_reply), terminal_size=size)


def _alone(i: int) -> Block:
    return Block(i, [], 0, [5], "a")


def _drafted(i: int) -> Block:
    return Block(i, [1, 2, 3], 1, [1, 9], "b")


async def test_the_pane_says_in_words_when_the_sizer_runs_the_target_alone():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        view = pilot.app.query_one(AcceptanceView)
        view.reset("dflash")
        view.add_blocks([_alone(0), _drafted(1), _alone(2), _alone(3), _alone(4)])  # three: not yet "a while"
        await pilot.pause()
        assert not view.note.display
        view.add_blocks([_alone(5)])
        await pilot.pause()
        assert view.note.display and view.note.region.height >= 1
        assert str(view.note.render()) == "drafting does not pay here: target alone, re-checking every 12 steps"
        view.add_blocks([_drafted(6)] + [_alone(i) for i in range(7, 19)])  # the sizer's one re-check
        await pilot.pause()
        assert view.note.display
        view.add_blocks([_drafted(19), _drafted(20)])  # drafting pays again
        await pilot.pause()
        assert not view.note.display
        view.reset("baseline")  # a /baseline reply: nothing drafted on purpose, no sizer to speak of
        view.add_blocks([_alone(i) for i in range(10)])
        await pilot.pause()
        assert not view.note.display


@pytest.mark.parametrize("which,words", [(0, ["kept", "rejected", "target", "unused"]),
                                         (1, ["kept", "rej", "tgt", "unused"]), (2, ["kept", "rej", "tgt"])])
def test_the_legend_swatches_stand_apart(which, words):
    from textual.content import Content

    from dflash_tui.ui.acceptance import LEGENDS

    legend = Content.from_markup(LEGENDS[which])
    assert legend.plain.split() == words
    # every swatch with a background is padded inside its colour, and a plain space lies between two spans
    coloured = sorted((s.start, s.end) for s in legend.spans if " on " in str(s.style))
    assert len(coloured) == 3
    assert all(legend.plain[a] == " " and legend.plain[b - 1] == " " for a, b in coloured)
    spans = sorted((s.start, s.end) for s in legend.spans)
    assert all(a2 > b1 for (_, b1), (a2, _) in zip(spans, spans[1:]))


async def test_the_cycle_count_reads_as_words():
    app = PanesApp()
    async with app.run_test(size=(100, 30)) as pilot:
        view = app.query_one(AcceptanceView)
        view.add_blocks([Block(1, [1, 2, 3], 2, [1, 2, 3], "x")])
        await pilot.pause()
        first_line = str(view.figures.render()).splitlines()[0]
        assert first_line.endswith("accepted  1 cycle"), first_line
        view.add_blocks([Block(2, [1, 2, 3], 1, [1, 2], "x")])
        await pilot.pause()
        assert "2 cycles" in str(view.figures.render())


async def test_the_figures_line_is_never_cut_off():
    """Between the narrow and the wide labels the wide line may not fit: the short ones are used then,
    the target-only steps included (they were cut off as "+1 targ…")."""
    widths = set()
    for cols in [64, 66, 72, 80, *range(90, 160, 6)]:  # 64: the pane holds 20 columns, 66: 22
        app = PanesApp()
        async with app.run_test(size=(cols, 30)) as pilot:
            view = app.query_one(AcceptanceView)
            view.add_blocks([Block(0, [], 0, [7], "x")]  # the prefill's token
                            + [Block(i, list(range(15)), 12, list(range(13)), "x") for i in range(1, 44)]
                            + [Block(44, [], 0, [8], "x")])  # one target-only step
            await pilot.pause()
            width = view.figures.size.width
            first = str(view.figures.render()).splitlines()[0]
            assert len(first) <= width and "+1" in first and "43" in first and "80%" in first, (width, first)
            bars = str(view.figures.render()).splitlines()[1]
            if width >= 20:  # room for the label and the 15 bars: the axis is whole or left out, never cut
                assert len(bars) <= width and (bars.endswith(" 1…15") or "…" not in bars), (width, bars)
            widths.add("tok/cycle" in first and 2 or "tok/cyc" in first and 1 or first.split()[0].endswith("τ") and 0)
    assert widths == {0, 1, 2}  # every label set was exercised: words, short labels, symbols


async def test_bars_wider_than_the_pane_go_on_under_their_label():
    """A draft of 32 (31 positions, 32 kept lengths) in a 20-column pane: the bars went 16 past its edge."""
    async with PanesApp().run_test(size=(64, 30)) as pilot:
        view = pilot.app.query_one(AcceptanceView)
        view.add_blocks([Block(i, list(range(31)), i % 32, list(range(i % 32 + 1)), "x") for i in range(1, 65)])
        await pilot.pause()
        width, lines = view.figures.size.width, view.figures.render().plain.split("\n")
        assert width == 20 and len(lines) > 3, lines
        assert all(len(line) <= width for line in lines), lines
        assert view.figures.region.height == len(lines)  # laid out to its lines, none hidden under the rows
        pos = lines[1:lines.index(next(ln for ln in lines if ln.startswith("len")))]
        assert pos[0].startswith("pos") and all(not ln[:5].strip() for ln in pos[1:])  # continued under the bars
        assert sum(len(ln[5:]) for ln in pos) == 31 and max(len(ln) for ln in pos) - min(len(ln) for ln in pos) <= 1


@pytest.mark.parametrize("cols,counted", [(160, False), (64, True)])
async def test_a_row_past_two_lines_counts_its_unused_proposals(cols, counted):
    """Wide, a cycle's unused proposals are drawn (two lines); narrow, they are counted, so the kept run, the
    rejected proposal and the target's token stay in a few lines (five lines shown, in a 22-column pane)."""
    async with PanesApp().run_test(size=(cols, 30)) as pilot:
        view = pilot.app.query_one(AcceptanceView)
        view.set_decoder(lambda t: f"w{t:02d}")
        view.add_blocks([Block(1, list(range(1, 16)), 2, [1, 2, 30], "x")])
        await pilot.pause()
        drawn = ["".join(s.text for s in view.rows.render_line(y)) for y in range(view.rows.virtual_size.height)]
        text = " ".join(drawn)
        assert ("12 unused" in text) == counted and ("w15" in text) != counted, drawn
        assert "w01 w02 w03w30" in text and len(drawn) <= 2 + counted, drawn
