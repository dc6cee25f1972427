"""Benchmark (not a test): the cost of one DFlash cycle in baseline decode steps.

Random-weight pairs shaped like real models, built in memory. With a random
draft almost nothing is accepted, so cycle time / single-token step time is the
price of one whole cycle (draft + verify + rollback + host); at a published
acceptance of tau tokens per cycle the speedup is about tau / that price.
Both are measured in one run, on the same cache lengths, growing as in real
decoding (every verify sees a new cache length).

    python -m dflash_tui.bench.cycle_cost --shape qwen3-4b --block-size 16
    python -m dflash_tui.bench.cycle_cost --shape tiny        # CPU smoke run
    python -m dflash_tui.bench.cycle_cost --shape qwen3-4b --setups engine mlx-ops --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import mlx.core as mx

from dflash_tui import random_pair as rp
from dflash_tui.engine.baseline import baseline_cycles
from dflash_tui.engine.cuda_kernels import kernels_wanted
from dflash_tui.engine.draft import DFlashDraft, default_attention_mode
from dflash_tui.engine.speculative import dflash_cycles, draft_proposals, lazy_draft_wanted
from dflash_tui.engine.state import DecodeState
from dflash_tui.engine.target import Target

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-4b": dict(kind="qwen3", vocab=151936, dims=dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                                                            intermediate=9728, tie=True), ids=[1, 9, 17, 25, 33]),
    "qwen3.5-4b": dict(kind="qwen3_5", vocab=248320, dims=dict(hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256,
                                                                intermediate=9216, linear_k_heads=16, linear_v_heads=32,
                                                                linear_head_dim=128, tie=True), ids=[1, 8, 15, 22, 29]),
    "tiny": dict(kind="qwen3", vocab=384, dims=dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                                                    tie=False), ids=[0, 1, 2]),
    "tiny-hybrid": dict(kind="qwen3_5", vocab=384, dims=dict(hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16,
                                                            intermediate=128, linear_k_heads=2, linear_v_heads=4,
                                                            linear_head_dim=16, tie=False), ids=[1, 3, 5]),
}


def build(shape: str, draft_layers: int, dtype: mx.Dtype) -> tuple[Target, DFlashDraft]:
    spec = SHAPES[shape]
    maker = rp.qwen3_config if spec["kind"] == "qwen3" else rp.qwen3_5_config
    config = maker(spec["vocab"], **spec["dims"])
    model = rp.build_model(config, seed=0, dtype=dtype)
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


def measure(target: Target, draft: DFlashDraft, block: int, prompt_len: int, tokens: int) -> dict[str, Any]:
    prompt = (mx.random.randint(0, target.vocab_size - 2, (prompt_len,)).tolist())

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
        "step_ms": step_ms,
        "cycle_ms": cycle_ms,
        "steps_per_cycle": cycle_ms / step_ms,
        "draft_ms": statistics.median(c.draft_ms for _, c in body),
        "verify_ms": statistics.median(c.verify_ms for _, c in body),
        "rollback_ms": statistics.median(c.rollback_ms for _, c in body),
        "tokens_per_cycle": produced / len(cycles),
        "speedup_at_tau_6.5": 6.5 / (cycle_ms / step_ms),
    }


# Engine setups to compare side by side (--setups): "engine" is whatever the engine chooses on
# this device; "mlx-ops" is the engine with its CUDA kernels off (DFLASH_TUI_KERNELS=0): MLX's
# own fused attention and mlx-lm's Gated DeltaNet ops, as a plain mlx-lm forward runs them.
SETUPS: dict[str, dict[str, str]] = {
    "engine": {},
    "mlx-ops": {"DFLASH_TUI_KERNELS": "0"},
}


def apply_setup(target: Target, draft: DFlashDraft, name: str, defaults: dict[str, str]) -> dict[str, Any]:
    """Switch the pair to a setup (`defaults`: the environment at start, the engine's own choice)."""
    for key, value in {**defaults, **SETUPS[name]}.items():
        os.environ[key] = value
    mode = default_attention_mode()
    target.use_attention(mode)
    draft.set_attention_mode(mode)
    return {"setup": name, "attention": target.attention_mode, "flush_every": target.flush_every,
            "kernels": kernels_wanted(), "lazy_draft": lazy_draft_wanted()}


def _measure_setups(target: Target, draft: DFlashDraft, args: argparse.Namespace, defaults: dict[str, Any]) -> list:
    rows: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for name in args.setups or [None]:
            setup = apply_setup(target, draft, name, defaults) if name else {}
            for b in args.block_size:
                rows.append({**setup, **measure(target, draft, b, args.prompt, args.tokens)})
                if not args.json:
                    r = rows[-1]
                    print(f"{r.get('setup', '')} block {r['block_size']:>2}: step {r['step_ms']:.2f} ms, "
                          f"cycle {r['cycle_ms']:.2f} ms = {r['steps_per_cycle']:.2f} steps/cycle (draft "
                          f"{r['draft_ms']:.2f}, verify {r['verify_ms']:.2f}, rollback {r['rollback_ms']:.2f} ms)",
                          flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--block-size", type=int, nargs="+", default=[16])
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--prompt", type=int, default=128, help="prompt length in tokens")
    p.add_argument("--tokens", type=int, default=96, help="tokens to decode per measurement")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=None,
                   help="compare these engine setups, alternating run by run")
    p.add_argument("--repeat", type=int, default=1, help="measurements per block size (and setup)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    target, draft = build(args.shape, args.draft_layers, getattr(mx, args.dtype))
    defaults = {"DFLASH_TUI_KERNELS": os.environ.get("DFLASH_TUI_KERNELS", "")}
    info = {"device": str(mx.default_device()), "shape": args.shape, "mlx": mx.__version__,
            "attention": target.attention_mode, "flush_every": target.flush_every,
            "kernels": kernels_wanted(), "lazy_draft": lazy_draft_wanted()}
    try:
        info["device_name"] = mx.device_info().get("device_name")
    except Exception:
        pass
    rows = []
    saved_env = {"DFLASH_TUI_KERNELS": os.environ.get("DFLASH_TUI_KERNELS")}
    try:
        rows = _measure_setups(target, draft, args, defaults)
    finally:  # setups switch process-wide variables: give them back (callers may run on)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    summary = {}
    for r in rows:
        summary.setdefault(f"{r.get('setup', 'run')} b{r['block_size']}", []).append(r["steps_per_cycle"])
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
