"""bench/paired_cycles: one decode takes the setups in turn, cycle by cycle, and decodes what a plain
decode does; ratios are paired by round."""

import json
import os

import mlx.core as mx
import pytest

from dflash_tui.bench import cycle_cost, paired_cycles
from dflash_tui.engine import step_rows
from dflash_tui.engine import target as target_mod
from dflash_tui.engine.speculative import dflash_cycles, draft_proposals
from dflash_tui.engine.state import DecodeState


def test_rounds_alternate_their_order():
    assert paired_cycles.round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert paired_cycles.round_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_bootstrap_interval_holds_the_median_and_narrows_with_agreement():
    spread = [1.0, 1.1, 0.9, 1.3, 0.7, 1.05, 0.95, 1.2, 0.8]
    low, high = paired_cycles.bootstrap_median(spread)
    assert low <= 1.0 <= high and low < high
    assert paired_cycles.bootstrap_median([1.02] * 9) == (1.02, 1.02)


def test_a_paired_decode_switches_setup_every_cycle_and_decodes_the_plain_tokens(monkeypatch):
    # as on MLX CUDA: step rows on where asked (MLX's own per-row calls here), forwards in two groups
    monkeypatch.setattr(step_rows, "wanted", lambda: True)
    monkeypatch.setattr(target_mod, "default_flush_every", lambda n: -(-n // 2))
    target, draft = cycle_cost.build("tiny", 2, mx.float32)
    prompt = cycle_cost.random_prompt(target.vocab_size, 14)
    defaults = {"DFLASH_TUI_KERNELS": os.environ.get("DFLASH_TUI_KERNELS", "")}
    setups = ["engine", "step-rows", "no-flush"]
    records = paired_cycles.paired_decode(target, draft, setups, 4, prompt, 3, defaults)

    assert len(records) == 3 * (3 + paired_cycles.WARMUP_ROUNDS)
    expected = [n for r in range(5) for n in paired_cycles.round_order(setups, r)]
    assert [r["setup"] for r in records] == expected
    for r in records:  # each cycle ran with its own setup's switches
        assert r["step_rows"] == (r["setup"] == "step-rows")
        assert r["flush_every"] == (0 if r["setup"] == "no-flush" else 2)
    assert [r["round"] for r in records[:3]] == [-2] * 3 and records[-1]["round"] == 2

    cycle_cost.apply_setup(target, draft, "engine", defaults)  # the same decode with one setup throughout
    state = DecodeState(target, draft)
    logits, _ = state.prefill(prompt)
    plain: list[list[int]] = []
    for cyc in dflash_cycles(state, int(logits.argmax().item()), 4, lambda: 4 if len(plain) < len(records) else 0,
                             propose=draft_proposals):
        plain.append(list(cyc.emitted))
    assert [r["emitted"] for r in records] == plain  # exact on the CPU, whatever the setup of each cycle

    rows = paired_cycles.summarize(records, setups)
    assert [r["setup"] for r in rows] == setups and all(r["cycles"] == 3 for r in rows)
    assert "ratio_median" not in rows[0]
    for r in rows[1:]:
        assert r["ratio_to"] == "engine" and r["rounds"] == 3
        assert r["ratio_low"] <= r["ratio_median"] <= r["ratio_high"]


def test_the_command_prints_one_row_per_setup(capsys):
    assert paired_cycles.main(["--shape", "tiny", "--prompt", "12", "--setups", "engine", "no-flush",
                               "--rounds", "3", "--block-size", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["setup"] for r in report["rows"]] == ["engine", "no-flush"]
    assert report["rows"][1]["rounds"] == 3 and report["rows"][0]["cycle_ms"] > 0


@pytest.mark.parametrize("args", [["--setups", "engine"], ["--setups", "engine", "engine"], ["--rounds", "0"],
                                  ["--block-size", "1"]])
def test_the_command_refuses_what_it_cannot_pair(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        paired_cycles.main(args)
    assert exit_.value.code == 2 and "error:" in capsys.readouterr().err
