"""`dflash-tui doctor` on broken copies of a tiny real-format pair: a config.json count or size of the
wrong type or out of range, a safetensors header whose shapes do not match its bytes, a vocab_size that
is not the rows of the embedding or an untied lm_head (replicas of published families), a context of 0,
and --tokens past the model's context. Each is a FAIL naming the key or tensor (exit 1) where the
real loader then fails, never "everything fits" and never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct

import pytest

from dflash_tui.cli import main


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("doctor opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def doctor(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["doctor", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def copy_with(src, dst, **changes):
    """A copy of a model directory whose config.json has `changes` (None writes null; ... drops the key)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def fail_line(out: str, check: str) -> str:
    lines = [line for line in out.splitlines() if line.split()[:1] == ["FAIL"] and f"  {check}  " in line]
    assert lines, out
    return lines[0]


def loader_fails(path) -> bool:
    import mlx_lm

    try:
        mlx_lm.load(str(path))
    except Exception:
        return True
    return False


# (config.json change, what the FAIL line says, whether mlx_lm.load is tried: never on 10**18 layers)
BAD_CONFIGS = [
    ({"num_hidden_layers": 10**18}, "num_hidden_layers is 1000000000000000000, out of range (1 to 10000)", False),
    ({"num_hidden_layers": -1}, "num_hidden_layers is -1, out of range", True),
    ({"hidden_size": "64"}, 'hidden_size is "64" (a string), not a whole number', True),
    ({"hidden_size": 64.0}, "hidden_size is 64.0, not a whole number", True),
    ({"vocab_size": None}, "vocab_size is null, not a whole number", True),
    ({"num_attention_heads": 0}, "num_attention_heads is 0, out of range", True),
    ({"num_key_value_heads": True}, "num_key_value_heads is true, not a whole number", False),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3", False),
    ({"max_position_embeddings": 0}, "max_position_embeddings is 0, out of range", False),
    ({"max_position_embeddings": -4096}, "max_position_embeddings is -4096, out of range", False),
    ({"max_position_embeddings": 1.5}, "max_position_embeddings is 1.5, not a whole number", False),
]


@pytest.mark.parametrize("changes, says, load", BAD_CONFIGS, ids=[next(iter(c[0])) + "=" + repr(next(iter(c[0].values())))[:12]
                                                                   for c in BAD_CONFIGS])
def test_a_bad_count_or_size_in_config_json_is_a_fail_naming_the_key(tmp_path, qwen3_dirs, capsys, changes, says, load):
    target = copy_with(qwen3_dirs["target"], tmp_path / "target", **changes)
    rc, out, err = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    assert rc == 1 and not err, out + err
    assert says in fail_line(out, "target files")
    assert out.rstrip().endswith("verdict: does not work: target files")
    assert "memory at" not in out and "everything fits" not in out  # no figures from a config that is wrong
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]), "--json")
    report = json.loads(out)
    assert rc == 1 and report["ok"] is False
    assert any(c["ok"] is False and says in c["detail"] for c in report["checks"])
    if load:  # what doctor fails, the real loader fails too
        assert loader_fails(target)


def test_a_field_the_architecture_needs_and_the_file_lacks_is_a_fail(tmp_path, qwen3_dirs, capsys):
    # doctor's own facts do without it (a context is optional to them); mlx-lm's qwen3 settings require it
    target = copy_with(qwen3_dirs["target"], tmp_path / "target", max_position_embeddings=...)
    assert loader_fails(target)
    rc, out, err = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    assert rc == 1 and not err, out + err
    line = fail_line(out, "architecture")
    assert "cannot read its config.json" in line and "max_position_embeddings" in line, line
    assert "everything fits" not in out


def test_every_bad_key_is_named_at_once(tmp_path, qwen3_dirs, capsys):
    target = copy_with(qwen3_dirs["target"], tmp_path / "target", hidden_size="64", vocab_size=None, num_hidden_layers=0)
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    line = fail_line(out, "target files")
    assert rc == 1 and all(k in line for k in ("hidden_size", "vocab_size", "num_hidden_layers")), line


def test_a_draft_with_a_count_out_of_range_is_a_fail_not_a_hang(tmp_path, qwen3_dirs, capsys):
    # DraftConfig makes a list as long as its layers when layer_types is empty
    draft = copy_with(qwen3_dirs["draft"], tmp_path / "draft", num_hidden_layers=10**18, layer_types=[])
    rc, out, _ = doctor(capsys, "--model", str(qwen3_dirs["target"]), "--draft", str(draft))
    assert rc == 1
    assert "num_hidden_layers is 1000000000000000000, out of range" in fail_line(out, "draft config")
    draft = copy_with(qwen3_dirs["draft"], tmp_path / "draft2", block_size=10**12)
    rc, out, _ = doctor(capsys, "--model", str(qwen3_dirs["target"]), "--draft", str(draft))
    assert rc == 1 and "block_size is 1000000000000, out of range" in fail_line(out, "draft config")


