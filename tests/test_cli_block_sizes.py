"""--block-size is one rule for chat, generate, bench and serve, and `generate`'s closing line follows the
figures' definitions (README "The figures", docs/engine.md): tokens/cycle = tokens the drafting cycles
gave / cycles, acceptance = accepted / drafted, and no cycle figure where no cycle drafted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from conftest import demo_pair_bundled
from dflash_tui import cli
from dflash_tui.engine.conversation import Conversation
from dflash_tui.engine.events import Block, Done
from test_cli_generate import assert_one_line_error
from test_cli_generate import cli as run_cli
from test_cli_generate import pair_args

RULE = "a block size is auto, 0 (the draft's own) or a number from 2 up to the draft's own"
# the chat's words (figure_rules.reply_summary): "N tokens · τ tok/cycle · A% accepted · X tok/s[ · how it ended]"
LINE = re.compile(r"^\[(\d+) tokens? · (?:(?P<tpc>[\d.]+) tok/cycle · (?P<acc>\d+)% accepted"
                  r"|(?P<alone>target only(?: \([^)]*\))?))(?: · [\d.]+ tok/s)?(?: · (?P<end>[a-z ]+))?\]$")
needs_demo = pytest.mark.skipif(not demo_pair_bundled(), reason="no demo pair bundled")


@pytest.fixture
def recorded(monkeypatch) -> list[Any]:
    """Every event `generate` gets from the engine, as it gets it."""
    events: list[Any] = []
    real = Conversation.generate

    def generate(self, *args: Any, **kwargs: Any):
        for event in real(self, *args, **kwargs):
            events.append(event)
            yield event

    monkeypatch.setattr(Conversation, "generate", generate)
    return events


def closing_line(stderr: str) -> re.Match:
    last = stderr.strip().splitlines()[-1]
    found = LINE.match(last)
    assert found, last
    return found


@pytest.mark.parametrize("pair", [pytest.param("demo", marks=needs_demo), "fixture"])
@pytest.mark.parametrize("extra", [["--block-size", "16"], ["--block-size", "4"], ["--block-size", "auto"],
                                   ["--block-size", "0"], ["--max-tokens", "1"]],
                         ids=["16", "4", "auto", "0", "one-token"])
def test_the_closing_line_is_the_figures_of_the_cycles_it_ran(pair, extra, recorded, capsys, qwen3_dirs):
    model = ["--demo"] if pair == "demo" else pair_args(qwen3_dirs)
    assert cli.main(["generate", "Reverse a list", *model, "--max-tokens", "48", *extra]) == 0
    line = closing_line(capsys.readouterr().err)
    done = recorded[-1]
    assert isinstance(done, Done)
    cycles = [e for e in recorded if isinstance(e, Block) and e.drafted]
    assert done.stats["cycles"] == len(cycles)
    assert int(line.group(1)) == done.stats["generated_tokens"] == len(done.tokens)
    if not cycles:  # nothing drafted: no tokens per cycle (never below 1) and no acceptance to speak of
        assert line.group("alone") == "target only (no cycle drafted)", line.group(0)
        return
    drafted = sum(len(b.drafted) for b in cycles)
    accepted = sum(b.accepted for b in cycles)
    given = sum(len(b.emitted) for b in cycles)  # the end-of-reply token included
    assert all(b.accepted <= len(b.drafted) and len(b.emitted) >= 1 for b in cycles)
    assert given / len(cycles) >= 1
    assert line.group("tpc") == f"{given / len(cycles):.2f}", (line.group(0), given, len(cycles))
    assert f"{line.group('acc')}%" == f"{accepted / drafted:.0%}", (line.group(0), accepted, drafted)


def test_json_has_no_cycle_figures_when_no_cycle_drafted(qwen3_dirs):
    r = run_cli("generate", "hi", *pair_args(qwen3_dirs), "--max-tokens", "1", "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
    assert done["stats"]["cycles"] == 0
    assert done["tokens_per_cycle"] is None and done["acceptance"] is None


@pytest.mark.parametrize("command", [["generate", "hi"], ["bench", "--runs", "1"], ["serve"]], ids=lambda c: c[0])
@pytest.mark.parametrize("value", ["1", "300", "zero", "-1"])
def test_a_refused_block_size_is_one_line_with_one_rule(command, value, qwen3_dirs):
    try:  # refused before loading: seconds (a serve that took it would run on)
        r = subprocess.run([sys.executable, "-m", "dflash_tui", *command, *pair_args(qwen3_dirs), "--block-size", value],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command[0]} took --block-size {value}")
    assert_one_line_error(r, f"--block-size {value}: {RULE}")
    assert r.returncode == 2  # a usage error, as every other flag's
    if value == "1":
        assert "1 drafts nothing" in r.stderr and "target alone" in r.stderr, r.stderr


def test_generate_and_bench_take_0_as_the_drafts_own(qwen3_dirs):
    r = run_cli("generate", "hi", *pair_args(qwen3_dirs), "--max-tokens", "6", "--block-size", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["stats"]["block_size"] == 16
    r = run_cli("bench", *pair_args(qwen3_dirs), "--runs", "1", "--cooldown", "0", "--max-tokens", "6",
                "--block-size", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["block_size"] == 16


def test_serve_takes_0_as_the_drafts_own_and_refuses_17_at_start(qwen3_dirs):
    from dflash_tui.server.launch import ServerProcess

    with ServerProcess([*pair_args(qwen3_dirs), "--block-size", "0", "--log-level", "warning"]) as s:
        assert "draft block 16" in s.log(), s.log()
    try:
        r = subprocess.run([sys.executable, "-m", "dflash_tui", "serve", *pair_args(qwen3_dirs), "--port", "0",
                            "--block-size", "17"], capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("serve started with a block size its draft refuses on every request")
    assert r.returncode == 2  # a usage error
    assert r.stderr.strip().splitlines()[-1].startswith("dflash-tui: block size 17 refused: the draft was trained"), r.stderr


@pytest.mark.parametrize("value", ["auto", "0", "2", "16", "1", "257", "x", "-1"])
def test_generate_accepts_what_chat_accepts(value, started, qwen3_dirs, capsys):
    def accepted(argv: list[str]) -> bool:
        try:
            return cli.main(argv) == 0
        except SystemExit:  # argparse refused it
            return False

    model = pair_args(qwen3_dirs)
    in_chat = accepted(["chat", *model, "--block-size", value])
    in_generate = accepted(["generate", "hi", *model, "--max-tokens", "2", "--block-size", value])
    assert in_chat == in_generate, capsys.readouterr().err
