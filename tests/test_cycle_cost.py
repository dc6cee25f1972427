"""The cycle benchmark's mechanics on tiny shapes on this CPU: every shape, context and block
in one run, priced in vanilla mlx-lm steps, with the z-lab reference beside it."""


def test_cycle_cost_table_prices_every_shape_and_context_in_vanilla_steps(capsys):
    import json

    from dflash_tui.bench import cycle_cost, references

    assert cycle_cost.main(["--shape", "tiny", "tiny-4bit", "--prompt", "12", "20", "--block-size", "4", "8",
                            "--tokens", "8", "--vanilla", "--zlab", "--zlab-tokens", "6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert {(r["shape"], r["context"], r["block_size"]) for r in rows} == {
        (s, c, b) for s in ("tiny", "tiny-4bit") for c in (12, 20) for b in (4, 8)}
    for r in rows:
        assert r["vanilla_step_ms"] > 0 and r["cycle_ms"] > 0
        assert abs(r["price"] - r["cycle_ms"] / r["vanilla_step_ms"]) < 1e-9
        assert abs(r["target_alone_price"] - r["step_ms"] / r["vanilla_step_ms"]) < 1e-9
        if references.zlab_available():
            assert r["zlab_price"] > 0 and "zlab_error" not in r


def test_quantized_shapes_and_the_vanilla_twin():
    import mlx.nn as nn

    from dflash_tui.bench import cycle_cost

    a, _ = cycle_cost.target_model("tiny-4bit", cycle_cost.mx.float32)
    b, _ = cycle_cost.target_model("tiny-4bit", cycle_cost.mx.float32)
    assert a is not b and isinstance(a.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    assert cycle_cost.mx.array_equal(a.model.layers[0].mlp.up_proj.weight, b.model.layers[0].mlp.up_proj.weight).item()


def test_zlab_reference_gives_its_layers_back():
    import pytest

    from dflash_tui.bench import cycle_cost, references

    if not references.zlab_available():
        pytest.skip("the dflash package is not installed")
    target, draft = cycle_cost.build("tiny", 2, cycle_cost.mx.float32)
    model, _ = cycle_cost.target_model("tiny", cycle_cost.mx.float32)
    layers = list(model.model.layers)
    zd = references.zlab_draft(draft.config, cycle_cost.mx.float32)
    ms = references.zlab_cycle_ms(model, zd, references.tokenizer_for(), list(range(5, 25)), 4, 6)
    assert ms > 0
    assert all(x is y for x, y in zip(model.model.layers, layers)) and "_hidden_states" not in model


def test_draft_widths_are_measured_side_by_side_on_quantized_copies(capsys):
    import json

    import mlx.core as mx
    import mlx.nn as nn

    from dflash_tui.bench import cycle_cost

    target, draft = cycle_cost.build("tiny", 2, mx.float32)
    drafts = cycle_cost.quantized_drafts(draft, [0, 4, 8])
    assert drafts[0] is draft and not any(isinstance(m, nn.QuantizedLinear) for _, m in draft.named_modules())
    for bits in (4, 8):
        quantized = [m for _, m in drafts[bits].named_modules() if isinstance(m, nn.QuantizedLinear)]
        assert quantized and all(m.bits == bits for m in quantized)
    assert cycle_cost.main(["--shape", "tiny", "--prompt", "12", "--block-size", "4", "--tokens", "6",
                            "--draft-quant", "0", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sorted(r["draft_quant"] for r in rows) == [0, 8]