def deep_config(target) -> str:
    (target / "config.json").write_text("[" * 100_000)  # json.loads raises RecursionError
    return "config.json is not valid JSON: nested too deep"


def fifo_config(target) -> str:
    (target / "config.json").unlink()
    os.mkfifo(target / "config.json")  # reading it would wait for a writer forever
    return "config.json is not a regular file"


def fifo_weights(target) -> str:
    (target / "model.safetensors").unlink()
    os.mkfifo(target / "model.safetensors")
    return "model.safetensors is not a regular file"


@pytest.fixture
def deadline():
    """A test that would hang (a read of a fifo) fails after 60 s instead."""
    def expire(signum, frame):
        raise TimeoutError("doctor hung")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("spoil", [deep_config, fifo_config, fifo_weights])
def test_files_that_would_crash_or_hang_the_reading_are_a_fail(tmp_path, qwen3_dirs, capsys, deadline, spoil):
    target = copy_with(qwen3_dirs["target"], tmp_path / "target")
    says = spoil(target)
    rc, out, err = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    assert rc == 1 and not err, out + err
    assert fail_line(out, "target files").endswith(says)


def rewrite_header(path, edit) -> None:
    """Rewrite a safetensors file's header JSON through `edit`, its data bytes left as they are."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def first_tensor(header: dict) -> str:
    return min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def test_a_tensor_whose_shape_does_not_match_its_bytes_is_a_fail_naming_it(tmp_path, qwen3_dirs, capsys):
    target = copy_with(qwen3_dirs["target"], tmp_path / "target")
    shard = target / "model.safetensors"
    named = []

    def huge(header):  # shape 10**15 x 10**15, its data_offsets still spanning the few bytes it had
        name = first_tensor(header)
        named.append(name)
        header[name]["shape"] = [10**15, 10**15]

    rewrite_header(shard, huge)
    rc, out, err = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    line = fail_line(out, "target files")
    assert rc == 1 and not err, out + err
    assert f"model.safetensors: tensor {named[0]!r}" in line and "[1000000000000000, 1000000000000000]" in line
    assert "data_offsets" in line and out.rstrip().endswith("does not work: target files")
    assert loader_fails(target)


def test_a_tensor_of_a_dtype_mlx_does_not_load_is_a_fail(tmp_path, qwen3_dirs, capsys):
    target = copy_with(qwen3_dirs["target"], tmp_path / "target")
    shard = target / "model.safetensors"
    named = []

    def doubles(header):  # F64 takes twice the bytes of F32: a tensor of half as many elements keeps its offsets
        name = next(n for n in header if n != "__metadata__" and header[n]["dtype"] == "F32"
                    and header[n]["shape"] and header[n]["shape"][0] % 2 == 0)
        named.append(name)
        header[name]["dtype"], header[name]["shape"][0] = "F64", header[name]["shape"][0] // 2

    rewrite_header(shard, doubles)
    rc, out, err = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    assert rc == 1 and not err, out + err
    assert f"model.safetensors: tensor {named[0]!r} is F64, which MLX does not load" in fail_line(out, "target files")
    assert loader_fails(target)


def test_a_tensor_past_the_end_of_its_file_is_a_fail(tmp_path, qwen3_dirs, capsys):
    target = copy_with(qwen3_dirs["target"], tmp_path / "target")
    shard = target / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1])  # the last tensor's bytes cut short, the header unchanged
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]))
    assert rc == 1 and "run past the end of the file" in fail_line(out, "target files")
    assert loader_fails(target)


def test_a_draft_tensor_whose_shape_does_not_match_its_bytes_is_a_fail(tmp_path, qwen3_dirs, capsys):
    draft = copy_with(qwen3_dirs["draft"], tmp_path / "draft")
    (weights,) = draft.glob("*.safetensors")
    rewrite_header(weights, lambda h: h[first_tensor(h)]["shape"].insert(0, 2))  # twice the elements
    rc, out, _ = doctor(capsys, "--model", str(qwen3_dirs["target"]), "--draft", str(draft))
    line = fail_line(out, "draft config")
    assert rc == 1 and f"{weights.name}: tensor" in line and "but its data_offsets" in line


def test_a_context_not_stated_is_not_shown_as_some_other_figure(tmp_path, qwen3_dirs, capsys, monkeypatch):
    # mlx-lm's qwen3 needs max_position_embeddings (a FAIL: the test above); llama's defaults it, so the
    # tiny target read as a llama one: the memory figures are then for --tokens alone, and nothing
    # claims a context the config does not give
    target = copy_with(qwen3_dirs["target"], tmp_path / "target", max_position_embeddings=..., model_type="llama",
                       architectures=["LlamaForCausalLM"])
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(qwen3_dirs["draft"]), "--tokens", "512")
    assert "context not stated in config.json" in out and "context 0" not in out
    assert "at the model's context" not in out and "the whole context fits" not in out
    assert "512 tokens of context fit" in out


def test_tokens_beyond_the_models_context_is_a_usage_error(qwen3_dirs, capsys):
    pair = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"])]
    for extra in ([], ["--json"]):
        rc, out, err = doctor(capsys, *pair, "--tokens", "99999999999999", *extra)
        assert rc == 2 and not out, out
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "--tokens 99999999999999 is beyond the model's context (32768 tokens)" in lines[0]
    rc, out, _ = doctor(capsys, *pair, "--tokens", "32768")  # the whole context itself is fine
    assert rc == 0 and "memory at 32768 tokens" in out and "the whole context fits" in out


# -- the vocabulary: config.json's vocab_size against the embedding's and an untied lm_head's rows ---------------
@pytest.fixture(scope="module")
def replica_tokenizer(tmp_path_factory):
    from replicas import build_tokenizer

    out = tmp_path_factory.mktemp("vocab_tok")
    build_tokenizer(out)
    return out


def replica(tmp_path_factory, tokenizer, name: str) -> dict:
    """A tiny replica pair of a published family (tests/families.py) in its real checkpoint format."""
    from families import BY_NAME
    from replicas import build_pair

    return build_pair(BY_NAME[name], tmp_path_factory.mktemp(name), tokenizer, seed=0)


def with_vocab(src, dst, vocab: int):
    """A copy whose config.json states `vocab` wherever it states a vocab_size (a wrapper's text_config too)."""
    copy = copy_with(src, dst, vocab_size=vocab)
    cfg = json.loads((copy / "config.json").read_text())
    if "text_config" in cfg:
        cfg["text_config"]["vocab_size"] = vocab
    (copy / "config.json").write_text(json.dumps(cfg))
    return copy


def edit_weights(path, edit) -> None:
    """Rewrite a safetensors file through `edit` (a dict of name -> array), its metadata kept."""
    import mlx.core as mx

    weights, meta = mx.load(str(path), return_metadata=True)
    edit(weights)
    mx.save_safetensors(str(path), weights, metadata=meta)


def padded(a, rows: int):
    import mlx.core as mx

    return mx.concatenate([a, mx.zeros((rows, *a.shape[1:]), dtype=a.dtype)])


# flat untied, quantized, Gemma 4 (vocab_size from the top level), a hybrid wrapper, gpt-oss (no tie setting)
VOCAB_FAMILIES = ["qwen3-8b", "qwen3-8b-4bit", "gemma-4-31b", "qwen3.6-27b-4bit", "gpt-oss-20b"]


@pytest.mark.parametrize("name", VOCAB_FAMILIES)
def test_a_vocab_size_that_is_not_the_embeddings_rows_is_a_fail_naming_both(tmp_path, tmp_path_factory,
                                                                              replica_tokenizer, capsys, name):
    dirs = replica(tmp_path_factory, replica_tokenizer, name)
    rows = json.loads((dirs["target"] / "config.json").read_text())["vocab_size"]
    rc, out, _ = doctor(capsys, "--model", str(dirs["target"]), "--draft", str(dirs["draft"]))
    assert "target files" not in out, out  # the replica as built: its rows are its vocab_size
    # a config padded past its weights (or weights short of it): mlx-lm refuses the load
    target = with_vocab(dirs["target"], tmp_path / "target", rows + 64)
    rc, out, err = doctor(capsys, "--model", str(target), "--draft", str(dirs["draft"]))
    line = fail_line(out, "target files")
    assert rc == 1 and not err, out + err
    assert f"config.json's vocab_size is {rows + 64}, but " in line and f"embed_tokens.weight has {rows} rows" in line
    tied = name.startswith("gemma")
    assert (f"lm_head.weight has {rows} rows" in line) is not tied, line
    assert "memory at" not in out and out.rstrip().endswith("verdict: does not work: target files")
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(dirs["draft"]), "--json")
    assert rc == 1 and any(c["ok"] is False and f"has {rows} rows" in c["detail"] for c in json.loads(out)["checks"])
    assert loader_fails(target)


