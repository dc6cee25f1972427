"""Bench mechanics on the fixture pair: fields, identical-output check, valid JSON (no timing asserts)."""

from __future__ import annotations

import json

import pytest

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
        d = res["dflash"]  # the raw counts behind the row's ratios, as the engine's stats count them
        assert d["cycles"] > 0 and d["tokens_per_cycle"] == pytest.approx(d["cycle_tokens"] / d["cycles"])
        assert d["acceptance"] == pytest.approx(d["accepted"] / d["drafted"])
    s = report["summary"]
    assert s["all_identical"] is True
    assert "tokens_per_cycle_mean" not in s
    for key in ("cycles", "cycle_tokens", "drafted", "accepted"):
        assert s[key] == sum(res["dflash"][key] for res in report["results"])
    assert s["tokens_per_cycle"] == s["cycle_tokens"] / s["cycles"] and s["acceptance"] == s["accepted"] / s["drafted"]


def _row(cycle_tokens: int, cycles: int, speedup: float, peak: int = 37_961_090) -> dict:
    side = {"decode_tps": 10.0, "ttft_s": 0.1, "peak_memory": peak, "tokens_per_cycle": 1.0, "acceptance": 0.0}
    dflash = {**side, "decode_tps": 10.0 * speedup, "tokens_per_cycle": cycle_tokens / cycles,
              "acceptance": (cycle_tokens - cycles) / (15 * cycles), "cycles": cycles, "cycle_tokens": cycle_tokens,
              "drafted": 15 * cycles, "accepted": cycle_tokens - cycles}
    return {"prompt_tokens": 20, "generated_tokens": cycle_tokens + 1, "baseline": side, "dflash": dflash,
            "speedup": speedup, "identical": True}


def test_bench_summary_pools_the_cycles_of_all_prompts_and_says_mib():
    """The audit's case: rows at 4.50, 2.83 and 5.75 tokens/cycle are 75 tokens over 20 cycles, 3.75
    pooled (README: tokens the cycles gave over the cycles), not their mean 4.36."""
    from dflash_tui.bench.compare import format_table, summarize

    results = [_row(18, 4, 0.55), _row(34, 12, 0.31), _row(23, 4, 0.76)]
    s = summarize(results, temperature=0.0)
    assert (s["cycle_tokens"], s["cycles"], s["tokens_per_cycle"]) == (75, 20, 3.75)
    assert (s["accepted"], s["drafted"], s["acceptance"]) == (55, 300, 55 / 300)
    assert s["speedup_median"] == 0.55 and s["all_identical"] is True
    report = {"machine": {"device": "cpu", "backend": "cpu", "mlx": "0", "mlx-lm": "0", "commit": None}, "target": "t",
              "draft": "d", "attention": "fused", "results": results, "summary": s,
              "settings": {"max_tokens": 48, "runs": 1, "cooldown_s": 0, "block_size": 16, "temperature": 0.0}}
    text = format_table(report)
    assert "all prompts pooled: 3.75 tokens/cycle (75 tokens over 20 cycles), acceptance 18% (55 of 300 drafted)" in text
    assert "speedup 0.55x (median of per-prompt speedups)" in text
    assert "mean" not in text and "4.36" not in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("prompt"))
    assert "peak MiB" in header and "MB" not in header
    assert all(line.split()[7] == "36" for line in text.splitlines()[6:9])  # 37,961,090 bytes: 36.2 MiB
    # no cycle drafted anywhere: no pooled ratio, said in words
    alone = summarize([{**_row(1, 1, 1.0), "dflash": {**_row(1, 1, 1.0)["dflash"], "cycles": 0, "cycle_tokens": 0,
                                                        "drafted": 0, "accepted": 0}}], temperature=0.0)
    assert alone["tokens_per_cycle"] is None and alone["acceptance"] is None
    assert "no cycle drafted" in format_table({**report, "results": [], "summary": alone})


def test_bench_table_with_auto_block(qwen3_dirs):
    r = cli("bench", *pair_args(qwen3_dirs), "--max-tokens", "16", "--runs", "1", "--cooldown", "0",
            "--prompt", "Say hello\n  in   French, please")
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and "identical outputs: True" in r.stdout and "block auto" in r.stdout
    lines = r.stdout.splitlines()
    # the pair by its names (model_names: a local folder by its folder name), never where it is
    assert lines[0] == "target  <-  draft" and str(qwen3_dirs["target"].parent) not in r.stdout, r.stdout
    assert "commit None" not in r.stdout
    assert "prompt 1: Say hello in French, please" in lines  # the row's number, keyed to the prompt's words
    row = next(line for line in lines if line.split()[:1] == ["1"])
    assert len(row.split()) == 10, row


