"""The engine's fault cases: prompts past the context, a stop during prefill, quitting with the engine
busy, corrupt or odd checkpoints, input that is not text. Each is one line, a non-zero exit, no hang."""

from __future__ import annotations

import io
import json
import re
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import demo_pair_bundled
from dflash_tui.cli import main
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Done, Error, Prefill
from dflash_tui.figure_rules import reply_summary

ROOT = Path(__file__).resolve().parents[1]


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dflash-tui: "), err
    return err[0]


def _pair_args(dirs, draft=None) -> list[str]:
    return ["--model", str(dirs["target"]), "--draft", str(draft or dirs["draft"])]


# -- prompts longer than the context ------------------------------------------------------------------
def test_a_prompt_past_the_context_is_refused_before_any_prefill(qwen3_pair, monkeypatch):
    monkeypatch.setattr(qwen3_pair.target.args, "max_position_embeddings", 64)
    conv = Conversation(qwen3_pair)
    events = list(conv.generate("word " * 200, GenerationSettings(max_tokens=4)))
    assert len(events) == 1 and isinstance(events[0], Error)
    n = len(conv.prompt_tokens([{"role": "user", "content": "word " * 200}]))
    assert events[0].message == f"the prompt is {n} tokens; the model's context is 64 tokens"
    assert conv.messages == [] and conv.state.tokens == []  # nothing recorded, nothing prefilled
    assert isinstance(list(conv.generate("hi", GenerationSettings(max_tokens=2)))[-1], Done)  # and it goes on


@pytest.mark.parametrize("baseline", [False, True])
def test_a_reply_ends_where_the_context_is_full(qwen3_pair, monkeypatch, baseline):
    conv = Conversation(qwen3_pair)
    n = len(conv.prompt_tokens([{"role": "user", "content": "word " * 20}]))
    monkeypatch.setattr(qwen3_pair.target.args, "max_position_embeddings", n + 5)
    done = list(conv.generate("word " * 20, GenerationSettings(max_tokens=40, block_size=4, baseline=baseline)))[-1]
    assert isinstance(done, Done)
    assert len(done.tokens) == 5 and done.finish_reason == "length"  # 40 without the cap: it went past the context
    assert done.stats["context_full"] is True
    assert reply_summary(done).endswith(" · context full")  # not "hit max tokens"
    short = list(Conversation(qwen3_pair).generate("hi", GenerationSettings(max_tokens=2, baseline=baseline)))[-1]
    assert "context_full" not in short.stats
    assert reply_summary(replace(short, finish_reason="length")).endswith("hit max tokens")
    assert len(conv.state.tokens) <= n + 5


@pytest.mark.skipif(not demo_pair_bundled(), reason="the demo pair is not in this checkout")
def test_generate_on_the_demo_pair_refuses_a_prompt_past_its_context_at_once(capsys):
    tic = time.perf_counter()
    assert main(["generate", "word " * 6000, "--demo", "--max-tokens", "4"]) == 1
    line = _one_line(capsys)
    assert "the model's context is 4096 tokens" in line and "the prompt is" in line
    assert time.perf_counter() - tic < 60  # not minutes of prefill first


def test_prefill_stops_between_chunks_and_the_caches_stay_consistent(qwen3_pair):
    settings = GenerationSettings(max_tokens=12, prefill_chunk=8)
    conv = Conversation(qwen3_pair)
    asked = []

    def stop_after_one_chunk() -> bool:
        asked.append(len(conv.state.tokens))
        return len(conv.state.tokens) >= 8

    text = "tell me a long story about the sea and the ships on it " * 3
    events = list(conv.generate(text, settings, stop_after_one_chunk))
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Done)
    assert events[-1].finish_reason == "cancelled" and events[-1].tokens == [] and len(events) == 2
    assert asked == [8] and len(conv.state.tokens) == 8  # one chunk in, then it stopped
    # the next turn from these caches gives what a fresh conversation gives
    conv.messages = []
    again = list(conv.generate(text, settings))[-1]
    fresh = list(Conversation(qwen3_pair).generate(text, settings))[-1]
    assert again.tokens == fresh.tokens and again.stats["cached_tokens"] == 8


