"""Sampling seeds in saved sessions: what the engine draws survives JSON, and every seed it ever recorded loads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_tui.cli import main
from dflash_tui.engine.sampling import KeyStream
from dflash_tui.sessions import SessionError, SessionStore, TraceRecorder

FIXTURE = Path(__file__).parent / "fixtures" / "trace_session.json"
JSON_EXACT = 2**53  # below this every JSON reader (a double's integers) keeps an integer exact


def _redoable(seed: int) -> bool:
    """A seed every reader keeps exact (a JavaScript one too) that config.toml's seed and `--seed` take back."""
    from dflash_tui.config import VALIDATORS, BadValue

    try:
        return 0 <= seed < JSON_EXACT and int(float(seed)) == seed and VALIDATORS["seed"](seed) == seed
    except BadValue:
        return False


def test_drawn_seeds_are_exact_in_every_json_reader_and_given_ones_still_work():
    import mlx.core as mx

    seeds = [KeyStream().seed for _ in range(64)]  # 64-bit draws: all 64 in range by chance is under 2^-700
    assert all(_redoable(s) for s in seeds) and len(set(seeds)) > 1
    # a seed the user gives is taken as it is (modulo 2^64), and fixes the draws
    for given, recorded in ((7, 7), (2**63 + 5, 2**63 + 5), (-1, 2**64 - 1)):
        a, b = KeyStream(given), KeyStream(recorded)
        assert a.seed == recorded
        assert mx.random.uniform(key=a.next()).item() == mx.random.uniform(key=b.next()).item()


def test_sampled_turns_from_the_real_engine_are_saved_and_load_again(qwen3_pair, tmp_path):
    """An unseeded sampled turn (the engine draws the seed) and one seeded -1 through the API (recorded as
    2^64 - 1: a 64-bit seed, like those the engine drew before), through the real engine, saved, loaded, listed."""
    from dflash_tui.engine.conversation import Conversation, GenerationSettings

    conv = Conversation(qwen3_pair)
    store = SessionStore(tmp_path / "sessions")
    settings = GenerationSettings(max_tokens=16, block_size=8, temperature=0.9, top_p=0.95)
    session = store.new("tiny-target", "tiny-draft", settings.to_dict())
    tok = qwen3_pair.target.tokenizer
    session.decoder = lambda t: tok.decode([t])
    for text, seed in (("Tell me a story.", None), ("Another one.", -1)):
        rec = TraceRecorder()
        for ev in conv.generate(text, replace(settings, seed=seed)):
            rec.add(ev)
        session.add_message("user", text)
        session.add_message("assistant", ev.text, rec.trace)
        store.save(session)
    drawn, given = (m.done().stats["seed"] for m in session.replies())
    assert _redoable(drawn) and given == 2**64 - 1
    loaded = store.load(session.id)
    assert loaded == session
    assert [m.done().stats["seed"] for m in loaded.replies()] == [drawn, given]
    summaries, problems = store.list()
    assert [s.id for s in summaries] == [session.id] and problems == []
    # the recorded seed redoes the reply
    redo = list(Conversation(qwen3_pair).generate("Tell me a story.", replace(settings, seed=drawn)))[-1]
    assert redo.tokens == loaded.replies()[0].done().tokens


def _with_seed(path: Path, seed, settings_seed=None) -> Path:
    data = json.loads(FIXTURE.read_text())
    data.update(id=path.stem)
    if settings_seed is not None:
        data["settings"]["seed"] = settings_seed
    for m in data["messages"]:
        for entry in m.get("trace") or []:
            if entry["type"] == "done":
                entry["stats"].update(seed=seed, temperature=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_a_file_with_a_64_bit_seed_loads_and_is_listed(tmp_path, monkeypatch, capsys):
    store = SessionStore(tmp_path / "sessions")
    monkeypatch.setattr("dflash_tui.sessions.default_root", lambda: store.root)
    for sid, seed in (("seed-top", 2**64 - 1), ("seed-big", 16_140_901_064_495_857_664), ("seed-53", 2**53 + 1)):
        _with_seed(store.root / f"{sid}.json", seed, settings_seed=seed)
        s = store.load(sid)
        assert {m.done().stats["seed"] for m in s.replies()} == {seed} and s.settings["seed"] == seed
    assert main(["sessions", "list"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3 and "skipped" not in err
    assert main(["sessions", "show", "seed-top", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["messages"][2]["trace"][-1]["stats"]["seed"] == 2**64 - 1


@pytest.mark.parametrize("seed", [2**64, -(2**53) - 1, 1.5, True, "7"])
def test_a_seed_no_run_gives_is_refused(tmp_path, seed):
    path = _with_seed(tmp_path / "s.json", seed)
    with pytest.raises(SessionError, match="stats: bad value for 'seed'"):
        SessionStore(tmp_path).load(path)


def test_generate_json_prints_a_seed_that_redoes_the_reply(qwen3_dirs, capsys):
    args = ["generate", "once upon a time", "--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]),
            "--max-tokens", "12", "--block-size", "4", "--temperature", "0.9", "--json"]
    assert main(args) == 0
    done = json.loads(capsys.readouterr().out.splitlines()[-1])
    seed = done["stats"]["seed"]
    assert _redoable(seed)
    assert main([*args, "--seed", str(seed)]) == 0
    again = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert again["tokens"] == done["tokens"] and again["stats"]["seed"] == seed