def test_bench_table_names_the_demo_pair_and_says_the_commit_only_when_known():
    from dflash_tui.bench.compare import format_table, prompt_label, summarize
    from dflash_tui.demo import demo_draft_path, demo_target_path

    results = [{**_row(18, 4, 0.55), "prompt": "Write a Python function that returns the n-th Fibonacci number, "
                                               "with a docstring."}, _row(18, 4, 0.55)]
    report = {"machine": {"device": "cpu", "backend": "cpu", "mlx": "0", "mlx-lm": "0", "commit": None},
              "target": str(demo_target_path()), "draft": str(demo_draft_path()), "attention": "fused",
              "results": results, "summary": summarize(results, temperature=0.0),
              "settings": {"max_tokens": 48, "runs": 1, "cooldown_s": 0, "block_size": 16, "temperature": 0.0}}
    text = format_table(report)
    lines = text.splitlines()
    assert lines[0] == "demo (offline)  <-  its draft" and str(demo_target_path()) not in text
    assert lines[1] == "cpu (cpu), mlx 0, mlx-lm 0" and "commit" not in text
    assert "prompt 1: Write a Python function that returns the n-th Fibonacci…" in lines
    assert not any(line.startswith("prompt 2:") for line in lines)  # no text kept: the row's number alone
    assert [line.split()[0] for line in lines if line.split()[:1] in (["1"], ["2"])] == ["1", "2"]
    known = format_table({**report, "machine": {**report["machine"], "commit": "abc1234"}})
    assert known.splitlines()[1].endswith(", dflash-tui commit abc1234")
    assert prompt_label("", 3) == "prompt 3"


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
                           str(prompts), "--max-tokens", "24", "--block-size", "4", "auto", "--verify", "steps",
                           "batched", "--reference-twice", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    # each row was also reported as it completed (a run cut short keeps them)
    assert [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")] == report["rows"]
    # on MLX's CPU backend the engine runs mlx-lm's own kernels: every reply is identical, either way
    assert report["step_rows"] is False  # nothing to change on the CPU
    assert report["summary"] == {f"{v} {b}": {"identical": 2, "prompts": 2, "first_differences": []}
                                 for v, b in [("vanilla again", "-")] + [(v, b) for v in ("steps", "batched")
                                                                          for b in ("4", "auto")]}
    assert [(r["prompt"], r["verify"], r["block_size"]) for r in report["rows"]] == [
        (p, v, b) for p in (0, 1) for v, b in [("vanilla again", "-")] + [(v, b) for v in ("steps", "batched")
                                                                           for b in (4, "auto")]]
    assert all(r["tokens"] == 24 for r in report["rows"])
    # and where two token lists part, it says at which token
    assert exactness.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert exactness.first_difference([1, 2], [1, 2, 3]) == 2 and exactness.first_difference([5], [5]) is None


def test_draft_quant_bench_reports_each_width_and_identical_replies(qwen3_dirs, tmp_path, capsys):
    from dflash_tui.bench import draft_quant

    prompts = tmp_path / "p.txt"
    prompts.write_text("first request\nsecond request\n")
    assert draft_quant.main(["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]), "--prompts",
                             str(prompts), "--max-tokens", "16", "--block-size", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["drafts"]) == ["none", "8-bit", "4-bit"] and report["prompts"] == 2
    rows = report["drafts"]
    for r in rows.values():
        assert r["identical_replies"] == 2 and r["cycles"] > 0
        assert 0 <= r["acceptance"] <= 1 and 1 <= r["tokens_per_cycle"] <= 4
    # the weights really shrink: 4-bit under 8-bit under the bfloat16 draft
    assert rows["4-bit"]["draft_weight_bytes"] < rows["8-bit"]["draft_weight_bytes"] < rows["none"]["draft_weight_bytes"]


def test_warm_resume_bench_prefills_only_the_new_turn_warm(qwen3_dirs, capsys):
    from dflash_tui.bench import warm_resume

    assert warm_resume.main(["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]),
                             "--tokens", "900", "--runs", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 500 < report["prompt_tokens"] <= 900 + 60
    assert report["prefilled_tokens"]["cold"] == report["prompt_tokens"]
    assert 0 < report["prefilled_tokens"]["warm"] < report["prompt_tokens"] // 2
    assert report["same_first_token"] is True and report["file_bytes"] > 0
    assert report["ttft_cold_s"] > 0 and report["ttft_warm_s"] > 0


def test_warm_resume_bench_runs_a_random_real_format_shape_hybrid_state_included(capsys):
    from dflash_tui.bench import warm_resume

    assert warm_resume.main(["--shape", "tiny-hybrid", "--tokens", "700", "--runs", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pair"] == ["tiny-hybrid", "tiny-hybrid-draft"]
    assert report["prefilled_tokens"]["cold"] == report["prompt_tokens"] > 400
    assert 0 < report["prefilled_tokens"]["warm"] < report["prompt_tokens"] // 2
    assert report["same_first_token"] is True and report["file_bytes"] > 0
    with pytest.raises(SystemExit):
        warm_resume.main(["--shape", "tiny", "--demo"])


def test_batch_invariance_compares_verify_rows_with_decode_steps_bit_for_bit(capsys):
    from dflash_tui.bench import batch_invariance as bi

    assert bi.main(["--shape", "tiny", "--context", "20"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    parts = {r["part"] for r in rows}
    assert {"linear", "4-bit linear", "attention", "per-row ops", "model"} <= parts
    # on the CPU every part is batch-invariant already, and the candidates keep it so
    for r in rows:
        for key, value in r.items():
            if key.endswith("equal_rows"):
                assert value == bi.ROWS, (r["part"], key)
    models = [r for r in rows if r["part"] == "model"]
    assert [m["candidates"] for m in models] == [False, True]
    assert all(m["argmax_agree"] == bi.ROWS and m["max_diff"] == 0.0 for m in models)


def test_rowwise_candidates_replace_every_linear_head_and_attention():
    import mlx.core as mx
    import mlx.nn as nn

    from dflash_tui import random_pair as rp
    from dflash_tui.bench import batch_invariance as bi

    model = rp.build_model(rp.qwen3_config(384, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                                           intermediate=128, tie=True), dtype=mx.float32)
    x = mx.random.normal((1, 5, 64))
    before = model.model.layers[0].mlp.gate_proj(x)
    bi.swap_in_candidates(model)
    kinds = {type(m).__name__ for _, m in model.named_modules()}
    assert "Linear" not in kinds and "RowwiseLinear" in kinds and "RowwiseEmbedding" in kinds
    assert any(k.startswith("PerQuery") for k in kinds)
    assert mx.array_equal(model.model.layers[0].mlp.gate_proj(x), before)
    assert isinstance(model.model.layers[0].mlp.gate_proj, nn.Linear)


def test_first_difference_names_the_layer_and_module_where_a_verify_parts_from_decode_steps():
    import mlx.core as mx
    import mlx.nn as nn

    from dflash_tui import random_pair as rp
    from dflash_tui.bench import batch_invariance as bi

    model = rp.build_model(rp.qwen3_config(384, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16,
                                           intermediate=128, tie=False), dtype=mx.float32)
    assert bi.first_difference(model, 384, 20)["layer"] is None

    class RoundsOtherwiseWhenBatched(nn.Linear):  # a multi-row product that is not row-wise
        def __call__(self, x):
            out = super().__call__(x)
            return out * (1 + 1e-6) if x.shape[1] > 1 else out

    model.model.layers[1].mlp.down_proj.__class__ = RoundsOtherwiseWhenBatched
    found = bi.first_difference(model, 384, 20)
    assert (found["layer"], found["module"]) == (1, "mlp") and found["equal_rows"] < bi.ROWS


def test_cycle_profile_times_every_forward_variant_on_attention_and_hybrid_targets(capsys):
    from dflash_tui.bench import cycle_profile

    assert cycle_profile.main(["--shape", "tiny", "tiny-hybrid", "--context", "40", "--block-size", "4", "--reps", "1",
                               "--rows", "2", "7", "--python-profile", "5"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for shape in ("tiny", "tiny-hybrid"):
        python = {r["variant"]: r for r in rows if r["shape"] == shape and r["variant"].startswith("python, ")}
        assert set(python) == {"python, mlx-lm verify 4", "python, engine verify 4", "python, engine verify 4 step rows"}
        for r in python.values():  # the model's own layers are where a build's Python time goes
            assert len(r["top"]) == 5 and r["build_python_ms"] >= sum(t["own_ms"] for t in r["top"]) > 0
            assert all(t["calls"] >= 1 for t in r["top"])
            assert any("mlx_lm/models/" in t["function"] for t in r["top"]), r["top"]
        rows = [r for r in rows if r not in python.values()]
        got = {r["variant"]: r for r in rows if r["shape"] == shape}
        assert set(got) == {"mlx-lm step", "engine step", "mlx-lm verify 4", "engine verify 4",
                            "engine verify 4 no flush", "engine verify 4 step rows",
                            "engine verify 4 step rows no flush", "draft 4", "mlx-lm forward 2",
                            "mlx-lm forward 7"}, got
        for r in got.values():
            assert "error" not in r, r
            assert 0 < r["build_ms"] <= r["total_ms"] and 0 <= r["encode_ms"] <= r["total_ms"]


def test_exactness_on_random_shape_pairs_equals_a_second_instance_on_cpu(capsys):
    from dflash_tui.bench import exactness

    assert exactness.main(["--shape", "tiny", "tiny-hybrid", "--random-prompts", "2", "--prompt-tokens", "20",
                           "--max-tokens", "20", "--block-size", "4", "auto"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert set(summary) == {"tiny", "tiny-hybrid"}
    for per_block in summary.values():
        assert set(per_block) == {"batched 4", "batched auto"}
        assert all(s["identical"] == s["prompts"] == 2 for s in per_block.values()), per_block


def test_verify_parts_times_every_part_of_each_layer_kind_at_one_row_and_a_verify(capsys, monkeypatch):
    from dflash_tui.bench import verify_parts
    from dflash_tui.engine import gdn_tape

    armed = []
    arm = gdn_tape.arm
    monkeypatch.setattr(gdn_tape, "arm", lambda cache, mode="auto": armed.append(mode) or arm(cache, mode))
    assert verify_parts.main(["--shape", "tiny-hybrid", "tiny-4bit", "--rows", "4", "--chain", "2", "--reps", "1",
                              "--verify", "batched", "steps"]) == 0
    rows = json.loads(capsys.readouterr().out)
    got = {(r["shape"], r["layer"], r["part"]) for r in rows}
    # every part is timed once per verify mode
    assert sorted(r["verify"] for r in rows) == sorted(["batched", "steps"] * len(got))
    mlp = {"mlp", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    attention = {"self_attn", "layer", *(f"self_attn.{p}_proj" for p in "qkvo")} | mlp
    gdn = {"linear_attn", "layer", *(f"linear_attn.{p}" for p in ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b",
                                                                  "out_proj"))} | mlp
    assert got == ({("tiny-hybrid", "attention", p) for p in attention} | {("tiny-hybrid", "linear", p) for p in gdn}
                   | {("tiny-4bit", "attention", p) for p in attention}
                   | {(s, "head", "head") for s in ("tiny-hybrid", "tiny-4bit")}), got
    for r in rows:
        assert "error" not in r, r
        assert r["ms_1"] > 0 and r["ms_4"] > 0 and r["ratio"] == r["ms_4"] / r["ms_1"]
    # a part's share of a forward: its time times the layers of its kind (tiny-hybrid: 6 linear, 2 attention)
    mixer = next(r for r in rows if r["shape"] == "tiny-hybrid" and r["part"] == "linear_attn")
    assert mixer["ms_4_x_layers"] == pytest.approx(mixer["ms_4"] * 6)
    # the verify rows of a Gated DeltaNet layer's mixer and whole layer ran armed, as a verify does
    assert armed and set(armed) == {"auto"}


def test_the_baseline_speed_runs_to_the_step_that_says_end_of_text(qwen3_pair, monkeypatch):
    """bench's mlx_lm.stream_generate side counts the step that produces EOS, as the engine counts the
    cycle that only says it: otherwise the comparison would favour DFlash, whose cycle costs more."""
    import time

    from conftest import reference_tokens
    from dflash_tui.bench.compare import run_baseline

    prompt = qwen3_pair.target.tokenizer.encode("a slow stop")
    ref = reference_tokens(qwen3_pair, prompt, 40)
    k = next(i for i in range(6, 40) if ref[i] not in ref[:i])
    stop = ref[k]
    model = qwen3_pair.target.model
    real_call = type(model).__call__

    def slow_when_stopping(self, inputs, *args, **kwargs):
        # mlx-lm builds the step after a token before it hands that token out: the step on EOS
        # delays EOS's own arrival, which is when the reply is known to be over
        if inputs.shape[-1] == 1 and int(inputs[0, -1].item()) == stop:
            time.sleep(0.5)
        return real_call(self, inputs, *args, **kwargs)

    monkeypatch.setattr(type(model), "__call__", slow_when_stopping)
    tok = qwen3_pair.target.tokenizer
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids = saved | {stop}
    try:
        figures = run_baseline(qwen3_pair, prompt, 40)
    finally:
        tok.eos_token_ids = saved
    assert figures.tokens == ref[:k]
    assert (k - 1) / figures.decode_tps >= 0.5  # the slow end is in the span


def test_host_cost_times_every_operation_kind(capsys):
    from dflash_tui.bench import host_cost

    assert host_cost.main(["--ops", "20", "--repeat", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["op"] for r in rows] == ["add", "reshape", "matmul, 1 row", "matmul, 16 rows", "rms_norm"]  # CPU: no kernels
    assert all(r["build_us"] > 0 and r["eval_us"] > 0 for r in rows), rows
    with pytest.raises(SystemExit):
        host_cost.main(["--ops", "0"])
