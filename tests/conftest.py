"""Shared fixtures: tiny random-weight pairs in the real formats, and isolated user dirs."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def pytest_sessionstart(session):
    # a run ended with SIGTERM (a CI or `timeout` limit) takes Ctrl+C's path: finally blocks and
    # fixture teardowns still run, so the servers and rank launchers tests start in sessions of
    # their own end with it instead of outliving it
    signal.signal(signal.SIGTERM, _interrupted)


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path, monkeypatch):
    """No test reads or writes the real config, sessions or saved caches."""
    monkeypatch.setenv("DFLASH_TUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DFLASH_TUI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DFLASH_TUI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _build_pair(root: Path, kind: str, seed: int, **dims) -> dict[str, Path]:
    from dflash_tui import random_pair as rp

    cfg = rp.build_target(root / "target", kind=kind, seed=seed, tie=False, **dims)
    dcfg = rp.draft_config_for(cfg, rp.mask_token_id(root / "target"), layers=2, block_size=16)
    rp.build_draft(root / "draft", dcfg, seed=seed + 1)
    return {"target": root / "target", "draft": root / "draft"}


@pytest.fixture(scope="session")
def qwen3_dirs(tmp_path_factory) -> dict[str, Path]:
    """A tiny mlx-lm `qwen3` target (byte-level BPE, ChatML template) and a z-lab-format draft."""
    return _build_pair(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=0)


@pytest.fixture(scope="session")
def qwen3_pair(qwen3_dirs):
    from dflash_tui.engine.loading import load_pair

    return load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """A 3-layer qwen3 target small enough to train a draft for in seconds."""
    from dflash_tui import random_pair as rp

    root = tmp_path_factory.mktemp("trainer") / "target"
    rp.build_target(root, seed=0, hidden=32, layers=3, heads=2, kv_heads=1, head_dim=16, intermediate=64)
    return root


def ring_port() -> int:
    """A starting port for a 2-rank `mlx.launch --backend ring`: below Linux's ephemeral ports (32768
    and up, which every test's client sockets take), in a band of its own per xdist worker, so launches
    running at once on two workers never pick the same ports."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    band = 10000 + (int(worker) % 8 if worker.isdigit() else 0) * 2500
    return band + random.randrange(0, 2496, 4)  # each launch takes this port and the next

def reference_tokens(pair, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens from plain `mlx_lm.stream_generate` (EOS excluded, as it reports them)."""
    from dflash_tui.bench.exactness import vanilla_tokens

    return vanilla_tokens(pair.target.model, pair.target.tokenizer, prompt, max_tokens)


def oracle_proposer(sequence: list[int], error_rate: float = 0.3, seed: int = 0, vocab: int = 300):
    """A draft that is sometimes right: proposals come from the known greedy continuation
    `sequence` (prompt + reference output), with planted errors. The real draft still
    runs, so the draft cache and context flow are exercised."""
    import mlx.core as mx

    from dflash_tui.engine.speculative import draft_proposals

    rng = random.Random(seed)

    def propose(state, token, b):
        real = draft_proposals(state, token, b)
        n = len(state.tokens)  # `token` sits at position n
        out = []
        for i in range(1, b):
            want = sequence[n + i] if n + i < len(sequence) else rng.randrange(vocab)
            if rng.random() < error_rate:
                want = (want + 1 + rng.randrange(vocab - 1)) % vocab
            out.append(want)
        return mx.array(out, dtype=real.dtype) + 0 * real  # keep the draft forward in the graph

    return propose


def oracle_run(pair, reference, text: str, max_tokens: int, block_size, seed: int, error_rate: float = 0.15):
    """One greedy turn of `text` with an oracle draft (planted errors) against `reference`'s
    `stream_generate` tokens (`reference`: the pair itself or another load of its target).
    Returns (reference tokens, the turn's Block events, its Done event)."""
    from dflash_tui.engine.conversation import Conversation, GenerationSettings
    from dflash_tui.engine.events import Block

    conv = Conversation(pair)
    conv.messages.append({"role": "user", "content": text})
    ids = conv.prompt_tokens()
    conv.messages.clear()
    ref = reference_tokens(reference, ids, max_tokens)
    conv.propose = oracle_proposer(ids + ref, error_rate=error_rate, seed=seed, vocab=pair.target.vocab_size)
    events = list(conv.generate(text, GenerationSettings(max_tokens=max_tokens, block_size=block_size)))
    return ref, [e for e in events if isinstance(e, Block)], events[-1]


def demo_pair_bundled() -> bool:
    """True when the demo pair's weights are in the package (or DFLASH_TUI_DEMO_DIR names a build)."""
    from dflash_tui.demo import demo_draft_path, demo_target_path
    from dflash_tui.errors import UserError

    try:
        demo_target_path(), demo_draft_path()
    except UserError:
        return False
    return True


@pytest.fixture
def anyio_backend():
    """The event loop the async (Pilot) tests run on."""
    return "asyncio"


@pytest.fixture
def started(monkeypatch):
    """`dflash-tui chat`'s app, built and stopped before it takes the terminal (the CLI tests)."""
    import sys

    from dflash_tui.commands import chat

    apps: list = []
    monkeypatch.setattr(chat, "run_to_the_end", lambda app, **kw: apps.append(app) or 0)
    interval = sys.getswitchinterval()
    yield apps
    sys.setswitchinterval(interval)
