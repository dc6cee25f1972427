"""--draft-quant: the draft's own linear layers in 4 or 8 bits, with output still mlx-lm's."""

from __future__ import annotations

import json
import sys

import mlx.nn as nn
import pytest
from conftest import oracle_proposer, reference_tokens
from families import BY_NAME
from replicas import build_pair, build_tokenizer
from test_cli_generate import cli, pair_args

from dflash_tui.config import load_config
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.loading import load_pair

PROMPT = "Write a function that adds two numbers and explain it."


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    tok = tmp_path_factory.mktemp("quant_tok")
    build_tokenizer(tok)
    return build_pair(BY_NAME["qwen3.5-4b"], tmp_path_factory.mktemp("quant_hybrid"), tok, seed=3)


def linear_layers(draft) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in draft.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_quantized_draft_is_lossless(qwen3_dirs, hybrid_dirs, kind, bits):
    dirs = qwen3_dirs if kind == "attention" else hybrid_dirs
    pair = load_pair(str(dirs["target"]), str(dirs["draft"]), draft_quant=bits)
    layers = linear_layers(pair.draft)
    assert layers and all(isinstance(m, nn.QuantizedLinear) and m.bits == bits for _, m in layers), \
        [(n, type(m).__name__) for n, m in layers]
    assert pair.draft_quant == bits
    conv = Conversation(pair)
    ids = conv.prompt_tokens([{"role": "user", "content": PROMPT}])
    ref = reference_tokens(pair, ids, 48)
    # partial accepts of every depth: the real (quantized) draft runs, an oracle picks the proposals
    conv.propose = oracle_proposer(ids + ref, error_rate=0.2, seed=bits, vocab=pair.target.vocab_size)
    done = list(conv.generate(PROMPT, GenerationSettings(max_tokens=48, block_size=8)))[-1]
    assert done.tokens == ref
    assert done.stats["acceptance"] > 0.3
    # and with its own proposals
    plain = Conversation(pair)
    done = list(plain.generate(PROMPT, GenerationSettings(max_tokens=48, block_size=16)))[-1]
    assert done.tokens == ref


def test_unquantized_draft_keeps_its_linear_layers(qwen3_pair):
    assert qwen3_pair.draft_quant == 0
    assert all(type(m) is nn.Linear for _, m in linear_layers(qwen3_pair.draft))


def test_cli_flag_runs_and_refuses_other_widths(qwen3_dirs, qwen3_pair):
    r = cli("generate", "hello there", *pair_args(qwen3_dirs), "--max-tokens", "16", "--json", "--draft-quant", "4")
    assert r.returncode == 0, r.stderr
    prompt = qwen3_pair.target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello there"}], add_generation_prompt=True, enable_thinking=False)
    assert json.loads(r.stdout.splitlines()[-1])["tokens"] == reference_tokens(qwen3_pair, list(prompt), 16)
    bad = cli("generate", "hi", *pair_args(qwen3_dirs), "--draft-quant", "3")
    assert bad.returncode != 0 and "4 or 8 bits" in bad.stderr


def test_config_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("draft_quant = 8\n")
    assert load_config(path).config.draft_quant == 8
    path.write_text("draft_quant = 6\n")
    loaded = load_config(path)
    assert loaded.config.draft_quant == 0 and "draft_quant" in loaded.message


@pytest.mark.anyio
async def test_chat_flag_reaches_the_engine_load_request(monkeypatch, qwen3_dirs):
    from dflash_tui import cli
    from dflash_tui.commands import chat
    from dflash_tui.ui import worker

    apps = []
    monkeypatch.setattr(chat, "run_to_the_end", lambda app, **kw: apps.append(app) or 0)
    pair = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"])]
    interval = sys.getswitchinterval()  # chat shortens it for the whole process
    assert cli.main(["chat", *pair, "--draft-quant", "8"]) == 0
    sys.setswitchinterval(interval)
    (app,) = apps
    requests = []
    monkeypatch.setattr(app.engine, "submit", requests.append)  # what the engine would be asked to load
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
    loads = [r for r in requests if isinstance(r, worker.Load)]
    assert loads and loads[0].draft_quant == 8
    assert loads[0].prompt_cache_bytes == 2 * 2**30  # the default cap, 2 GB
