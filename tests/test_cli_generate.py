"""`dflash-tui generate` end to end, and the one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reference_tokens

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dflash_tui", *args], input=stdin, capture_output=True, text=True, env=env, timeout=300)


def pair_args(dirs) -> list[str]:
    return ["--model", str(dirs["target"]), "--draft", str(dirs["draft"])]


def test_json_events_and_exact_tokens(qwen3_dirs, qwen3_pair):
    r = cli("generate", "hello there", *pair_args(qwen3_dirs), "--max-tokens", "40", "--block-size", "8", "--json")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["type"] == "prefill" and events[-1]["type"] == "done"
    assert {e["type"] for e in events[1:-1]} == {"block"}
    done = events[-1]
    for key in ("tokens", "text", "tokens_per_cycle", "acceptance", "tok_per_s"):
        assert key in done
    prompt = qwen3_pair.target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello there"}], add_generation_prompt=True, enable_thinking=False
    )
    assert done["tokens"] == reference_tokens(qwen3_pair, list(prompt), 40)
    assert sum(len(e["emitted"]) - e["eos"] for e in events if e["type"] == "block") == len(done["tokens"])


def test_stdin_system_raw_and_baseline(qwen3_dirs, qwen3_pair):
    tok = qwen3_pair.target.tokenizer
    r = cli("generate", "-", *pair_args(qwen3_dirs), "--system", "be brief", "--max-tokens", "12", "--json", stdin="from stdin")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
    prompt = tok.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "from stdin"}], add_generation_prompt=True
    )
    assert done["tokens"] == reference_tokens(qwen3_pair, list(prompt), 12)

    r = cli("generate", "raw text", *pair_args(qwen3_dirs), "--no-chat-template", "--baseline", "--max-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
    assert done["stats"]["mode"] == "baseline"
    assert done["tokens"] == reference_tokens(qwen3_pair, tok.encode("raw text"), 12)


def test_plain_text_output(qwen3_dirs):
    r = cli("generate", "hi", *pair_args(qwen3_dirs), "--max-tokens", "10")
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n") and len(r.stdout) > 1
    assert "tok/cycle · " in r.stderr and "% accepted" in r.stderr


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_model_dir(tmp_path):
    assert_one_line_error(cli("generate", "x", "--model", str(tmp_path / "nope"), "--draft", str(tmp_path)), "model not found")


def test_not_a_model(tmp_path, qwen3_dirs):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("generate", "x", "--model", str(tmp_path / "empty"), "--draft", str(qwen3_dirs["draft"])), "not a model directory")
    assert_one_line_error(cli("generate", "x", "--model", str(qwen3_dirs["draft"]), "--draft", str(qwen3_dirs["draft"])), "is a DFlash draft")
    assert_one_line_error(cli("generate", "x", "--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["target"])), "not a DFlash draft")


def test_draft_that_does_not_fit(tmp_path, qwen3_dirs):
    from dflash_tui import random_pair as rp

    cfg = json.loads((qwen3_dirs["target"] / "config.json").read_text())
    wide = dict(cfg, hidden_size=96)
    dcfg = rp.draft_config_for(wide, mask_token_id=999, layers=1, target_layer_ids=[0, 7])
    rp.build_draft(tmp_path / "bad", dcfg)
    r = cli("generate", "x", "--model", str(qwen3_dirs["target"]), "--draft", str(tmp_path / "bad"))
    assert_one_line_error(r, "does not fit", "hidden size 96", "target_layer_ids [7]", "mask_token_id 999")


def test_corrupt_draft_files(tmp_path, qwen3_dirs):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{ not json")
    assert_one_line_error(cli("generate", "x", "--model", str(qwen3_dirs["target"]), "--draft", str(bad)), "unreadable")
    (bad / "config.json").write_text((qwen3_dirs["draft"] / "config.json").read_text())
    assert_one_line_error(cli("generate", "x", "--model", str(qwen3_dirs["target"]), "--draft", str(bad)), "no .safetensors")


def test_unknown_target_needs_a_draft(qwen3_dirs):
    assert_one_line_error(cli("generate", "x", "--model", str(qwen3_dirs["target"])), "no known DFlash draft")


@pytest.mark.parametrize("args,needle", [(["--max-tokens", "0"], "--max-tokens"), (["--block-size", "zero"], "block size")])
def test_bad_flags(qwen3_dirs, args, needle):
    r = cli("generate", "x", *pair_args(qwen3_dirs), *args)
    assert r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr


def test_stdin_with_its_line_end_gives_the_reply_the_same_text_as_an_argument_gives(qwen3_dirs):
    args = [*pair_args(qwen3_dirs), "--max-tokens", "12", "--json"]
    piped = cli("generate", "-", *args, stdin="two lines\nof text\n")  # what `echo` or a file hands over
    given = cli("generate", "two lines\nof text", *args)
    assert piped.returncode == 0 and given.returncode == 0, piped.stderr + given.stderr
    assert json.loads(piped.stdout.splitlines()[-1])["tokens"] == json.loads(given.stdout.splitlines()[-1])["tokens"]
    assert json.loads(piped.stdout.splitlines()[0])["prompt_tokens"] == json.loads(given.stdout.splitlines()[0])["prompt_tokens"]


@pytest.mark.parametrize("flags, words", [(["--pipeline"], "--pipeline needs --distributed (under mlx.launch)"),
                                          (["--rank-timeout", "-1"], "--rank-timeout: seconds, 0 or more"),
                                          (["--rank-timeout", "nan"], "--rank-timeout: seconds, 0 or more")])
def test_distributed_flags_out_of_place_are_usage_errors(qwen3_dirs, flags, words):
    r = cli("generate", "hi", *pair_args(qwen3_dirs), *flags)
    assert r.returncode == 2 and r.stderr.strip().startswith(f"dflash-tui: {words}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_endless_standard_input_is_one_line_not_a_memory_error(qwen3_dirs):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with open("/dev/zero", "rb") as zero:  # `generate - < /dev/zero`: read up to the cap, then refused
        r = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "-", *pair_args(qwen3_dirs)], stdin=zero,
                           capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip() == "dflash-tui: standard input goes past 16 MiB: more text than any context holds"


def test_baseline_prints_target_only_figures(qwen3_dirs):
    r = cli("generate", "hi", *pair_args(qwen3_dirs), "--max-tokens", "6", "--baseline")
    assert r.returncode == 0, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "target only" in last and "tok/cycle" not in last and "accepted" not in last, last
    assert last.startswith("[6 tokens · target only · ") and last.endswith(" tok/s · hit max tokens]"), last


def test_a_block_past_the_drafts_own_is_refused_by_generate_and_bench(qwen3_dirs):
    for command in (["generate", "hi", "--max-tokens", "8"], ["bench", "--runs", "1", "--max-tokens", "8"]):
        r = cli(*command, *pair_args(qwen3_dirs), "--block-size", "17")
        assert_one_line_error(r, "block size 17 refused: the draft was trained to draft blocks of 16 tokens")
        assert r.returncode == 2  # a usage error: the flag's value does not fit this draft
    r = cli("generate", "hi", *pair_args(qwen3_dirs), "--max-tokens", "8", "--block-size", "16")
    assert r.returncode == 0, r.stderr  # the draft's own is the most it may be asked for
