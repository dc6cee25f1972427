"""train-draft's refusals: a bad flag value, --out or --prompts is one line, before any model loads."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from dflash_tui.cli import build_parser, main
from dflash_tui.errors import UserError

REACHED = "the model load was reached"


@pytest.fixture
def no_model(monkeypatch):
    """Loading the target answers one known line instead: a refusal must come before it."""
    import dflash_tui.engine.loading as loading

    def load_target(*args, **kwargs):
        raise UserError(REACHED)

    monkeypatch.setattr(loading, "load_target", load_target)


def _prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"add {i} and {i + 1}"}) + "\n" for i in range(4)))
    return path


def _argv(tmp_path: Path, *extra: str, out: Path = None, prompts: Path = None) -> list[str]:
    prompts = prompts or _prompts(tmp_path / "p.jsonl")
    return ["train-draft", "--target", str(tmp_path / "no-target"), "--prompts", str(prompts),
            "--out", str(out or tmp_path / "out"), *extra]


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dflash-tui: "), err
    assert captured.out == ""
    return err[0]


# -- numeric flags -------------------------------------------------------------------------------------
BAD_VALUES = [
    ("--steps", "0"), ("--steps", "-1"),
    ("--epochs", "0"), ("--epochs", "-1"), ("--epochs", "nan"), ("--epochs", "inf"),
    ("--seconds", "-5"), ("--seconds", "0"), ("--seconds", "nan"), ("--seconds", "inf"),
    ("--lr", "nan"), ("--lr", "0"), ("--lr", "-0.001"), ("--lr", "inf"),
    ("--gamma", "-1"), ("--gamma", "0"), ("--gamma", "nan"),
    ("--layers", "0"), ("--block-size", "1"), ("--block-size", "257"), ("--batch-size", "0"),
    ("--anchors", "0"), ("--seq-len", "0"), ("--max-new-tokens", "0"), ("--mask-token-id", "-1"),
    ("--checkpoint-every", "-5"), ("--eval-prompts", "-1"), ("--eval-max-tokens", "0"),
    ("--seed", "-1"), ("--seed", str(2**31)),
    ("--target-layers", "-1"), ("--target-layers", "1 1"),
]


@pytest.mark.parametrize("flag,value", BAD_VALUES, ids=[f"{f}={v}" for f, v in BAD_VALUES])
def test_a_bad_flag_value_is_a_usage_error_before_anything_loads(tmp_path, capsys, no_model, flag, value):
    rc = main(_argv(tmp_path, flag, *value.split()))
    line = _one_line(capsys)
    assert rc == 2 and flag in line and REACHED not in line
    assert not (tmp_path / "out").exists()


def test_values_at_the_edges_of_their_ranges_pass(tmp_path):
    from dflash_tui.commands.train_draft import check_flags

    args = build_parser().parse_args(_argv(
        tmp_path, "--steps", "1", "--seconds", "0.5", "--lr", "1e-9", "--gamma", "0.1", "--layers", "1",
        "--block-size", "2", "--batch-size", "1", "--anchors", "1", "--seq-len", "1", "--max-new-tokens", "1",
        "--mask-token-id", "0", "--checkpoint-every", "0", "--eval-prompts", "0", "--eval-max-tokens", "1",
        "--seed", str(2**31 - 1), "--target-layers", "0", "2"))
    check_flags(args)
    args = build_parser().parse_args(_argv(tmp_path, "--epochs", "0.01", "--block-size", "256"))
    check_flags(args)


def test_the_summary_line_is_valid_json_when_the_loss_is_no_number(tmp_path, capsys, tiny_target):
    # a real run on the tiny target whose learning rate makes the loss overflow: NaN is not JSON
    argv = ["train-draft", "--target", str(tiny_target), "--prompts", str(_prompts(tmp_path / "p.jsonl")),
            "--out", str(tmp_path / "out"), "--steps", "2", "--lr", "1e30", "--max-new-tokens", "16",
            "--eval-prompts", "1"]
    assert main(argv) == 0

    def no_constants(name):
        raise AssertionError(f"{name} is not JSON")

    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(line, parse_constant=no_constants)
    assert summary["steps"] == 2 and summary["final_loss"] is None
    metrics = json.loads((tmp_path / "out" / "trainer_state" / "metrics.json").read_text(), parse_constant=no_constants)
    assert metrics


def test_out_that_holds_a_run_needs_resume_or_force(tmp_path, capsys, no_model):
    out = tmp_path / "run"
    (out / "trainer_state").mkdir(parents=True)
    (out / "trainer_state" / "sequences.npz").write_bytes(b"saved")
    assert main(_argv(tmp_path, "--steps", "1", out=out)) == 1
    line = _one_line(capsys)
    assert "training run" in line and "--resume" in line and "--force" in line
    assert main(_argv(tmp_path, "--steps", "1", "--force", out=out)) == 1
    assert REACHED in _one_line(capsys)


@pytest.mark.parametrize("inside", [[], [".DS_Store"], ["trainer_state/"], [".checkpoint-killed/"]])
def test_an_empty_out_or_one_a_killed_run_left_empty_is_taken(tmp_path, capsys, no_model, inside):
    out = tmp_path / "out"
    out.mkdir()
    for name in inside:
        (out / name).mkdir() if name.endswith("/") else (out / name).write_text("")
    assert main(_argv(tmp_path, "--steps", "1", out=out)) == 1
    assert REACHED in _one_line(capsys)


def test_a_read_only_out_is_one_line_before_the_work(tmp_path, capsys, no_model, monkeypatch):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(path).startswith(str(read_only)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert main(_argv(tmp_path, "--steps", "1", out=read_only / "draft")) == 1
    line = _one_line(capsys)
    assert "Read-only file system" in line and "--out" in line


def test_resume_to_no_more_steps_than_were_done_is_refused(tmp_path, capsys, no_model):
    out = tmp_path / "run"
    (out / "trainer_state").mkdir(parents=True)
    (out / "trainer_state" / "sequences.npz").write_bytes(b"saved")
    (out / "trainer_state" / "state.json").write_text(json.dumps({"step": 40, "total": 40}))
    assert main(_argv(tmp_path, "--steps", "40", "--resume", out=out)) == 2
    line = _one_line(capsys)
    assert "--steps" in line and "40 steps already" in line
    assert main(_argv(tmp_path, "--steps", "41", "--resume", out=out)) == 1
    assert REACHED in _one_line(capsys)


# -- --prompts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["device", "fifo", "folder"])
def test_prompts_that_are_no_regular_file_are_one_line(tmp_path, capsys, no_model, kind):
    if kind == "device":
        prompts = Path("/dev/zero")
    elif kind == "fifo":
        prompts = tmp_path / "p.jsonl"
        os.mkfifo(prompts)
    else:
        prompts = tmp_path / "folder.jsonl"
        prompts.mkdir()
    assert main(_argv(tmp_path, "--steps", "1", prompts=prompts)) == 1
    line = _one_line(capsys)
    assert str(prompts) in line and "not a regular file" in line
    assert not (tmp_path / "out").exists()


def test_prompts_past_the_size_limit_are_one_line(tmp_path, capsys, no_model, monkeypatch):
    import dflash_tui.training.prompts as prompts_module

    monkeypatch.setattr(prompts_module, "MAX_PROMPTS_BYTES", 16)
    assert main(_argv(tmp_path, "--steps", "1")) == 1
    assert "too big" in _one_line(capsys)


# -- with the target loaded: what only it can tell -------------------------------------------------------
def test_a_mask_token_past_the_vocabulary_is_refused_before_the_replies(tiny_target, tmp_path, capsys, monkeypatch):
    import dflash_tui.training.trainer as trainer

    def build_sequences(*args, **kwargs):
        raise AssertionError("the replies were regenerated")

    monkeypatch.setattr(trainer, "build_sequences", build_sequences)
    argv = _argv(tmp_path, "--steps", "1", "--mask-token-id", "1000000", "--layers", "1", "--block-size", "4")
    argv[2] = str(tiny_target)
    assert main(argv) == 2
    assert "--mask-token-id" in _one_line(capsys)


def test_a_full_disk_mid_run_is_one_line_not_a_traceback(tmp_path, tiny_target):
    # a real run whose files may not grow past 20 kB (the draft's checkpoint is larger): as a full disk
    import resource
    import subprocess
    import sys

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    argv = ["train-draft", "--target", str(tiny_target), "--prompts", str(_prompts(tmp_path / "p.jsonl")),
            "--out", str(tmp_path / "out"), "--steps", "2", "--max-new-tokens", "16", "--eval-prompts", "1"]
    r = subprocess.run([sys.executable, "-m", "dflash_tui", *argv], capture_output=True, text=True, timeout=300,
                       preexec_fn=small_files, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"dflash-tui: could not save to --out {tmp_path / 'out'}: "
                                                        "could not write draft.safetensors")