def test_an_untied_head_padded_past_the_vocab_is_a_fail(tmp_path, tmp_path_factory, replica_tokenizer, capsys):
    dirs = replica(tmp_path_factory, replica_tokenizer, "qwen3-8b")
    target = copy_with(dirs["target"], tmp_path / "target")
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    edit_weights(target / "model.safetensors", lambda w: w.update({"lm_head.weight": padded(w["lm_head.weight"], 64)}))
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(dirs["draft"]))
    line = fail_line(out, "target files")
    assert rc == 1 and line.endswith(f"config.json's vocab_size is {vocab}, but lm_head.weight has {vocab + 64} rows: "
                                     "mlx-lm builds it with vocab_size rows and cannot load this"), line
    assert loader_fails(target)


def test_a_tied_models_head_copy_is_not_held_to_the_vocab_its_embedding_is(tmp_path, tmp_path_factory,
                                                                           replica_tokenizer, capsys):
    import mlx_lm

    dirs = replica(tmp_path_factory, replica_tokenizer, "qwen3-4b")  # tie_word_embeddings: no lm_head of its own
    target = copy_with(dirs["target"], tmp_path / "target")
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    # a stray lm_head copy of another size: mlx-lm's sanitize drops it, and the model loads
    edit_weights(target / "model.safetensors",
                 lambda w: w.update({"lm_head.weight": padded(w["model.embed_tokens.weight"], 64)}))
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(dirs["draft"]))
    assert rc == 0 and "target files" not in out, out
    mlx_lm.load(str(target))
    # the embedding itself padded past vocab_size: the load fails, and doctor says so
    edit_weights(target / "model.safetensors",
                 lambda w: w.update({"model.embed_tokens.weight": padded(w["model.embed_tokens.weight"], 64)}))
    rc, out, _ = doctor(capsys, "--model", str(target), "--draft", str(dirs["draft"]))
    line = fail_line(out, "target files")
    assert rc == 1 and f"vocab_size is {vocab}, but model.embed_tokens.weight has {vocab + 64} rows: " in line, line
    assert "lm_head" not in line
    assert loader_fails(target)


