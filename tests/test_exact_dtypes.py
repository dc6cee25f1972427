"""Lossless on the default path, in the dtypes checkpoints are published in.

Greedy DFlash output equals vanilla `mlx_lm.stream_generate` token for token
with bf16 and fp32 weights, for an attention target and a hybrid (Gated
DeltaNet) target, through `dflash-tui generate` as a user runs it and through
the engine with partial accepts at many depths. A target computed in another
precision than mlx-lm's (fp32 copies of bf16 weights, say) drifts off
mlx-lm's tokens within a few dozen tokens here.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import pytest

from conftest import oracle_proposer, reference_tokens
from dflash_tui import random_pair as rp
from dflash_tui.cli import main
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block
from dflash_tui.engine.loading import load_pair

N_TOKENS = 160
PROMPT = "Write a function that adds two numbers and explain it. " * 3
KINDS = {"qwen3": {}, "qwen3_5": {"linear_head_dim": 32}}


@pytest.fixture(scope="module", params=[(k, d) for k in KINDS for d in ("bfloat16", "float32")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def dirs(request, tmp_path_factory):
    kind, dtype = request.param
    root = tmp_path_factory.mktemp(f"{kind}_{dtype}")
    cfg = rp.build_target(root / "target", kind=kind, seed=5, dtype=dtype, **KINDS[kind])
    dcfg = rp.draft_config_for(cfg, rp.mask_token_id(root / "target"), layers=2, block_size=16)
    rp.build_draft(root / "draft", dcfg, seed=6, dtype=getattr(mx, dtype))
    return {"target": root / "target", "draft": root / "draft", "dtype": dtype}


@pytest.fixture(scope="module")
def pair(dirs):
    return load_pair(str(dirs["target"]), str(dirs["draft"]))


@pytest.fixture(scope="module")
def vanilla(dirs):
    """A separate, untouched `mlx_lm.load` of the target: what a user runs instead."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(dirs["target"]))
    return SimpleNamespace(target=SimpleNamespace(model=model, tokenizer=tokenizer))


def prompt_ids(pair) -> list[int]:
    conv = Conversation(pair)
    conv.messages.append({"role": "user", "content": PROMPT})
    return conv.prompt_tokens()


def test_the_weights_are_in_the_dtype_under_test(pair, dirs):
    assert str(pair.target.backbone.embed_tokens.weight.dtype) == f"mlx.core.{dirs['dtype']}"


def test_generate_as_a_user_runs_it_equals_stream_generate(pair, vanilla, dirs, capsys):
    """`dflash-tui generate` with default settings (the draft's block size), JSON events out."""
    ref = reference_tokens(vanilla, prompt_ids(pair), N_TOKENS)
    assert main(["generate", PROMPT, "--model", str(dirs["target"]), "--draft", str(dirs["draft"]),
                 "--max-tokens", str(N_TOKENS), "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    done = events[-1]
    assert done["type"] == "done"
    assert done["tokens"] == ref


@pytest.mark.parametrize("block_size", [4, 16])
def test_partial_accepts_equal_stream_generate(pair, vanilla, block_size):
    ids = prompt_ids(pair)
    ref = reference_tokens(vanilla, ids, N_TOKENS)
    conv = Conversation(pair)
    conv.propose = oracle_proposer(ids + ref, error_rate=0.15, seed=block_size, vocab=pair.target.vocab_size)
    events = list(conv.generate(PROMPT, GenerationSettings(max_tokens=N_TOKENS, block_size=block_size)))
    assert events[-1].tokens == ref
    accepted = {e.accepted for e in events if isinstance(e, Block) and e.drafted}
    assert 0 in accepted and len(accepted) >= 3, accepted  # rejections and partial accepts of several depths
