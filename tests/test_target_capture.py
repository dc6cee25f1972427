"""Layer capture is per instance: other models, and plain mlx-lm calls, are untouched."""

from __future__ import annotations

import mlx.core as mx

from conftest import reference_tokens
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.loading import load_pair, load_target


def test_capture_matches_a_manual_layer_loop(qwen3_pair):
    t = qwen3_pair.target
    ids = mx.array([[5, 6, 7, 8]])
    logits, feats = t.forward(ids, t.make_cache())
    h = t.backbone.embed_tokens(ids)
    outs = []
    for layer in t.layers:
        h = layer(h, "causal", None)
        outs.append(h)
    want = mx.concatenate([outs[i] for i in t.capture_ids], axis=-1)
    assert feats.shape == (1, 4, t.hidden_size * len(t.capture_ids))
    assert mx.allclose(feats, want, atol=1e-5).item()
    assert mx.allclose(logits, t.model(ids), atol=1e-4).item()


def test_other_instances_and_plain_calls_are_untouched(qwen3_dirs, qwen3_pair):
    plain = load_target(str(qwen3_dirs["target"]))
    assert all(type(layer).__name__ == "TransformerBlock" for layer in plain.layers)
    assert any(type(layer).__name__.startswith("Capturing") for layer in qwen3_pair.target.layers)
    # a plain mlx-lm forward on the capturing model leaves nothing behind
    qwen3_pair.target.model(mx.array([[1, 2, 3]]))
    assert all(getattr(layer, "_dflash_sink", None) is None for layer in qwen3_pair.target.layers)


def test_two_engines_in_one_process_interleaved(qwen3_dirs, qwen3_pair):
    other = load_pair(str(qwen3_dirs["target"]), str(qwen3_dirs["draft"]))
    a, b = Conversation(qwen3_pair), Conversation(other)
    s = GenerationSettings(max_tokens=30, block_size=4)
    ga, gb = a.generate("one", s), b.generate("two", s)
    done = {}
    # step both generators alternately, so their forwards interleave
    for name, gen in ((n, g) for pair_ in zip([("a", ga)] * 100, [("b", gb)] * 100) for n, g in pair_):
        if name in done:
            continue
        try:
            ev = next(gen)
        except StopIteration:
            continue
        if ev.type == "done":
            done[name] = ev
    assert done["a"].tokens == reference_tokens(qwen3_pair, a.prompt_tokens(a.messages[:-1]), 30)
    assert done["b"].tokens == reference_tokens(other, b.prompt_tokens(b.messages[:-1]), 30)

