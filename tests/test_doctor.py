"""`dflash-tui doctor` on tiny real-format pairs: the checks, the memory figures (against what the real
loaders allocate), misfits, a hybrid target, hub ids in and out of the local cache, hostile names."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from conftest import _build_pair
from dflash_tui.cli import main

FIT = ["hidden size", "vocab size", "target layers", "layer ids", "mask token"]


def doctor(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["doctor", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def doctor_json(capsys, *args: str) -> tuple[int, dict]:
    rc, out, _ = doctor(capsys, *args, "--json")
    return rc, json.loads(out)


def pair_args(dirs) -> list[str]:
    return ["--model", str(dirs["target"]), "--draft", str(dirs["draft"])]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """doctor never downloads: any connection attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("doctor opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test's own."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def cache_repo(cache, repo: str, source) -> None:
    """Put a model directory into the cache layout huggingface_hub writes."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("0" * 40)
    shutil.copytree(source, root / "snapshots" / ("0" * 40))


def allocated(model, tokens: int) -> int:
    """Bytes of the cache mlx-lm allocates for a prefill of `tokens` (a multiple of its 256-token step)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((1, tokens), dtype=mx.int32), cache=cache))
    arrays = [a for c in cache for a in (getattr(c, "cache", None) or [c.keys, c.values])]  # ArraysCache or KVCache
    return sum(a.nbytes for a in arrays if a is not None)