def test_gemma_4_is_held_to_the_top_level_vocab_size_mlx_lm_hands_its_text_model(tmp_path, tmp_path_factory,
                                                                                 replica_tokenizer, capsys):
    dirs = replica(tmp_path_factory, replica_tokenizer, "gemma-4-31b")
    cfg = json.loads((dirs["target"] / "config.json").read_text())
    rows = cfg["vocab_size"]
    text_off = copy_with(dirs["target"], tmp_path / "text_off", text_config=dict(cfg["text_config"], vocab_size=rows + 64))
    rc, out, _ = doctor(capsys, "--model", str(text_off), "--draft", str(dirs["draft"]))
    assert rc == 0 and "target files" not in out, out  # mlx-lm reads the top level's: it loads
    assert not loader_fails(text_off)
    top_off = copy_with(dirs["target"], tmp_path / "top_off", vocab_size=rows + 64)
    rc, out, _ = doctor(capsys, "--model", str(top_off), "--draft", str(dirs["draft"]))
    assert rc == 1 and f"vocab_size is {rows + 64}, but " in fail_line(out, "target files")
    assert loader_fails(top_off)


@pytest.mark.parametrize("sharded", [False, True])
def test_loading_a_model_whose_vocab_size_is_not_its_embeddings_rows_names_both(tmp_path, tmp_path_factory,
                                                                               replica_tokenizer, sharded):
    """The loader runs doctor's check first: mlx-lm's sharded load compares no shapes and would load it wrong."""
    from types import SimpleNamespace

    from dflash_tui.engine.loading import load_target
    from dflash_tui.errors import UserError

    dirs = replica(tmp_path_factory, replica_tokenizer, "qwen3-8b")
    rows = json.loads((dirs["target"] / "config.json").read_text())["vocab_size"]
    target = with_vocab(dirs["target"], tmp_path / "target", rows + 64)
    ranks = SimpleNamespace(kind="tensor", group=None) if sharded else None  # refused before any rank is used
    with pytest.raises(UserError) as err:
        load_target(str(target), ranks=ranks)
    assert str(err.value).startswith(f"could not load model {target}: config.json's vocab_size is {rows + 64}, but ")
    assert f"embed_tokens.weight has {rows} rows" in str(err.value)
    assert load_target(str(dirs["target"])).vocab_size == rows  # the replica as built loads
