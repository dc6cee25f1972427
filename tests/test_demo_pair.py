"""The bundled demo pair through the real engine: real acceptance, output identical to the target alone.

Skipped while no pair is bundled (or named by DFLASH_TUI_DEMO_DIR).
"""

from __future__ import annotations

import json

import pytest

from conftest import demo_pair_bundled, reference_tokens
from dflash_tui.demo import demo_prompts_path
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Done

# the first eight requests of the corpus's held-out split, in file order (held out of both the
# target's and the draft's training data; not picked for how well they draft)
PROMPTS = [json.loads(line)["prompt"] for line in demo_prompts_path().read_text().splitlines() if line.strip()]
MAX_TOKENS = 200




needs_pair = pytest.mark.skipif(not demo_pair_bundled(), reason="no demo pair bundled yet: build it with dflash_tui.training.build_demo")


@pytest.fixture(scope="module")
def demo_pair():
    from dflash_tui.demo import demo_draft_path, demo_target_path
    from dflash_tui.engine.loading import load_pair

    return load_pair(str(demo_target_path()), str(demo_draft_path()))


@needs_pair
def test_demo_paths_and_files():
    from dflash_tui.demo import demo_draft_path, demo_target_path

    target, draft = demo_target_path(), demo_draft_path()
    files = list(target.glob("*.safetensors")) + list(draft.glob("*.safetensors"))
    assert all(f.stat().st_size <= 15 * 2**20 for f in files)
    assert sum(f.stat().st_size for f in files) <= 40 * 10**6
    assert (target / "tokenizer.json").is_file() and (draft / "config.json").is_file()


def test_missing_weights_are_one_clear_error(tmp_path, monkeypatch):
    import dflash_tui.demo as demo
    from dflash_tui.errors import UserError

    monkeypatch.delenv("DFLASH_TUI_DEMO_DIR", raising=False)
    monkeypatch.setattr(demo, "_HERE", tmp_path)
    with pytest.raises(UserError, match="demo target weights are missing"):
        demo.demo_target_path()


@needs_pair
def test_demo_pair_accepts_and_is_exact(demo_pair):
    per_prompt = []
    for text in PROMPTS:
        conv = Conversation(demo_pair)
        events = list(conv.generate(text, GenerationSettings(max_tokens=MAX_TOKENS, block_size=16)))
        done = events[-1]
        assert isinstance(done, Done), done
        prompt = conv.prompt_tokens([{"role": "user", "content": text}])
        assert done.tokens == reference_tokens(demo_pair, prompt, MAX_TOKENS), text
        per_prompt.append(done.stats["tokens_per_cycle"])
    assert sum(per_prompt) / len(per_prompt) >= 3.5, per_prompt


@needs_pair
def test_demo_target_writes_python(demo_pair):
    conv = Conversation(demo_pair)
    done = list(conv.generate(PROMPTS[1], GenerationSettings(max_tokens=160)))[-1]
    assert done.text.lstrip().startswith(("def ", "async def ", "@")), done.text
