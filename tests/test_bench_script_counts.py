"""The benchmark scripts refuse a count below its least (a prompt of no tokens, no repeats, a block
that drafts nothing) in argparse's one line, exit 2, before any model is built; what they take
still runs."""

from __future__ import annotations

import importlib

import pytest

from dflash_tui.bench import cycle_cost, cycle_profile, paired_cycles

REFUSED = [
    (cycle_cost, ["--prompt", "0"], "--prompt: each value must be at least 1"),
    (cycle_cost, ["--prompt", "16", "-3"], "--prompt: each value must be at least 1"),
    (cycle_cost, ["--tokens", "0"], "--tokens must be at least 1"),
    (cycle_cost, ["--block-size", "1"], "--block-size: each value must be at least 2"),
    (cycle_cost, ["--repeat", "0"], "--repeat must be at least 1"),
    (cycle_cost, ["--draft-layers", "0"], "--draft-layers must be at least 1"),
    (cycle_profile, ["--context", "0"], "--context: each value must be at least 1"),
    (cycle_profile, ["--reps", "0"], "--reps must be at least 1"),
    (cycle_profile, ["--block-size", "1"], "--block-size must be at least 2"),
    (cycle_profile, ["--rows", "4", "0"], "--rows: each value must be at least 1"),
    (cycle_profile, ["--python-profile", "-1"], "--python-profile must be at least 0"),
    (paired_cycles, ["--prompt", "0"], "--prompt: each value must be at least 1"),
    (paired_cycles, ["--rounds", "0"], "--rounds must be at least 1"),
    (paired_cycles, ["--block-size", "1"], "--block-size must be at least 2"),
]
# the other scripts: (module, arguments, message)
OTHERS = [
    ("batch_invariance", ["--context", "0"], "--context: each value must be at least 1"),
    ("batch_invariance", ["--chain", "0"], "--chain must be at least 1"),
    ("block_kernels", ["--reps", "0"], "--reps must be at least 1"),
    ("draft_quant", ["--block-size", "1"], "--block-size must be at least 2"),
    ("exactness", ["--max-tokens", "0"], "--max-tokens must be at least 1"),
    ("exactness", ["--random-prompts", "0"], "--random-prompts must be at least 1"),
    ("kernel_census", ["--block-size", "0"], "--block-size must be at least 2"),
    ("rollback", ["--cycles", "0"], "--cycles must be at least 1"),
    ("rollback", ["--layers", "0"], "--layers must be at least 1"),
    ("rowwise", ["--chain-reps", "0"], "--chain-reps must be at least 1"),
    ("sessions_index", ["--sessions", "0"], "--sessions must be at least 1"),
    ("tui_overhead", ["--runs", "0"], "--runs must be at least 1"),
    ("verify_parts", ["--rows", "0"], "--rows must be at least 1"),
    ("distributed_cost", ["--model", "m", "--draft", "d", "--repeats", "0"], "--repeats must be at least 1"),
    ("distributed_cost", ["--model", "m", "--draft", "d", "--blocks", "4,x"],
     "--blocks: block sizes separated by commas, such as 4,16"),
    ("distributed_cost", ["--model", "m", "--draft", "d", "--blocks", "1,16"],
     "--blocks: each block size must be at least 2"),
]


@pytest.mark.parametrize("script,args,message", REFUSED, ids=[f"{s.__name__.rsplit('.', 1)[1]}{a}" for s, a, _ in REFUSED])
def test_a_count_below_its_least_is_one_line_before_any_model(script, args, message, capsys, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(script, "build", no_model, raising=False)
    monkeypatch.setattr(cycle_cost, "build", no_model)
    with pytest.raises(SystemExit) as exit_:
        script.main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().splitlines()[-1].endswith(message)


@pytest.mark.parametrize("name,args,message", OTHERS, ids=[f"{n}{a[-2:]}" for n, a, _ in OTHERS])
def test_every_other_script_refuses_a_count_below_its_least(name, args, message, capsys):
    script = importlib.import_module(f"dflash_tui.bench.{name}")
    with pytest.raises(SystemExit) as exit_:
        script.main(args)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_the_least_counts_are_taken(capsys):
    assert cycle_cost.main(["--shape", "tiny", "--prompt", "1", "--tokens", "1", "--block-size", "2"]) == 0
    assert "tiny ctx1 run b2" in capsys.readouterr().out
