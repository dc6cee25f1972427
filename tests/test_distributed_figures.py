"""What the meter and `doctor` say of a distributed engine: the ranks, the parallelism, the sync time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ring_port

from fixtures.harness import PanesApp
from dflash_tui.engine.events import Done
from dflash_tui.ui.meter import SystemMeter

REPO = Path(__file__).resolve().parent.parent
LAUNCH = Path(sys.executable).parent / "mlx.launch"

RANKED = {"mode": "dflash", "decode_tps": 40.0, "cycles": 7, "tokens_per_cycle": 3.0, "ranks": 2,
          "parallel": "tensor", "sync_ms": 2.0, "agreement_checks": 8}


@pytest.mark.anyio
async def test_the_meter_shows_ranks_parallelism_and_sync_per_cycle():
    async with PanesApp().run_test(size=(160, 48)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        meter.on_done(Done([1] * 21, "", "length", {"mode": "dflash", "decode_tps": 40.0}))
        await pilot.pause()
        assert "ranks" not in str(meter._body.render())  # one process: nothing about ranks
        meter.on_done(Done([1] * 21, "", "length", RANKED))
        await pilot.pause()
        assert "cpu · 2 ranks tensor parallel · sync 0.25 ms/cycle" in str(meter._body.render())  # 2.0 ms over 8 checks
        meter.reset_pair()
        await pilot.pause()
        assert "ranks" not in str(meter._body.render())
    async with PanesApp().run_test(size=(80, 24)) as pilot:
        meter = pilot.app.query_one(SystemMeter)
        meter.set_pair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "cpu")
        meter.on_done(Done([1] * 21, "", "length", RANKED))
        await pilot.pause()
        assert meter.size.width < 60 and "cpu · 2×tensor" in str(meter._body.render())


def test_generate_closing_line_shows_sync_per_cycle_as_the_meter_does():
    """`generate --distributed` and the meter say one thing: the turn's sync_ms over its agreement checks."""
    from dflash_tui.commands.generate import figures_line

    line = figures_line(Done([1] * 21, "", "length", {**RANKED, "generated_tokens": 21, "acceptance": 0.2}))
    assert line.endswith(" · hit max tokens · 2 ranks tensor parallel · sync 0.25 ms/cycle]"), line  # 2.0 ms over 8 checks
    audit = {**RANKED, "generated_tokens": 48, "acceptance": 0.2, "sync_ms": 37.5, "agreement_checks": 26}
    line = figures_line(Done([1] * 48, "", "length", audit))
    assert "sync 1.44 ms/cycle" in line and "37.5" not in line


@pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed")
def test_generate_distributed_closing_line_on_2_ranks_says_ms_per_cycle(qwen3_dirs):
    proc = subprocess.run([str(LAUNCH), "--backend", "ring", "-n", "2", "--starting-port", str(ring_port()), "--",
                           sys.executable, "-m", "dflash_tui", "generate", "hello", "--model", str(qwen3_dirs["target"]),
                           "--draft", str(qwen3_dirs["draft"]), "--max-tokens", "12", "--block-size", "4", "--distributed"],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    lines = [line for line in proc.stderr.splitlines() if "ranks tensor parallel" in line]
    assert len(lines) == 1, proc.stdout + proc.stderr  # rank 0 only
    assert re.search(r" · 2 ranks tensor parallel · sync \d+\.\d\d ms/cycle\]$", lines[0]), lines[0]


def _doctor_on_2_ranks(dirs, *extra: str) -> subprocess.CompletedProcess:
    port = ring_port()
    return subprocess.run([str(LAUNCH), "--backend", "ring", "-n", "2", "--starting-port", str(port), "--", sys.executable,
                           "-m", "dflash_tui", "doctor", "--model", str(dirs["target"]), "--draft", str(dirs["draft"]),
                           "--distributed", *extra],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed")
def test_doctor_distributed_reports_the_ranks_once_with_measured_sync(qwen3_dirs):
    proc = _doctor_on_2_ranks(qwen3_dirs)
    out = proc.stdout.splitlines()
    assert sum(line.startswith("target ") for line in out) == 1, proc.stdout + proc.stderr  # rank 0 only
    ranks = [i for i, line in enumerate(out) if line.startswith("ranks ")]
    assert len(ranks) == 1 and "2 (tensor parallel" in out[ranks[0]]
    sync = re.search(r"sync (\d+\.\d+) ms per cycle: the agreement check", out[ranks[0] + 1])
    assert sync and float(sync.group(1)) > 0
    layers = int(re.search(r"(\d+) layers", proc.stdout).group(1))
    assert f"a target forward makes about {2 * layers} network rounds (2 per layer)" in out[ranks[0] + 2]
    assert any(re.match(r"\s+ok\s+tensor parallel\s+mlx-lm's qwen3 model has shard\(\)", line) for line in out)
    # the memory figures are the whole pair's on one machine, and say so
    assert any(re.match(r"\s+ok\s+memory\s+.* needed at .*; under 2 ranks \(tensor parallel\) each holds a share "
                        r"of the target and a whole draft$", line) for line in out), proc.stdout
    assert "  (the whole pair on one machine; each of the 2 ranks holds a share)" in out
    assert "Node with rank" not in proc.stderr  # both ranks exited 0

    data = json.loads(_doctor_on_2_ranks(qwen3_dirs, "--json").stdout)
    d = data["distributed"]
    assert d["ranks"] == 2 and d["parallel"] == "tensor" and d["sync_ms"] > 0
    assert d["forward_comm_ms_estimate"] == pytest.approx(d["hidden_all_reduce_ms"] * d["rounds_per_forward"])


@pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed")
def test_doctor_distributed_pipeline_fails_a_model_mlx_lm_cannot_pipeline(qwen3_dirs):
    proc = _doctor_on_2_ranks(qwen3_dirs, "--pipeline")
    assert "ranks    2 (pipeline parallel" in proc.stdout
    assert re.search(r"FAIL\s+pipeline parallel\s+mlx-lm's qwen3 model has no pipeline\(\)", proc.stdout), proc.stdout
    assert "verdict: does not work: pipeline parallel" in proc.stdout


def test_a_pair_too_big_for_one_machine_is_not_failed_on_the_whole_pair_s_figure():
    from dflash_tui.engine.fit import Check
    from dflash_tui.engine.rank_diagnose import ranked_memory_check

    over = Check("memory", False, "30.0 GB needed at 4096 tokens, 24.0 GB available (free GPU memory)")
    got = ranked_memory_check(over, 30 * 10**9, 24 * 10**9, 2, "tensor")
    assert got.ok is None and got.name == "memory"
    assert "for the whole pair, more than this machine's" in got.detail and "not checked per rank" in got.detail
    fits = Check("memory", True, "3.0 GB needed at 4096 tokens, 24.0 GB available (free GPU memory)")
    got = ranked_memory_check(fits, 3 * 10**9, 24 * 10**9, 4, "pipeline")
    assert got.ok is True and got.detail.startswith(fits.detail) and "under 4 ranks (pipeline parallel)" in got.detail