def parameter_bytes(module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def test_a_fitting_pair_passes_every_check_with_the_memory_the_loaders_allocate(qwen3_dirs, capsys):
    import mlx_lm

    from dflash_tui.engine.draft import load_draft

    rc, out, err = doctor(capsys, *pair_args(qwen3_dirs), "--tokens", "512")
    assert rc == 0, out + err
    for name in ["target", "architecture", "draft", "draft config", *FIT, "memory"]:
        assert any(line.split()[:1] == ["ok"] and f"  {name}  " in line for line in out.splitlines()), name
    assert "hybrid: no" in out and "why: given with --draft" in out and out.rstrip().endswith("everything fits")

    rc, report = doctor_json(capsys, *pair_args(qwen3_dirs), "--tokens", "512")
    m = report["memory"]
    model, _ = mlx_lm.load(str(qwen3_dirs["target"]))
    draft = load_draft(str(qwen3_dirs["draft"]))  # in bfloat16, as load_pair loads it
    assert m["target_weights"] == parameter_bytes(model)
    assert m["draft_weights"] == parameter_bytes(draft)
    assert m["target_cache"] == allocated(model, 512)
    cfg = draft.config
    assert m["draft_cache"] == cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2 * 512
    assert m["total"] == m["target_weights"] + m["target_cache"] + m["draft_weights"] + m["draft_cache"]
    assert report["ok"] and report["hybrid"] is False and report["backend"]["backend"] == "CPU"


def test_a_draft_that_does_not_fit_fails_naming_each_check(tmp_path, qwen3_dirs, capsys):
    from dflash_tui import random_pair as rp

    cfg = json.loads((qwen3_dirs["target"] / "config.json").read_text())
    other = dict(cfg, hidden_size=96, vocab_size=500)
    rp.build_draft(tmp_path / "bad", rp.draft_config_for(other, mask_token_id=450, layers=1, target_layer_ids=[0, 7]))
    rc, out, _ = doctor(capsys, "--model", str(qwen3_dirs["target"]), "--draft", str(tmp_path / "bad"))
    assert rc == 1
    marks = {name: next(line.split()[0] for line in out.splitlines() if f"  {name}  " in line) for name in FIT}
    assert marks == {"hidden size": "FAIL", "vocab size": "FAIL", "target layers": "ok", "layer ids": "FAIL",
                     "mask token": "FAIL"}, out
    assert "target_layer_ids [7] out of range for 4 layers" in out
    assert out.rstrip().endswith("does not work: hidden size, vocab size, layer ids, mask token")


def test_a_target_with_no_known_draft_fails_the_draft_check(qwen3_dirs, capsys):
    rc, out, _ = doctor(capsys, "--model", str(qwen3_dirs["target"]))
    assert rc == 1
    assert "FAIL  draft" in out and "none known for target" in out and "run the target alone" in out


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    return _build_pair(tmp_path_factory.mktemp("qwen3_5"), "qwen3_5", seed=0, linear_head_dim=32)


def test_a_hybrid_target_counts_its_linear_state(hybrid_dirs, capsys):
    import mlx_lm

    rc, report = doctor_json(capsys, *pair_args(hybrid_dirs), "--tokens", "256")
    assert rc == 0, report["checks"]
    facts, m = report["target_facts"], report["memory"]
    assert report["hybrid"] is True and facts["kinds"] == {"linear": 6, "attention": 2}
    model, _ = mlx_lm.load(str(hybrid_dirs["target"]))
    # two attention layers' KV plus six Gated DeltaNet states, as mlx-lm allocates them
    assert m["target_cache"] == allocated(model, 256)
    assert m["target_weights"] == parameter_bytes(model)
    # state copies: HybridTarget's 4 snapshots, and the per-step states of a 16-token verify on the CPU
    assert m["hybrid_extra"] == 4 * facts["fixed_state_bytes"] + 16 * facts["recurrent_bytes"] * 6
    _, out, _ = doctor(capsys, *pair_args(hybrid_dirs))
    assert "hybrid: yes" in out and "6 linear, 2 attention" in out


def test_a_hub_id_not_in_the_cache_would_be_downloaded(hub_cache, capsys):
    rc, out, _ = doctor(capsys, "--model", "mlx-community/Qwen3-8B-4bit")
    assert rc == 3  # nothing failed, but nothing could be read either
    assert "draft    z-lab/Qwen3-8B-DFlash-b16" in out and "the published draft for Qwen/Qwen3-8B" in out
    assert out.count("would be downloaded on first run") == 2 and "?     fit" in out
    assert not any(hub_cache.iterdir())  # nothing was fetched


def test_a_cached_hub_pair_is_read_from_the_cache(hub_cache, qwen3_dirs, capsys):
    cache_repo(hub_cache, "someone/Qwen3-8B-4bit", qwen3_dirs["target"])
    cache_repo(hub_cache, "z-lab/Qwen3-8B-DFlash-b16", qwen3_dirs["draft"])  # the registry's pick, a stand-in
    rc, report = doctor_json(capsys, "--model", "someone/Qwen3-8B-4bit")
    assert rc == 0, report["checks"]
    assert report["draft"] == "z-lab/Qwen3-8B-DFlash-b16"
    assert report["target_location"]["where"] == report["draft_location"]["where"] == "hub cache"


def test_hostile_names_are_neutralised(tmp_path, qwen3_dirs, capsys):
    evil = tmp_path / "t\x1b]0;owned\x07\u202e"
    shutil.copytree(qwen3_dirs["target"], evil)
    rc, out, _ = doctor(capsys, "--model", str(evil), "--draft", str(qwen3_dirs["draft"]))
    assert rc == 0
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "t\\x1b]0;owned\\x07\\u202e" in out
    rc, out, _ = doctor(capsys, "--model", "evil/\x1b[2Jname", "--json")
    assert rc == 1 and "\x1b" not in out and json.loads(out)["target"] == "evil/\x1b[2Jname"


@pytest.mark.parametrize("flags, says", [
    (["--demo", "--tokens", "0"], "--tokens must be at least 1"),
    (["--demo", "--pipeline"], "--pipeline needs --distributed"),
    (["--draft", "/nonexistent"], "--draft needs --model"),
])
def test_a_usage_error_exits_2_not_the_1_of_a_failed_check(flags, says, capsys):
    assert main(["doctor", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
