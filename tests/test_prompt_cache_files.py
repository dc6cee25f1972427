"""Saved conversation caches: a reopened conversation starts from its last turn's caches on disk,
gives the tokens a cold prefill gives (mlx-lm's), and never trusts a file it should not."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import reference_tokens
from families import BY_NAME
from mlx_lm.models.cache import KVCache, save_prompt_cache
from replicas import build_pair, build_tokenizer

from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Done, Prefill
from dflash_tui.engine.loading import load_pair
from dflash_tui.engine.prompt_cache_files import FORMAT, PromptCacheFiles, tokens_key

SETTINGS = GenerationSettings(max_tokens=24, block_size=8)
TURNS = ["Write a function that adds two numbers and explain it.", "Now the same for three numbers, please."]
LAST = "And for a list of numbers?"
FAMILY_KINDS = {"attention": "qwen3-8b", "hybrid": "qwen3.5-4b", "window": "gpt-oss-20b"}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pcf_tokenizer")
    build_tokenizer(out)
    return out


@pytest.fixture(scope="module", params=list(FAMILY_KINDS))
def family_dirs(request, tmp_path_factory, tokenizer_dir):
    family = BY_NAME[FAMILY_KINDS[request.param]]
    return build_pair(family, tmp_path_factory.mktemp(family.name), tokenizer_dir, seed=3)


def turn(conv: Conversation, text: str) -> tuple[Prefill, Done]:
    events = list(conv.generate(text, SETTINGS))
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Done), events[-1]
    return events[0], events[-1]


def talk(pair, root: Path, cap: int = 2**30, notify=lambda text: None) -> tuple[Conversation, Path]:
    """Two turns with caches saved after each; the conversation and the last file."""
    conv = Conversation(pair)
    conv.saved = PromptCacheFiles(pair, root, cap, notify)
    path = None
    for text in TURNS:
        turn(conv, text)
        path = conv.save_caches()
    assert path is not None and path.is_file()
    return conv, path


def reopened(pair, messages, root: Path | None) -> Conversation:
    """A conversation opened from its saved messages, in a new Conversation (as after a restart)."""
    conv = Conversation(pair)
    if root is not None:
        conv.saved = PromptCacheFiles(pair, root)
    conv.messages = [dict(m) for m in messages]
    return conv


def test_warm_resume_equals_cold_and_skips_the_prefill(family_dirs, tmp_path):
    pair = load_pair(str(family_dirs["target"]), str(family_dirs["draft"]))
    root = tmp_path / "caches"
    live, path = talk(pair, root)
    assert [e.path for e in PromptCacheFiles(pair, root).entries()] == [path]
    # a restart: the pair loaded again, the conversation rebuilt from its messages
    again = load_pair(str(family_dirs["target"]), str(family_dirs["draft"]))
    warm = reopened(again, live.messages, root)
    prompt = warm.prompt_tokens(warm.messages + [{"role": "user", "content": LAST}])
    pre_warm, done_warm = turn(warm, LAST)
    cold = reopened(again, live.messages, None)
    pre_cold, done_cold = turn(cold, LAST)
    assert warm.saved.last_loaded == path
    assert pre_cold.cached_tokens == 0
    # what the file spares: the shared prefix (a hybrid target: its latest truncation point within it;
    # behind a sliding window: only the rows a prefill computed, see engine/window_cache.py)
    entry = warm.saved._entry(path)
    spared = min(entry.usable(prompt), entry.prefilled) if again.target.windowed else entry.usable(prompt)
    assert pre_warm.cached_tokens == spared > 0
    assert pre_warm.prompt_tokens - pre_warm.cached_tokens < len(prompt)  # fewer tokens prefilled than cold
    assert done_warm.tokens == done_cold.tokens == reference_tokens(again, prompt, SETTINGS.max_tokens)


def test_each_turn_replaces_the_file_it_extends(qwen3_pair, tmp_path):
    conv = Conversation(qwen3_pair)
    conv.saved = PromptCacheFiles(qwen3_pair, tmp_path)
    turn(conv, TURNS[0])
    first = conv.save_caches()
    turn(conv, TURNS[1])
    second = conv.save_caches()
    assert not first.exists() and second.exists()
    assert [e.path for e in conv.saved.entries()] == [second]
    assert conv.save_caches() == second  # nothing new held: the same file


def test_the_size_cap_evicts_the_least_recently_used(qwen3_pair, tmp_path):
    one = Conversation(qwen3_pair)
    one.saved = PromptCacheFiles(qwen3_pair, tmp_path)
    turn(one, TURNS[0])
    old = one.save_caches()
    size = old.stat().st_size
    os.utime(old, (1, 1))  # long ago
    two = Conversation(qwen3_pair)
    two.saved = PromptCacheFiles(qwen3_pair, tmp_path, cap_bytes=int(size * 1.5))
    turn(two, "a different conversation")
    new = two.save_caches()
    assert new is not None and new.exists() and not old.exists()
    tiny = Conversation(qwen3_pair)
    tiny.saved = PromptCacheFiles(qwen3_pair, tmp_path / "small", cap_bytes=size // 4)
    turn(tiny, TURNS[0])
    assert tiny.save_caches() is None and not list((tmp_path / "small").rglob("*.safetensors"))


def _damaged(kind: str, path: Path, pair, other_pair, tmp_path: Path) -> None:
    """Turn the saved file at `path` into a hostile one of `kind`."""
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        path.write_bytes(random.Random(len(data)).randbytes(len(data)))  # fixed garbage: a failure reproduces
    elif kind == "huge header":
        path.write_bytes((2**62).to_bytes(8, "little") + data[8:])
    elif kind == "renamed":  # the name no longer hashes its tokens
        path.rename(path.with_name("0" * 40 + ".safetensors"))
    elif kind == "foreign":  # another model's file under this pair's name
        conv = Conversation(other_pair)
        conv.saved = PromptCacheFiles(other_pair, tmp_path / "other")
        turn(conv, TURNS[0])
        path.write_bytes(conv.save_caches().read_bytes())
    elif kind == "wrong shapes":  # our key and token hash, arrays of another shape
        meta = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])["__metadata__"]
        ours = {k[2:]: v for k, v in meta.items() if k.startswith("0.")}
        caches = []
        for _ in range(int(ours["n_target"]) + int(ours["n_draft"])):
            c = KVCache()
            c.update_and_fetch(mx.zeros((1, 1, len(json.loads(ours["tokens"])), 8)), mx.zeros((1, 1, len(json.loads(ours["tokens"])), 8)))
            caches.append(c)
        path.unlink()
        save_prompt_cache(str(path), caches, ours)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated", "garbage", "huge header", "renamed", "foreign", "wrong shapes"])
def test_a_hostile_file_means_a_cold_prefill(kind, qwen3_pair, qwen3_dirs, tmp_path, tmp_path_factory):
    from conftest import _build_pair

    other = None
    if kind == "foreign":
        dirs = _build_pair(tmp_path_factory.mktemp("foreign"), "qwen3", seed=7)
        other = load_pair(str(dirs["target"]), str(dirs["draft"]))
    live, path = talk(qwen3_pair, tmp_path / "caches")
    _damaged(kind, path, qwen3_pair, other, tmp_path)
    warm = reopened(qwen3_pair, live.messages, tmp_path / "caches")
    prompt = warm.prompt_tokens(warm.messages + [{"role": "user", "content": LAST}])
    pre, done = turn(warm, LAST)
    assert pre.cached_tokens == 0 and warm.saved.last_loaded is None
    assert done.tokens == reference_tokens(qwen3_pair, prompt, SETTINGS.max_tokens)


def test_an_unwritable_cache_dir_is_one_notice_and_no_file(qwen3_pair, tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory should be")
    notices: list[str] = []
    conv = Conversation(qwen3_pair)
    conv.saved = PromptCacheFiles(qwen3_pair, blocked, notify=notices.append)
    for text in TURNS:
        _, done = turn(conv, text)
        assert done.tokens and conv.save_caches() is None
    assert len(notices) == 1 and "not saved" in notices[0]
    pre, _ = turn(conv, LAST)  # the conversation goes on, on what memory holds
    assert pre.cached_tokens > 0


def test_the_file_is_mlx_lms_own_format(qwen3_pair, tmp_path):
    from mlx_lm.models.cache import load_prompt_cache

    conv, path = talk(qwen3_pair, tmp_path)
    caches, meta = load_prompt_cache(str(path), return_metadata=True)  # mlx-lm reads it as it is
    tokens = json.loads(meta["tokens"])
    assert meta["format"] == FORMAT and path.stem == tokens_key(conv.saved.key, tokens)
    n_target = len(qwen3_pair.target.make_cache())
    assert all(c.offset == len(tokens) for c in caches[:n_target])


def test_the_app_worker_saves_after_a_turn_and_a_restart_resumes_warm(qwen3_dirs):
    from dflash_tui.ui import messages as msg
    from dflash_tui.ui.worker import EngineWorker, Generate, Load, Restore

    def session(requests) -> list:
        posted: list = []
        worker = EngineWorker(posted.append)
        load = Load(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]), probe_tokens=0, prompt_cache_bytes=2**30)
        worker._handle(load)
        for r in requests:
            worker._handle(r)
        return posted

    settings = {"max_tokens": 24, "block_size": 8}
    first = session([Generate(1, TURNS[0], settings)])
    done = next(m for m in first if isinstance(m, msg.TurnDone))
    # the app restarted: a new worker, the session reopened from its messages
    second = session([Restore(done.messages), Generate(2, TURNS[1], settings)])
    prefill = next(m for m in second if isinstance(m, msg.TurnPrefill)).event
    assert prefill.cached_tokens > 0
    assert not [m for m in first + second if isinstance(m, (msg.TurnFailed, msg.EngineFailed))]


def test_a_failed_write_leaves_no_file_and_one_notice(qwen3_pair, tmp_path, monkeypatch):
    """A disk that fills up mid-write: MLX's writer fails; no half file stays, the chat goes on."""
    from dflash_tui.engine import prompt_cache_files

    def full_disk(path, caches, meta):
        Path(path).write_bytes(b"\0" * 100)  # what was written before the disk filled
        raise RuntimeError("[save_safetensors] Failed to write")

    monkeypatch.setattr(prompt_cache_files, "save_prompt_cache", full_disk)
    notices: list[str] = []
    conv = Conversation(qwen3_pair)
    conv.saved = PromptCacheFiles(qwen3_pair, tmp_path, notify=notices.append)
    for text in TURNS:
        turn(conv, text)
        assert conv.save_caches() is None
    assert len(notices) == 1 and "Failed to write" in notices[0]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
