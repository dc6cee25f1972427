"""`dflash-tui bench`'s input: --out, --cooldown, --prompt and --prompts refused in one line before a model
loads (a missing model stands in for the pair: were it loaded, the error would name it), and a report
that cannot be saved is still printed, with no part of a file left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_generate import assert_one_line_error, pair_args

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--runs", "1", "--max-tokens", "4", "--cooldown", "0"]


def bench(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "dflash_tui", "bench", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, **kwargs)


def no_model(tmp_path: Path) -> list[str]:
    """A target that is not there: a refusal that names something else came before any loading."""
    return ["--model", str(tmp_path / "no-model"), "--draft", str(tmp_path / "no-draft")]


def refused(r: subprocess.CompletedProcess, *needles: str, code: int = 1) -> None:
    assert_one_line_error(r, *needles)
    assert r.stderr.startswith("dflash-tui: ") and "model not found" not in r.stderr, r.stderr
    assert r.returncode == code and r.stdout == ""


def test_out_naming_the_prompts_file_is_refused_and_the_prompts_kept(tmp_path):
    prompts = tmp_path / "myprompts.txt"
    prompts.write_text("my own prompt\n")
    refused(bench(*no_model(tmp_path), *SHORT, "--prompts", str(prompts), "--out", str(prompts)),
            "already exists", str(prompts))
    assert prompts.read_text() == "my own prompt\n"


def test_out_where_no_new_file_can_go_is_refused_before_the_run(tmp_path):
    refused(bench(*no_model(tmp_path), *SHORT, "--out", str(tmp_path / "missing" / "r.json")),
            "no such folder", str(tmp_path / "missing"))
    refused(bench(*no_model(tmp_path), *SHORT, "--out", str(tmp_path)), "is a folder")
    (tmp_path / "file").write_text("x")
    refused(bench(*no_model(tmp_path), *SHORT, "--out", str(tmp_path / "file" / "r.json")), "not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_report_that_cannot_be_written_is_printed_and_leaves_no_file(qwen3_dirs, tmp_path):
    """The disk fills as the report is written (a file size limit of 256 bytes, the report is longer):
    the report is on stdout, the error is one line, and neither report.json nor a temp file is left."""
    resource = pytest.importorskip("resource")
    out_dir = tmp_path / "reports"
    out_dir.mkdir()

    def small_files() -> None:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    r = bench(*pair_args(qwen3_dirs), *SHORT, "--json", "--out", str(out_dir / "report.json"), timeout=300,
              preexec_fn=small_files)
    assert_one_line_error(r, "cannot write", "report.json", "standard output")
    assert json.loads(r.stdout)["results"][0]["identical"] is True
    assert list(out_dir.iterdir()) == []


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "1e309", "3601", "soon"])
def test_cooldown_must_be_a_finite_number_of_seconds(tmp_path, value):
    refused(bench(*no_model(tmp_path), f"--cooldown={value}"), "--cooldown", "from 0 to 3600", code=2)


@pytest.mark.parametrize("prompt", ["", "  \t "])
def test_an_empty_prompt_is_refused(tmp_path, prompt):
    refused(bench(*no_model(tmp_path), *SHORT, "--prompt", prompt), "the prompt is empty")


def test_a_prompts_file_that_is_not_utf8_text_is_one_line(tmp_path):
    prompts = tmp_path / "latin1.txt"
    prompts.write_bytes("first\ncaf\u00e9\n".encode("latin-1"))
    refused(bench(*no_model(tmp_path), *SHORT, "--prompts", str(prompts)), "not UTF-8 text (byte 9)")


def test_a_prompts_file_that_is_no_regular_file_or_too_big_is_not_read(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:  # sparse: nothing is written
        fh.truncate(64 << 20)
    refused(bench(*no_model(tmp_path), *SHORT, "--prompts", str(big)), "cannot read prompts file", "too big")
    refused(bench(*no_model(tmp_path), *SHORT, "--prompts", os.devnull), "not a regular file")
    if hasattr(os, "mkfifo"):  # opening it would wait for a writer forever
        os.mkfifo(tmp_path / "fifo")
        refused(bench(*no_model(tmp_path), *SHORT, "--prompts", str(tmp_path / "fifo"), timeout=30),
                "not a regular file (a fifo)")


@pytest.mark.parametrize("row", ['{"prompt": 5}', '{"prompt": null}', '{"prompt": ["a"]}', '{"text": "a"}', "{bad"])
def test_a_jsonl_row_without_a_text_prompt_names_its_line(tmp_path, row):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(f'{{"prompt": "fine"}}\n\n{row}\n')
    refused(bench(*no_model(tmp_path), *SHORT, "--prompts", str(prompts)), f"{prompts}:3:", '"prompt" (text)')


def test_a_jsonl_row_with_an_empty_prompt_names_its_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": " "}\n')
    refused(bench(*no_model(tmp_path), *SHORT, "--prompts", str(prompts)), f"{prompts}:1:", "the prompt is empty")