def test_quitting_ends_the_process_with_the_engine_stuck(tmp_path):
    """ctrl+q while the engine thread is inside a call that does not return: the process still ends."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import threading, time
        from dflash_tui.ui import worker
        from dflash_tui.ui.app import DFlashApp
        from dflash_tui.commands.chat import run_to_the_end

        worker.STOP_TIMEOUT_S = 0.3
        busy = threading.Event()

        def stuck(self, request):  # a load or a prefill that will not stop
            busy.set()
            time.sleep(3600)

        worker.EngineWorker._handle = stuck

        async def quit_when_busy(pilot):
            while not busy.is_set():
                await pilot.pause(0.05)
            await pilot.press("ctrl+q")

        app = DFlashApp(model="org/some-model", probe_tokens=0)
        raise SystemExit(run_to_the_end(app, headless=True, auto_pilot=quit_when_busy))
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    tic = time.perf_counter()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60,
                       stdin=subprocess.DEVNULL, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "engine was still busy" in r.stderr
    assert time.perf_counter() - tic < 30


# -- corrupt weights and odd checkpoints ------------------------------------------------------------------
def test_a_truncated_draft_is_one_line(qwen3_dirs, tmp_path, capsys):
    bad = Path(shutil.copytree(qwen3_dirs["draft"], tmp_path / "draft"))
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    assert main(["generate", "x", *_pair_args(qwen3_dirs, bad), "--max-tokens", "2"]) == 1
    assert "model.safetensors cannot be read" in _one_line(capsys)


@pytest.mark.parametrize("change, needle", [
    ({"dflash_config": {"mask_token_id": 3, "target_layer_ids": []}}, "target_layer_ids is empty"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"hidden_size": -4}, "hidden_size"),
    ({"num_hidden_layers": 10**18}, "num_hidden_layers is 1000000000000000000, out of range (1 to 10000)"),
    ({"hidden_size": "64"}, 'hidden_size is "64" (a string), not a whole number'),
    ({"dflash_config": {"mask_token_id": 3, "target_layer_ids": "135", "block_size": 0}},
     'block_size is 0, out of range (1 to 65536); target_layer_ids is "135" (a string), not a list of layer numbers'),
    ({"dflash_config": "x"}, "dflash_config must be an object"),
], ids=["no-target-layers", "no-heads", "negative-size", "10**18-layers", "string-size", "zero-block-string-ids",
        "config-not-an-object"])
def test_odd_draft_configs_are_one_clear_error(qwen3_dirs, tmp_path, change, needle):
    from dflash_tui.engine.draft import DraftLoadError, load_draft

    bad = Path(shutil.copytree(qwen3_dirs["draft"], tmp_path / "draft"))
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(change)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftLoadError, match=re.escape(needle)):
        load_draft(str(bad))


def test_a_target_without_tokenizer_files_is_one_line(qwen3_dirs, tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(qwen3_dirs["target"] / name, target / name)
    assert main(["generate", "x", "--model", str(target), "--draft", str(qwen3_dirs["draft"])]) == 1
    assert "no usable tokenizer" in _one_line(capsys)


# -- input that is not text ----------------------------------------------------------------------------------
def test_stdin_that_is_not_utf8_is_one_line(qwen3_dirs, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff"), encoding="utf-8",
                                                       errors="surrogateescape"))
    assert main(["generate", "-", *_pair_args(qwen3_dirs)]) == 1
    assert "standard input is not UTF-8" in _one_line(capsys)


def test_a_prompt_argument_that_is_not_utf8_is_one_line(qwen3_dirs, capsys):
    prompt = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands over such argv bytes
    assert main(["generate", prompt, *_pair_args(qwen3_dirs)]) == 1
    assert "the prompt is not valid UTF-8" in _one_line(capsys)


def test_a_prompt_past_every_length_limit_is_still_one_line_from_the_process():
    """40,000 words pass the tokenizer library's own length limit too: its warning must not come
    before the engine's line (a real process: the library's logging writes to the real stderr)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}
    r = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "-", "--demo", "--max-tokens", "4"],
                       input="word " * 40000, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "the model's context is 4096" in r.stderr, r.stderr
