"""`dflash-tui chat` (and the bare command) takes mlx_lm.chat's decoding flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_tui import cli
from dflash_tui.commands import chat

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dflash_tui", *args], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def started(monkeypatch):
    """The app each command line builds, stopped before it takes the terminal."""
    apps = []
    monkeypatch.setattr(chat, "run_to_the_end", lambda app, **kw: apps.append(app) or 0)
    interval = sys.getswitchinterval()  # chat shortens it for the whole process
    yield apps
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("command", [["chat"], []], ids=["chat", "bare"])
def test_decoding_flags_reach_the_app(started, command, qwen3_dirs):
    argv = [*command, "--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]),
            "--temp", "0.7", "--top-p", "0.9", "--top-k", "20", "--min-p", "0.05", "--max-tokens", "64",
            "--seed", "3", "--block-size", "8", "--system-prompt", "Be brief."]
    assert cli.main(argv) == 0
    (app,) = started
    settings = app.generation_settings()
    assert (settings["temperature"], settings["top_p"], settings["top_k"], settings["min_p"]) == (0.7, 0.9, 20, 0.05)
    assert (settings["max_tokens"], settings["seed"], settings["block_size"]) == (64, 3, 8)
    assert app.system_prompt == "Be brief."
    # --system stays an alias, --temperature too; nothing given: config.toml's values
    started.clear()
    assert cli.main([*command, "--demo", "--system", "Terse.", "--temperature", "0.2"]) == 0
    assert started[0].system_prompt == "Terse." and started[0].options.temperature == 0.2
    assert started[0].options.min_p == 0.0 and started[0].options.block_size == "auto"
    # which settings the user chose (the demo pair drafts its own block only when the block size is not one)
    assert started[0].loaded_config.given == {"temperature"} and started[0].block_default == "auto"
    assert app.loaded_config.given >= {"temperature", "block_size", "seed"} and app.block_default is None


def test_the_flags_are_checked_like_config_values():
    for flags, needle in ((["--temp", "hot"], "--temp: expected a number"),
                          (["--min-p", "2"], "--min-p: must be"),
                          (["--block-size", "1"], "use /baseline"),
                          (["--max-tokens", "0"], "--max-tokens: must be between 1")):
        r = run_cli("--demo", *flags)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # a usage error, as argparse's
        assert needle in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_help_lists_the_flags():
    r = run_cli("chat", "--help")
    for flag in ("--temp", "--top-p", "--top-k", "--min-p", "--max-tokens", "--seed", "--system-prompt",
                 "--system", "--block-size"):
        assert flag in r.stdout
