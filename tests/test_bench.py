"""Bench mechanics on the fixture pair: fields, identical-output check, valid JSON (no timing asserts)."""

from __future__ import annotations

import json

from test_cli_generate import assert_one_line_error, cli, pair_args


def test_bench_json_report(qwen3_dirs, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "first"}\nsecond as plain text\n')
    out = tmp_path / "report.json"
    r = cli("bench", *pair_args(qwen3_dirs), "--prompts", str(prompts), "--max-tokens", "24", "--runs", "2",
            "--cooldown", "0", "--block-size", "4", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert json.loads(out.read_text()) == report
    assert report["machine"]["mlx"] and report["machine"]["device"]
    assert len(report["results"]) == 2
    for res in report["results"]:
        assert res["identical"] is True
        assert res["generated_tokens"] == 24
        for side in ("baseline", "dflash"):
            for key in ("decode_tps", "ttft_s", "peak_memory", "tokens_per_cycle", "acceptance"):
                assert key in res[side]
        assert set(res["dflash"]["phases_ms_per_cycle"]) == {"draft", "verify", "rollback", "host"}
        assert res["speedup"] > 0
    assert report["summary"]["all_identical"] is True


def test_bench_table_with_auto_block(qwen3_dirs):
    r = cli("bench", *pair_args(qwen3_dirs), "--max-tokens", "16", "--runs", "1", "--cooldown", "0")
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and "identical outputs: True" in r.stdout and "block auto" in r.stdout


def test_bench_bad_prompts_file(qwen3_dirs, tmp_path):
    assert_one_line_error(cli("bench", *pair_args(qwen3_dirs), "--prompts", str(tmp_path / "none.txt")), "cannot read prompts")


def test_tui_overhead_runs_the_app_and_headless_side_by_side(qwen3_dirs):
    import os
    import subprocess
    import sys

    from test_cli_generate import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "dflash_tui.bench.tui_overhead", *pair_args(qwen3_dirs), "--runs", "2",
                        "--max-tokens", "12", "--prompt", "hello"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip())
    assert lines["reply"].startswith("12 tokens headless, 12 in the TUI")  # the same reply length both ways
    assert len(lines["headless"].split("runs ")[1].split(",")) == 2 and len(lines["in"].split("runs ")[1].split(",")) == 2
    assert "%" in lines["TUI"] and "median" in lines["paired"]


def test_exactness_counts_identical_replies_and_where_they_differ(qwen3_dirs, tmp_path, capsys):
    from dflash_tui.bench import exactness

    prompts = tmp_path / "p.txt"
    prompts.write_text("first request\nsecond request\n")
    assert exactness.main(["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]), "--prompts",
                           str(prompts), "--max-tokens", "24", "--block-size", "4", "auto", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # on MLX's CPU backend the engine runs mlx-lm's own kernels: every reply is identical
    assert report["summary"] == {b: {"identical": 2, "prompts": 2, "first_differences": []} for b in ("4", "auto")}
    assert [(r["prompt"], r["block_size"]) for r in report["rows"]] == [(0, 4), (0, "auto"), (1, 4), (1, "auto")]
    assert all(r["tokens"] == 24 for r in report["rows"])
    # and where two token lists part, it says at which token
    assert exactness.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert exactness.first_difference([1, 2], [1, 2, 3]) == 2 and exactness.first_difference([5], [5]) is None
