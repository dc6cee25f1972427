"""train-draft as a careless user would run it: nothing a user owns is lost, every mistake is one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from dflash_tui.cli import main
from dflash_tui.engine.checkpoint import STAGING_PREFIX, save_sharded, staged_checkpoint


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _prompts(path: Path, n: int = 6) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"add {i} and {i + 1}"}) + "\n" for i in range(n)))
    return path


def _train(target: Path, prompts: Path, out: Path, *extra: str) -> int:
    return main(["train-draft", "--target", str(target), "--prompts", str(prompts), "--out", str(out),
                 "--layers", "1", "--block-size", "4", "--batch-size", "2", "--anchors", "2", "--seq-len", "64",
                 "--max-new-tokens", "8", "--eval-prompts", "0", "--checkpoint-every", "0", "--no-compile",
                 "--steps", "2", *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dflash-tui: "), err
    return err[0]


def _fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "someone elses"}')
    (folder / "model.safetensors").write_bytes(b"weights that took a week")
    (folder / "README.md").write_text("my notes")
    return folder


# -- --out -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("force", [False, True])
def test_out_equal_to_the_target_is_refused_and_the_target_left_whole(tiny_target, tmp_path, capsys, force):
    target = Path(shutil.copytree(tiny_target, tmp_path / "target"))
    before = _digests(target)
    rc = _train(target, _prompts(tmp_path / "p.jsonl"), target, *(["--force"] if force else []))
    assert rc == 1 and "target's own folder" in _one_line(capsys)
    assert _digests(target) == before


def test_out_that_holds_a_model_is_refused_without_force(tiny_target, tmp_path, capsys):
    out = _fake_model(tmp_path / "draft")
    before = _digests(out)
    assert _train(tiny_target, _prompts(tmp_path / "p.jsonl"), out) == 1
    line = _one_line(capsys)
    assert "already holds a model" in line and "--force" in line
    assert _digests(out) == before


def test_force_replaces_only_the_checkpoint_files(tiny_target, tmp_path, capsys):
    from dflash_tui.engine.draft import load_draft

    out = _fake_model(tmp_path / "draft")
    assert _train(tiny_target, _prompts(tmp_path / "p.jsonl"), out, "--force") == 0
    assert (out / "README.md").read_text() == "my notes"  # never written by the run: never touched
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    load_draft(str(out))  # a whole checkpoint, loadable
    assert not list(out.glob(STAGING_PREFIX + "*"))


def test_out_that_is_a_file_is_one_line(tiny_target, tmp_path, capsys):
    out = tmp_path / "afile"
    out.write_text("mine")
    assert _train(tiny_target, _prompts(tmp_path / "p.jsonl"), out) == 1
    assert "is a file, not a folder" in _one_line(capsys)
    assert out.read_text() == "mine"


@pytest.mark.parametrize("exists", [False, True])
def test_resume_with_nothing_to_resume_creates_nothing(tiny_target, tmp_path, capsys, exists):
    out = tmp_path / "run"
    if exists:
        out.mkdir()
    assert _train(tiny_target, _prompts(tmp_path / "p.jsonl"), out, "--resume") == 1
    assert "nothing to resume" in _one_line(capsys)
    assert (list(out.iterdir()) == []) if exists else not out.exists()


# -- the checkpoint is written aside and moved into place ----------------------------------------------
def _weights(n: int) -> dict[str, mx.array]:
    return {f"w{i}": mx.full((64,), float(i)) for i in range(n)}


def test_a_failed_save_leaves_the_old_checkpoint_as_it_was(tmp_path):
    out = tmp_path / "draft"
    with staged_checkpoint(out) as stage:
        save_sharded(_weights(4), stage, shard_bytes=300)  # 2 shards + index
        (stage / "config.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    before = _digests(out)
    with pytest.raises(OSError):
        with staged_checkpoint(out) as stage:
            save_sharded(_weights(1), stage)
            raise OSError("disk full")
    assert _digests(out) == before
    assert not list(out.glob(STAGING_PREFIX + "*"))


def test_a_new_checkpoint_replaces_the_old_ones_files_and_nothing_else(tmp_path):
    out = tmp_path / "draft"
    with staged_checkpoint(out) as stage:
        save_sharded(_weights(4), stage, shard_bytes=300)
        (stage / "config.json").write_text('{"v": 1}')
    assert len(list(out.glob("model-0000?-of-00004.safetensors"))) == 4 and (out / "model.safetensors.index.json").exists()
    (out / "model-notes.txt").write_text("mine")
    (out / (STAGING_PREFIX + "killed")).mkdir()  # what a run killed mid-save leaves
    with staged_checkpoint(out) as stage:
        save_sharded(_weights(1), stage)
        (stage / "config.json").write_text('{"v": 2}')
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model-notes.txt", "model.safetensors"]
    assert json.loads((out / "config.json").read_text()) == {"v": 2}
    assert mx.array_equal(mx.load(str(out / "model.safetensors"))["w0"], _weights(1)["w0"]).item()


# -- the prompts file ----------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    b'{"prompt": "caf\xe9"}\n',  # Latin-1
    b"[" * 100_000 + b"]" * 100_000 + b"\n",  # nested past the parser's depth
    b'{"prompt": ' + b"1" * 5000 + b"}\n",  # an integer past Python's digit limit
    b'[1, 2]\n',
    b'"just text"\n',
    b'{"prompt": {"text": "hi"}}\n',
    b'{"messages": 5}\n',
    b'{"messages": [{"role": "user", "content": [1]}]}\n',
], ids=["latin1", "nested", "digits", "list", "string", "prompt-object", "messages-int", "content-list"])
def test_a_bad_prompts_file_is_one_line(tiny_target, tmp_path, capsys, content):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    assert _train(tiny_target, bad, tmp_path / "out") == 1
    assert "bad.jsonl" in _one_line(capsys)
    assert not (tmp_path / "out").exists()
