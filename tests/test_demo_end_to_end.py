"""`--demo` end to end: the bundled pair through `generate`, `bench` and the chat app, with real acceptance."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ui_support import install_placeholders

install_placeholders()

from conftest import demo_pair_bundled  # noqa: E402

PROMPT = "Wait until a predicate becomes true."  # a held-out request
HELDOUT = Path(__file__).resolve().parents[1] / "dflash_tui" / "demo" / "heldout_prompts.jsonl"




pytestmark = pytest.mark.skipif(not demo_pair_bundled(), reason="no demo pair bundled")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash_tui", *args], capture_output=True, text=True, timeout=600)


def test_generate_demo_streams_blocks_with_real_acceptance():
    out = _cli("generate", PROMPT, "--demo", "--json", "--max-tokens", "64", "--block-size", "16")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    blocks = [e for e in events if e["type"] == "block"]
    done = events[-1]
    assert events[0]["type"] == "prefill" and done["type"] == "done"
    assert blocks and sum(b["accepted"] for b in blocks) > 0, "a trained draft must get tokens accepted"
    assert sum(len(b["emitted"]) - b["eos"] for b in blocks) == len(done["tokens"])
    assert done["text"].lstrip().startswith(("def ", "async def ", "@")), done["text"]


def test_generate_demo_baseline_gives_the_same_text():
    dflash = _cli("generate", PROMPT, "--demo", "--max-tokens", "48")
    base = _cli("generate", PROMPT, "--demo", "--max-tokens", "48", "--baseline")
    assert dflash.returncode == 0 and base.returncode == 0, dflash.stderr + base.stderr
    assert dflash.stdout.strip() and dflash.stdout == base.stdout


def test_bench_demo_reports_identical_outputs_and_acceptance(tmp_path):
    report_file = tmp_path / "report.json"
    out = _cli("bench", "--demo", "--prompt", PROMPT, "--runs", "1", "--cooldown", "0", "--max-tokens", "48",
               "--block-size", "16", "--json", "--out", str(report_file))
    assert out.returncode == 0, out.stderr
    report = json.loads(report_file.read_text())
    (row,) = report["results"]
    assert row["identical"] is True
    assert row["dflash"]["tokens_per_cycle"] > 1.0
    assert report["target"].endswith("target") and report["draft"].endswith("draft")


def test_bench_demo_pools_tokens_per_cycle_over_the_prompts(tmp_path):
    """Three held-out requests whose replies run different numbers of cycles: the summary's tokens/cycle
    is their cycle tokens over their cycles (README's τ, as the sessions list pools it), not the rows' mean."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(open(HELDOUT).readlines()[:3]))
    report_file = tmp_path / "report.json"
    out = _cli("bench", "--demo", "--prompts", str(prompts), "--runs", "1", "--cooldown", "0", "--max-tokens", "48",
               "--block-size", "16", "--out", str(report_file))
    assert out.returncode == 0, out.stderr
    report = json.loads(report_file.read_text())
    rows = [r["dflash"] for r in report["results"]]
    for d in rows:  # the counts carried are the engine's: its ratios come back from them
        assert d["tokens_per_cycle"] == pytest.approx(d["cycle_tokens"] / d["cycles"])
        assert d["acceptance"] == pytest.approx(d["accepted"] / d["drafted"])
    s = report["summary"]
    cycles, tokens = sum(d["cycles"] for d in rows), sum(d["cycle_tokens"] for d in rows)
    assert (s["cycles"], s["cycle_tokens"]) == (cycles, tokens) and s["tokens_per_cycle"] == tokens / cycles
    assert s["acceptance"] == sum(d["accepted"] for d in rows) / sum(d["drafted"] for d in rows)
    assert len({d["cycles"] for d in rows}) > 1  # so pooling and the rows' mean part
    assert s["tokens_per_cycle"] != pytest.approx(sum(d["tokens_per_cycle"] for d in rows) / len(rows))
    table, summary = out.stdout.rsplit("\n\n", 1)
    assert f"all prompts pooled: {tokens / cycles:.2f} tokens/cycle ({tokens} tokens over {cycles} cycles)" in summary
    assert "(median of per-prompt speedups)" in summary and "mean" not in summary
    header = table.splitlines()[-1 - len(rows)]
    assert "peak MiB" in header and "MB" not in header


@pytest.mark.anyio
async def test_chat_app_on_the_demo_pair_shows_the_reply_and_its_blocks():
    from dflash_tui.demo import demo_draft_path, demo_target_path
    from dflash_tui.ui.app import DFlashApp
    from dflash_tui.ui.chat_view import AssistantMessage

    app = DFlashApp(model=str(demo_target_path()), draft=str(demo_draft_path()), probe_tokens=0)
    app.options.max_tokens = 64

    async def until(cond, what: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            await pilot.pause(0.05)

    async with app.run_test(size=(120, 36)) as pilot:
        await until(lambda: app.model_state in ("ready", "failed"), "the demo pair to load")
        assert app.model_state == "ready"
        app.prompt.value = PROMPT
        app.prompt.focus()
        await pilot.press("enter")
        # a short reply on a fast machine can be over before the first look: its message shows it started
        await until(lambda: app.generating or app.chat.query(AssistantMessage), "the reply to start", 10.0)
        await until(lambda: not app.generating, "the reply to finish")
        await pilot.pause(0.2)
        (reply,) = app.chat.query(AssistantMessage)
        assert reply.raw_text.lstrip().startswith(("def ", "async def ", "@"))
        rows = app.acceptance.rows.rows
        assert rows and sum(r.accepted for r in rows) > 0
        assert app.acceptance.stats.tokens_per_cycle > 1.0
