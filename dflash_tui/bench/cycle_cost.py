"""Benchmark (not a test): the cost of one DFlash cycle in baseline decode steps.

Random-weight pairs shaped like real models, built in memory. With a random
draft almost nothing is accepted, so cycle time / single-token step time is the
price of one whole cycle (draft + verify + rollback + host); at a published
acceptance of tau tokens per cycle the speedup is about tau / that price.
Both are measured in one run, on the same cache lengths, growing as in real
decoding (every verify sees a new cache length).

The price that matters to a user is in *vanilla* decode steps: `--vanilla` also
times `mlx_lm.stream_generate` on a separate, untouched instance of the target
(`price` = cycle / vanilla step; `target_alone_price` = the engine's own
target-only step / vanilla step), and `--zlab` the `dflash` package's MLX
reference (`zlab_price`) where it is installed. Several shapes and contexts go
in one run; `-4bit` shapes quantize the target as `mlx_lm.convert -q` does
(4 bits, groups of 64) and keep the draft in bf16.

    python -m dflash_tui.bench.cycle_cost --shape qwen3-4b --block-size 16
    python -m dflash_tui.bench.cycle_cost --shape tiny        # CPU smoke run
    python -m dflash_tui.bench.cycle_cost --shape qwen3-4b --setups engine mlx-ops --repeat 3
    python -m dflash_tui.bench.cycle_cost --shape qwen3-4b qwen3.5-4b qwen3.5-9b qwen3-8b-4bit qwen3.5-9b-4bit \
        --prompt 128 4096 16384 --block-size 8 16 --vanilla --zlab --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any, Iterator

import mlx.core as mx

from dflash_tui import random_pair as rp
from dflash_tui.bench.arguments import require_at_least
from dflash_tui.engine.baseline import baseline_cycles
from dflash_tui.bench.references import tokenizer_for, vanilla_step_ms, zlab_available, zlab_cycle_ms, zlab_draft
from dflash_tui.engine import cuda_kernels
from dflash_tui.engine.cuda_kernels import kernels_wanted
from dflash_tui.engine.draft import DFlashDraft, default_attention_mode
from dflash_tui.engine.draft_quant import quantize_draft
from dflash_tui.engine.speculative import dflash_cycles, draft_proposals, lazy_draft_wanted
from dflash_tui.engine.state import DecodeState
from dflash_tui.engine import target as target_module
from dflash_tui.engine.target import Target

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-4b": dict(kind="qwen3", vocab=151936, dims=dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                                                            intermediate=9728, tie=True), ids=[1, 9, 17, 25, 33]),
    "qwen3.5-4b": dict(kind="qwen3_5", vocab=248320, dims=dict(hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256,
                                                                intermediate=9216, linear_k_heads=16, linear_v_heads=32,
                                                                linear_head_dim=128, tie=True), ids=[1, 8, 15, 22, 29]),
    "qwen3.5-9b": dict(kind="qwen3_5", vocab=248320, dims=dict(hidden=4096, layers=32, heads=16, kv_heads=4, head_dim=256,
                                                                intermediate=12288, linear_k_heads=16, linear_v_heads=32,
                                                                linear_head_dim=128, tie=False), ids=[1, 8, 15, 22, 29]),
    "qwen3-8b": dict(kind="qwen3", vocab=151936, dims=dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                                                            intermediate=12288, tie=False), ids=[1, 9, 17, 25, 33]),
    "tiny": dict(kind="qwen3", vocab=384, dims=dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                                                    tie=False), ids=[0, 1, 2]),
    "tiny-hybrid": dict(kind="qwen3_5", vocab=384, dims=dict(hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16,
                                                            intermediate=128, linear_k_heads=2, linear_v_heads=4,
                                                            linear_head_dim=16, tie=False), ids=[1, 3, 5]),
}
QUANTIZED = {"-4bit": 4}  # a shape name with this suffix: its target quantized to these bits
SHAPES.update({f"{name}{suffix}": dict(spec, bits=bits) for suffix, bits in QUANTIZED.items()
               for name, spec in list(SHAPES.items()) if name in ("qwen3-8b", "qwen3.5-9b", "tiny")})


def target_model(shape: str, dtype: mx.Dtype) -> tuple[Any, dict[str, Any]]:
    """The shape's target (an mlx-lm model, random weights, seed 0; quantized for `-4bit`
    shapes) and its config. Two calls give two equal, separate instances."""
    spec = SHAPES[shape]
    maker = rp.qwen3_config if spec["kind"] == "qwen3" else rp.qwen3_5_config
    config = maker(spec["vocab"], **spec["dims"])
    model = rp.build_model(config, seed=0, dtype=dtype)
    if spec.get("bits"):
        from mlx_lm.utils import quantize_model

        with contextlib.redirect_stdout(sys.stderr):  # its note on bits per weight: keep stdout JSON
            model, _ = quantize_model(model, config, group_size=64, bits=spec["bits"])
        mx.eval(model.parameters())
    return model, config


def build(shape: str, draft_layers: int, dtype: mx.Dtype) -> tuple[Target, DFlashDraft]:
    spec = SHAPES[shape]
    model, config = target_model(shape, dtype)
    target = Target(model, tokenizer=None, name=shape)
    if target.is_hybrid:
        from dflash_tui.engine.hybrid import HybridTarget

        target = HybridTarget(model, tokenizer=None, name=shape)
    dcfg = rp.draft_config_for(config, mask_token_id=spec["vocab"] - 1, layers=draft_layers, target_layer_ids=spec["ids"])
    mx.random.seed(1)
    draft = DFlashDraft(dcfg)
    draft.set_dtype(dtype)
    mx.eval(draft.parameters())
    target.set_capture(dcfg.target_layer_ids)
    return target, draft


def measure(target: Target, draft: DFlashDraft, block: int, prompt: "int | list[int]", tokens: int) -> dict[str, Any]:
    if isinstance(prompt, int):
        prompt = random_prompt(target.vocab_size, prompt)

    def fresh() -> tuple[DecodeState, int]:
        state = DecodeState(target, draft)
        logits, _ = state.prefill(prompt)
        return state, int(logits.argmax().item())

    # the baseline: target-only steps over the same cache lengths
    state, first = fresh()
    produced = 0
    steps = []
    for cyc in baseline_cycles(state, first, lambda: tokens - produced):
        produced += 1
        steps.append(cyc.verify_ms)
    step_ms = statistics.median(steps[3:] or steps)

    state, first = fresh()
    produced = 0
    cycles = []
    tic = time.perf_counter()
    for cyc in dflash_cycles(state, first, block, lambda: tokens - produced, propose=draft_proposals):
        now = time.perf_counter()
        produced += len(cyc.emitted)
        cycles.append(((now - tic) * 1e3, cyc))
        tic = now
    body = cycles[3:] or cycles
    cycle_ms = statistics.median(ms for ms, _ in body)
    return {
        "block_size": block,
        "context": len(prompt),
        "step_ms": step_ms,
        "cycle_ms": cycle_ms,
        "steps_per_cycle": cycle_ms / step_ms,
        "draft_ms": statistics.median(c.draft_ms for _, c in body),
        "verify_ms": statistics.median(c.verify_ms for _, c in body),
        "rollback_ms": statistics.median(c.rollback_ms for _, c in body),
        "tokens_per_cycle": produced / len(cycles),
        "speedup_at_tau_6.5": 6.5 / (cycle_ms / step_ms),
    }


def random_prompt(vocab: int, length: int) -> list[int]:
    return mx.random.randint(0, vocab - 2, (length,)).tolist()


# Engine setups to compare side by side (--setups): "engine" is whatever the engine chooses on
# this device; "step-rows" the same with each verify row computed as the decode step at its
# position (engine/step_rows.py; MLX CUDA only, elsewhere it is "engine"); "mlx-ops" is the
# engine with its CUDA kernels off (DFLASH_TUI_KERNELS=0): MLX's own fused attention and
# mlx-lm's Gated DeltaNet ops, as a plain mlx-lm forward runs them; "no-flush" and "six-groups"
# the engine with its forwards launched whole, or in six layer groups instead of two, where it
# launches them in groups at all (a GPU: `Target.flush_every`).
SETUPS: dict[str, dict[str, str]] = {
    "engine": {},
    "step-rows": {},
    "no-flush": {},
    "six-groups": {},
    "mlx-ops": {"DFLASH_TUI_KERNELS": "0"},
}


@contextlib.contextmanager
def setups_environment() -> Iterator[dict[str, str]]:
    """The variables the setups switch, as found (the engine's own choice: `apply_setup`'s
    defaults); on leaving, given back as they were (callers may run on)."""
    saved = {key: os.environ.get(key) for setup in SETUPS.values() for key in setup}
    try:
        yield {key: value or "" for key, value in saved.items()}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def regroup(target: Target, every: int) -> None:
    """Launch the target's forwards every `every` layers (0: whole); the launch points are hooked
    with the capture, so it is set again."""
    target.flush_every = every
    target.set_capture(target.capture_ids)


def apply_setup(target: Target, draft: DFlashDraft, name: str, defaults: dict[str, str]) -> dict[str, Any]:
    """Switch the pair to a setup (`defaults`: the environment at start, the engine's own choice)."""
    for key, value in {**defaults, **SETUPS[name]}.items():
        os.environ[key] = value
    mode = default_attention_mode()
    target.use_attention(mode)
    target.use_step_rows(name == "step-rows")
    default = target_module.default_flush_every(len(target.layers))  # 0 where forwards launch whole anyway (the CPU)
    regroup(target, {"no-flush": 0, "six-groups": -(-len(target.layers) // 6)}.get(name, default) if default else 0)
    draft.set_attention_mode(mode)
    return {"setup": name, "attention": target.attention_mode, "flush_every": target.flush_every,
            "kernels": kernels_wanted(), "lazy_draft": lazy_draft_wanted(), "step_rows": target.step_rows}


def _print_row(r: dict[str, Any]) -> None:
    price = f", {r['price']:.2f} vanilla steps" if "price" in r else ""
    zlab = f", z-lab {r['zlab_price']:.2f}" if r.get("zlab_price") else ""
    quant = f" draft {r['draft_quant']}-bit" if r.get("draft_quant") else ""
    print(f"{r['shape']} ctx {r['context']} {r.get('setup', '')}{quant} block {r['block_size']:>2}: step {r['step_ms']:.2f} ms, "
          f"cycle {r['cycle_ms']:.2f} ms = {r['steps_per_cycle']:.2f} steps/cycle{price}{zlab} (draft "
          f"{r['draft_ms']:.2f}, verify {r['verify_ms']:.2f}, rollback {r['rollback_ms']:.2f} ms)", flush=True)


def quantized_drafts(draft: DFlashDraft, widths: list[int]) -> dict[int, DFlashDraft]:
    """The draft as built (0) and copies of it with linear layers quantized to each width."""
    drafts = {}
    for bits in widths:
        if bits == 0:
            drafts[0] = draft
            continue
        copy = DFlashDraft(draft.config)
        copy.update(draft.parameters())
        quantize_draft(copy, bits)
        mx.eval(copy.parameters())
        drafts[bits] = copy
    return drafts


def _measure_context(target: Target, drafts: dict[int, DFlashDraft], refs: dict[str, Any], args: argparse.Namespace,
                     defaults: dict[str, Any], shape: str, context: int) -> list[dict[str, Any]]:
    """Every setup and block size at one context length, with the references on the same prompt."""
    prompt = random_prompt(target.vocab_size, context)
    common: dict[str, Any] = {"shape": shape}
    if "vanilla" in refs:
        common["vanilla_step_ms"] = vanilla_step_ms(refs["vanilla"], refs["tokenizer"], prompt, args.tokens)
    rows: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for name, (bits, draft) in ((n, d) for n in args.setups or [None] for d in drafts.items()):
            setup = apply_setup(target, draft, name, defaults) if name else {}
            for b in args.block_size:
                row = {**common, **setup, "draft_quant": bits, **measure(target, draft, b, prompt, args.tokens)}
                if "vanilla_step_ms" in row:
                    row["price"] = row["cycle_ms"] / row["vanilla_step_ms"]
                    row["target_alone_price"] = row["step_ms"] / row["vanilla_step_ms"]
                rows.append(row)
    if "zlab_draft" in refs:
        for b in args.block_size:
            try:
                ms = zlab_cycle_ms(refs["vanilla"], refs["zlab_draft"], refs["tokenizer"], prompt, b, args.zlab_tokens)
            except Exception as exc:  # the reference may not take a shape: say so in its row
                for r in rows:
                    r.setdefault("zlab_error", f"{type(exc).__name__}: {exc}"[:200])
                break
            for r in rows:
                if r["block_size"] == b and r["draft_quant"] == 0:
                    r["zlab_cycle_ms"] = ms
                    r["zlab_price"] = ms / r["vanilla_step_ms"]
    for r in rows:
        if args.json:  # progress, one row a line (a run cut short keeps what it measured)
            print(json.dumps(r), file=sys.stderr, flush=True)
        else:
            _print_row(r)
    return rows


def _measure_shape(shape: str, args: argparse.Namespace, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    dtype = getattr(mx, args.dtype)
    target, draft = build(shape, args.draft_layers, dtype)
    refs: dict[str, Any] = {}
    if args.vanilla or args.zlab:
        refs["vanilla"], _ = target_model(shape, dtype)
        refs["tokenizer"] = tokenizer_for()
    if args.zlab and zlab_available():
        refs["zlab_draft"] = zlab_draft(draft.config, dtype)
    drafts = quantized_drafts(draft, args.draft_quant)
    rows = []
    for context in args.prompt:
        rows += _measure_context(target, drafts, refs, args, defaults, shape, context)
    del target, draft, drafts, refs
    mx.clear_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["tiny"])
    p.add_argument("--block-size", type=int, nargs="+", default=[16])
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--prompt", type=int, nargs="+", default=[128], help="prompt lengths (contexts) in tokens")
    p.add_argument("--tokens", type=int, default=96, help="tokens to decode per measurement")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=None,
                   help="compare these engine setups, alternating run by run")
    p.add_argument("--repeat", type=int, default=1, help="measurements per block size (and setup)")
    p.add_argument("--vanilla", action="store_true", help="also time mlx_lm.stream_generate (price in its steps)")
    p.add_argument("--zlab", action="store_true", help="also time the dflash package's MLX reference, if installed")
    p.add_argument("--zlab-tokens", type=int, default=24, help="tokens the reference decodes per measurement")
    p.add_argument("--draft-quant", type=int, nargs="+", choices=[0, 4, 8], default=[0],
                   help="draft widths to measure side by side (0: as built, bf16)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    # a cycle drafts at least one token (block 2) and a prompt has at least one
    require_at_least(p, args, {"prompt": 1, "tokens": 1, "block_size": 2, "repeat": 1, "draft_layers": 1,
                               "zlab_tokens": 1})
    info = {"device": str(mx.default_device()), "shapes": args.shape, "mlx": mx.__version__,
            "kernels": kernels_wanted(), "lazy_draft": lazy_draft_wanted(), "zlab_installed": zlab_available(),
            "split_from_keys": getattr(cuda_kernels, "SPLIT_FROM_KEYS", None)}
    try:
        info["device_name"] = mx.device_info().get("device_name")
    except Exception:
        pass
    rows: list[dict[str, Any]] = []
    with setups_environment() as defaults:
        for shape in args.shape:
            rows += _measure_shape(shape, args, defaults)
    summary: dict[str, Any] = {}
    for r in rows:
        key = f"{r['shape']} ctx{r['context']} {r.get('setup', 'run')} b{r['block_size']}"
        summary.setdefault(key, []).append(r["steps_per_cycle"])
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} for k, v in summary.items()}
    if args.json:
        print(json.dumps({"info": info, "rows": rows, "steps_per_cycle": summary}, indent=2))
    else:
        print(info)
        for k, v in summary.items():
            print(f"{k}: {v['median']:.2f} steps/cycle median ({v['min']:.2f}-{v['max']:.2f}, n={v['n']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
