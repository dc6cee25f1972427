"""One rule for a setting everywhere: the decoding flags of chat, generate and bench take exactly what
/temp, /top-p… and config.toml take (config.VALIDATORS); a refused value is one line naming the flag and
its range, exit 2. And `generate --help`, `bench --help` say what each of those flags does and its default."""

from __future__ import annotations

import json
import re

import pytest

from conftest import demo_pair_bundled
from dflash_tui import cli
from dflash_tui.config import VALIDATORS, BadValue
from test_cli_generate import cli as run_cli

# flag -> (config.toml's key, the range its refusal names)
FLAGS = {
    "--temp": ("temperature", "at least 0.0 and at most 10.0"),
    "--max-tokens": ("max_tokens", "between 1 and 1000000"),
    "--top-p": ("top_p", "above 0.0 and at most 1.0"),
    "--top-k": ("top_k", "between 0 and 1000000"),
    "--min-p": ("min_p", "at least 0.0 and at most 1.0"),
    "--seed": ("seed", "between -1 and 2147483647"),
}
VALUES = {
    "--temp": ["50", "10", "10.5", "0", "-0.1", "nan", "inf", "hot"],
    "--max-tokens": ["99999999999999", "1000000", "1000001", "2", "0", "1.5"],
    "--top-p": ["0", "1", "1.01", "0.5", "-1"],
    "--top-k": ["-1", "0", "1000000", "1000001", "1.5"],
    "--min-p": ["2", "1", "0", "-0.1"],
    "--seed": ["-1", "-2", "0", "2147483647", "2147483648", "x"],
}
BENCH_FLAGS = ("--temp", "--max-tokens")  # bench has no --top-p, --top-k, --min-p or --seed
CASES = [(flag, value) for flag, values in VALUES.items() for value in values]
needs_demo = pytest.mark.skipif(not demo_pair_bundled(), reason="no demo pair bundled")


def slash_takes(flag: str, value: str) -> bool:
    """What `/temp VALUE` (ui/commands.py) and `temperature = VALUE` in config.toml do with it."""
    try:
        VALIDATORS[FLAGS[flag][0]](value)
    except BadValue:
        return False
    return True


def main(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.main(argv)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def assert_refused(code: int, lines: list[str], flag: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"dflash-tui: {flag}: "), lines
    assert FLAGS[flag][1] in lines[0], lines


@pytest.mark.parametrize("flag,value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_generate_and_bench_take_what_the_slash_commands_take(flag, value, tmp_path, capsys):
    missing = ["--model", str(tmp_path / "no-such-model")]  # a flag that passes reaches the model, then stops
    commands = [["generate", "hi"]] + ([["bench", "--runs", "1"]] if flag in BENCH_FLAGS else [])
    for command in commands:
        code, lines = main([*command, *missing, f"{flag}={value}"], capsys)
        if command[0] == "bench" and flag == "--max-tokens" and value == "1":
            continue  # bench's own floor, tested below
        if slash_takes(flag, value):
            assert code == 1 and len(lines) == 1 and "model not found" in lines[0], (command, lines)
        else:
            assert_refused(code, lines, flag)


@needs_demo
@pytest.mark.parametrize("flag,value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_chat_takes_what_the_slash_commands_take(flag, value, started, capsys):
    code, lines = main(["--demo", f"{flag}={value}"], capsys)
    if slash_takes(flag, value):
        assert code == 0 and not lines, lines
        key = FLAGS[flag][0]
        assert getattr(started[0].options, key) == VALIDATORS[key](value)
    else:
        assert_refused(code, lines, flag)
        assert not started  # refused before the app is built


def test_the_long_spellings_and_the_bench_floor(tmp_path, capsys):
    missing = ["--model", str(tmp_path / "no-such-model")]
    for command in (["generate", "hi"], ["bench"]):
        assert_refused(*main([*command, *missing, "--temperature", "50"], capsys), "--temp")
        code, lines = main([*command, *missing, "--temperature", "10"], capsys)
        assert code == 1 and "model not found" in lines[0], lines
    code, lines = main(["bench", *missing, "--max-tokens", "1"], capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dflash-tui: --max-tokens: bench needs 2 or more"), lines


@needs_demo
@pytest.mark.parametrize("flags,flag", [(["--temp", "50"], "--temp"), (["--max-tokens", "99999999999999"], "--max-tokens")])
def test_the_reported_command_lines_are_refused(flags, flag):
    r = run_cli("generate", "hi", "--demo", *flags)
    assert "Traceback" not in r.stderr, r.stderr
    assert_refused(r.returncode, [line for line in r.stderr.splitlines() if line.strip()], flag)
    assert r.stdout == ""


@needs_demo
def test_seed_minus_one_is_no_seed_as_in_config():
    r = run_cli("generate", "hi", "--demo", "--temp", "1", "--seed", "-1", "--max-tokens", "2", "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
    assert done["stats"]["seed"] != (1 << 64) - 1  # a fresh seed, not -1 taken as a fixed one


def help_entries(text: str) -> dict[str, str]:
    """`--flag ...` -> its help text, the wrapped lines joined."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        found = re.match(r"^  (-[^ ].*?)(?:  +(.*))?$", line)
        if found:
            current = found.group(1)
            entries[current] = found.group(2) or ""
        elif current and line.startswith("   "):
            entries[current] = (entries[current] + " " + line.strip()).strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("command,flags", [
    (["generate"], {"--max-tokens": "512", "--temp": "0.0", "--top-p": "1.0", "--top-k": "0", "--min-p": "0.0",
                    "--seed": "-1"}),
    (["bench"], {"--max-tokens": "256", "--temp": "0.0", "--runs": "3", "--cooldown": "1.0"}),
], ids=["generate", "bench"])
def test_help_gives_each_decoding_flag_a_description_and_its_default(command, flags, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as stopped:
        cli.main([*command, "--help"])
    assert stopped.value.code == 0
    entries = help_entries(capsys.readouterr().out)
    for flag, default in flags.items():
        (name,) = [n for n in entries if n.split(",")[0].split()[0] == flag]
        text = entries[name]
        assert f"(default: {default}" in text, (flag, text)
        assert len(text.split("(default:")[0].strip()) > 10, (flag, text)  # says what the flag does, too
