"""Benchmark (not a test): what a verify forward costs in each attention mode, in baseline steps.

For one random-weight shape (cycle_cost's shapes), per attention mode (fused,
plain, folded, bucketed, bucketed-compiled; see engine/draft.py):

- a verify forward of `--block` tokens at a fixed cache length (the same shapes
  every call), and at a few other widths (`--widths`) over the same cache;
- verify forwards over a growing cache, as in a real loop (each keeps
  `--advance` tokens, so every call sees a new cache length), with the
  first-call and worst-call times (new shapes, new kernels);
- one whole DFlash cycle (draft + verify + rollback, random draft).

All are divided by a baseline single-token decode step measured in the same
run. If fixed ≈ growing, the verify's cost does not come from new shapes.

    python -m dflash_tui.bench.verify_shapes --shape qwen3-4b
    python -m dflash_tui.bench.verify_shapes --shape tiny          # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from dflash_tui.bench.cycle_cost import SHAPES, build
from dflash_tui.engine import gdn_tape
from dflash_tui.engine.draft import ATTENTION_MODES, DFlashDraft
from dflash_tui.engine.speculative import dflash_cycles, draft_proposals
from dflash_tui.engine.state import DecodeState
from dflash_tui.engine.target import Target


def _timed(fn) -> float:
    tic = time.perf_counter()
    fn()
    return (time.perf_counter() - tic) * 1e3


def _tokens(target: Target, n: int) -> mx.array:
    return mx.random.randint(0, target.vocab_size - 2, (1, n))


def _prefilled(target: Target, draft: DFlashDraft, prompt: list[int]) -> DecodeState:
    state = DecodeState(target, draft)
    state.prefill(prompt)
    return state


def baseline_step_ms(target: Target, draft: DFlashDraft, prompt: list[int], steps: int) -> float:
    """Median single-token decode step (target only, cache growing by one), as baseline_cycles runs it."""
    state = _prefilled(target, draft, prompt)
    token = mx.array([[prompt[-1]]])
    times = []
    for _ in range(steps):

        def step():
            nonlocal token
            logits, _ = target.forward(token, state.target_cache)
            token = logits[:, -1].argmax(axis=-1, keepdims=True)
            mx.eval(token)

        times.append(_timed(step))
    return statistics.median(times[3:] or times)


def fixed_verify(target: Target, state: DecodeState, width: int, reps: int) -> list[float]:
    """Verify forwards of `width` tokens, each undone afterwards: every call sees the same cache length."""
    cache = state.target_cache
    times = []
    for _ in range(reps):
        tokens = _tokens(target, width)
        mx.eval(tokens)
        saved = [list(c.cache) if isinstance(c, ArraysCache) else None for c in cache]
        target.begin_verify(cache)

        def verify():
            logits, feats = target.forward(tokens, cache)
            mx.eval(logits.argmax(axis=-1), feats)

        times.append(_timed(verify))
        for c, s in zip(cache, saved):
            if s is None:
                c.trim(width)
            else:
                gdn_tape.disarm(c)
                c.cache = s
        if hasattr(cache, "length"):
            cache.length -= width
    return times


def growing_verify(target: Target, state: DecodeState, width: int, advance: int, reps: int) -> list[float]:
    """Verify forwards that keep `advance` tokens each, as the loop does: a new cache length every call."""
    cache = state.target_cache
    times = []
    for _ in range(reps):
        tokens = _tokens(target, width)
        mx.eval(tokens)
        target.begin_verify(cache)

        def verify():
            logits, feats = target.forward(tokens, cache)
            mx.eval(logits.argmax(axis=-1), feats)

        times.append(_timed(verify))
        target.rollback(cache, min(advance, width), width)
        mx.eval([c.state for c in cache])
    return times


def whole_cycles(target: Target, draft: DFlashDraft, prompt: list[int], block: int, cycles: int) -> dict[str, float]:
    """`cycles` DFlash cycles, all of width `block` (no short tail block: no extra shapes)."""
    state = DecodeState(target, draft)
    logits, _ = state.prefill(prompt)
    first = int(logits.argmax().item())
    rows = []
    tic = time.perf_counter()
    for cyc in dflash_cycles(state, first, block, lambda: 1 << 30, propose=draft_proposals):
        now = time.perf_counter()
        rows.append(((now - tic) * 1e3, cyc))
        if len(rows) >= cycles:
            break
        tic = now
    body = rows[3:] or rows
    return {
        "cycle_ms": statistics.median(ms for ms, _ in body),
        "draft_ms": statistics.median(c.draft_ms for _, c in body),
        "verify_ms": statistics.median(c.verify_ms for _, c in body),
        "cycles": len(rows),
    }


def measure_mode(target: Target, draft: DFlashDraft, mode: str, prompt: list[int], args: argparse.Namespace,
                 step_ms: float) -> dict[str, Any]:
    target.use_attention(mode)
    draft.set_attention_mode(mode)
    mx.clear_cache()
    state = _prefilled(target, draft, prompt)  # caches made in this mode
    warm = 2
    fixed = fixed_verify(target, state, args.block, warm + args.reps)
    widths = {}
    for w in args.widths:
        if w != args.block:
            t = fixed_verify(target, state, w, warm + max(4, args.reps // 2))
            widths[w] = statistics.median(t[warm:])
    widths[args.block] = statistics.median(fixed[warm:])
    growing = growing_verify(target, state, args.block, args.advance, args.reps)
    row: dict[str, Any] = {
        "mode": mode,
        "fixed_first_ms": fixed[0],
        "fixed_ms": statistics.median(fixed[warm:]),
        "widths_ms": dict(sorted(widths.items())),
        "growing_ms": statistics.median(growing[1:] or growing),
        "growing_first_ms": growing[0],
        "growing_max_ms": max(growing[1:] or growing),
        "cache_len_end": len(prompt) + args.advance * args.reps,
    }
    if args.cycles > 0:
        row.update(whole_cycles(target, draft, prompt, args.block, args.cycles))
    row.update({k.replace("_ms", "_steps"): v / step_ms for k, v in list(row.items())
                if k.endswith("_ms") and isinstance(v, float)})
    row["peak_memory_gb"] = mx.get_peak_memory() / 1e9
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--modes", nargs="+", choices=ATTENTION_MODES, default=list(ATTENTION_MODES))
    p.add_argument("--block", type=int, default=16, help="verify width (block size)")
    p.add_argument("--widths", type=int, nargs="*", default=[1, 2, 8], help="other widths at the fixed cache length")
    p.add_argument("--prompt", type=int, default=128, help="prompt length in tokens (the starting cache length)")
    p.add_argument("--reps", type=int, default=20, help="timed verify forwards per measurement")
    p.add_argument("--advance", type=int, default=7, help="tokens each growing verify keeps (about tau)")
    p.add_argument("--steps", type=int, default=24, help="baseline single-token steps")
    p.add_argument("--cycles", type=int, default=40, help="DFlash cycles for the whole-cycle figure (0: skip)")
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    tic = time.perf_counter()
    target, draft = build(args.shape, args.draft_layers, getattr(mx, args.dtype))
    mx.random.seed(2)
    prompt = mx.random.randint(0, target.vocab_size - 2, (args.prompt,)).tolist()
    info: dict[str, Any] = {"device": str(mx.default_device()), "shape": args.shape, "mlx": mx.__version__,
                            "build_s": round(time.perf_counter() - tic, 1)}
    try:
        info["device_name"] = mx.device_info().get("device_name")
    except Exception:
        pass
    target.use_attention("fused")  # single-token steps run the fused kernel in every mode
    step_ms = baseline_step_ms(target, draft, prompt, args.steps)
    info["step_ms"] = step_ms
    if not args.json:
        print(info, flush=True)
    rows = []
    for mode in args.modes:
        row = measure_mode(target, draft, mode, prompt, args, step_ms)
        rows.append(row)
        if not args.json:
            print(_line(row, args), flush=True)
    info["total_s"] = round(time.perf_counter() - tic, 1)
    if args.json:
        print(json.dumps({"info": info, "rows": rows}, indent=2))
    else:
        print(f"step {step_ms:.2f} ms; total {info['total_s']} s. x = baseline single-token steps.")
    return 0


def _line(r: dict[str, Any], args: argparse.Namespace) -> str:
    widths = " ".join(f"{w}:{ms:.1f}" for w, ms in r["widths_ms"].items())
    out = (f"{r['mode']:>17}: verify{args.block} fixed {r['fixed_ms']:.2f} ms ({r['fixed_steps']:.2f}x, first "
           f"{r['fixed_first_ms']:.0f}), growing {r['growing_ms']:.2f} ms ({r['growing_steps']:.2f}x, first "
           f"{r['growing_first_ms']:.0f}, max {r['growing_max_ms']:.0f}); widths ms {widths}")
    if "cycle_ms" in r:
        out += (f"; cycle {r['cycle_ms']:.2f} ms = {r['cycle_steps']:.2f} steps (draft {r['draft_ms']:.2f}, "
                f"verify {r['verify_ms']:.2f})")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
