"""The prefill's chunks: mlx-lm's own on a GPU (whose rows may round with the rows computed
together), shorter on the CPU (whose rows do not; a Ctrl+C is answered between chunks)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from conftest import reference_tokens
from dflash_tui.engine import state as state_module
from dflash_tui.engine.conversation import GenerationSettings
from dflash_tui.engine.state import DecodeState


def test_the_default_chunk_is_mlx_lm_s_on_a_gpu_and_shorter_on_the_cpu(monkeypatch):
    from mlx_lm.generate import generate_step

    assert GenerationSettings().prefill_chunk is None
    assert state_module.default_prefill_chunk() == 512  # this machine: the CPU
    assert state_module.MLX_LM_PREFILL_STEP == inspect.signature(generate_step).parameters["prefill_step_size"].default
    monkeypatch.setattr(state_module, "mx", SimpleNamespace(default_device=lambda: "gpu", gpu="gpu"))
    assert state_module.default_prefill_chunk() == 2048


def test_a_long_prompt_is_prefilled_in_default_chunks_then_its_last_token_alone(qwen3_pair, monkeypatch):
    monkeypatch.setattr(state_module, "default_prefill_chunk", lambda: 256)
    target = qwen3_pair.target
    sizes = []
    forward = type(target).forward
    monkeypatch.setattr(type(target), "forward", lambda self, tokens, cache, **kw: sizes.append(tokens.shape[1])
                        or forward(self, tokens, cache, **kw))
    prompt = [(5 * i) % 300 + 3 for i in range(600)]
    state = DecodeState(target, qwen3_pair.draft)
    logits, _ = state.prefill(prompt)
    assert sizes == [256, 256, 87, 1]
    assert int(logits.argmax().item()) == reference_tokens(qwen3_pair, prompt, 1)[0]
