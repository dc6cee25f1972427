"""Benchmark (not a test): two or more engine setups in one decode, cycle against cycle.

`cycle_cost` measures each setup in a decode of its own, and on MLX CUDA a process's
cycles move by up to a third from one decode to the next (docs/gpu-cycle.md), which hides
a difference of a few percent. Here one decode of a random-weight real-shape pair takes
the setups in turn, cycle by cycle: a round is one cycle of each setup, the order reversed
every other round (so no setup always follows another), the setup switched between cycles,
outside the timed part. Adjacent cycles see the same cache length (within a round's few
tokens), the same clocks and the same allocator, so the ratio of a setup's cycle to the
first setup's in the same round is a paired measurement. Reported per setup: the median
cycle and verify, and the median of those per-round ratios with a bootstrap 95% interval.

    python -m dflash_tui.bench.paired_cycles --shape qwen3-4b --prompt 128 --setups engine step-rows
    python -m dflash_tui.bench.paired_cycles --shape tiny --rounds 4     # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.cycle_cost import SETUPS, SHAPES, apply_setup, build, random_prompt, setups_environment
from dflash_tui.engine.speculative import dflash_cycles, draft_proposals
from dflash_tui.engine.state import DecodeState

WARMUP_ROUNDS = 2  # rounds left out: the first cycles of each setup build its kernels


def round_order(setups: list[str], round_index: int) -> list[str]:
    """The setups in the order a round runs them: as given, reversed every other round."""
    return list(setups) if round_index % 2 == 0 else list(reversed(setups))


def bootstrap_median(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% interval of the median of `values` (percentile bootstrap)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def paired_decode(target: Any, draft: Any, setups: list[str], block: int, prompt: list[int], rounds: int,
                  defaults: dict[str, str]) -> list[dict[str, Any]]:
    """One decode of `rounds` rounds (plus the warm-up); each cycle's setup, position and times."""
    state = DecodeState(target, draft)
    logits, _ = state.prefill(prompt)
    order = [name for r in range(rounds + WARMUP_ROUNDS) for name in round_order(setups, r)]
    apply_setup(target, draft, order[0], defaults)
    records: list[dict[str, Any]] = []
    tic = time.perf_counter()
    # a full block every cycle until the last (`remaining` counts tokens, and would shrink the last blocks)
    for cyc in dflash_cycles(state, int(logits.argmax().item()), block, lambda: block if len(records) < len(order) else 0,
                             propose=draft_proposals):
        ms = (time.perf_counter() - tic) * 1e3
        i = len(records)
        records.append({"setup": order[i], "round": i // len(setups) - WARMUP_ROUNDS, "cycle_ms": ms,
                        "verify_ms": cyc.verify_ms, "draft_ms": cyc.draft_ms, "emitted": list(cyc.emitted),
                        "step_rows": target.step_rows, "flush_every": target.flush_every})
        if i + 1 < len(order) and order[i + 1] != order[i]:
            apply_setup(target, draft, order[i + 1], defaults)  # between cycles, outside the timed part
        tic = time.perf_counter()
    return records


def summarize(records: list[dict[str, Any]], setups: list[str]) -> list[dict[str, Any]]:
    """Per setup: median cycle and verify over the measured rounds, and the median of the
    per-round ratios to the first setup's cycle with its bootstrap 95% interval."""
    measured = [r for r in records if r["round"] >= 0]
    by_round: dict[int, dict[str, float]] = {}
    for r in measured:
        by_round.setdefault(r["round"], {})[r["setup"]] = r["cycle_ms"]
    complete = [c for c in by_round.values() if len(c) == len(setups)]
    rows = []
    for name in setups:
        mine = [r for r in measured if r["setup"] == name]
        row: dict[str, Any] = {"setup": name, "cycles": len(mine),
                               "cycle_ms": statistics.median(r["cycle_ms"] for r in mine),
                               "verify_ms": statistics.median(r["verify_ms"] for r in mine),
                               "draft_ms": statistics.median(r["draft_ms"] for r in mine)}
        if name != setups[0] and complete:
            ratios = [c[name] / c[setups[0]] for c in complete]
            low, high = bootstrap_median(ratios)
            row.update({"ratio_to": setups[0], "rounds": len(ratios), "ratio_median": statistics.median(ratios),
                        "ratio_low": low, "ratio_high": high})
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["tiny"])
    p.add_argument("--prompt", type=int, nargs="+", default=[128], help="prompt lengths (contexts) in tokens")
    p.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=["engine", "step-rows"],
                   help="the setups to alternate; ratios are to the first")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=40, help="measured rounds (one cycle of each setup a round)")
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    args = p.parse_args(argv)
    if len(set(args.setups)) < 2 or len(set(args.setups)) != len(args.setups):
        p.error("--setups: two or more different setups")
    require_at_least(p, args, {"prompt": 1, "rounds": 1, "block_size": 2, "draft_layers": 1})
    out: list[dict[str, Any]] = []
    with setups_environment() as defaults:
        for shape in args.shape:
            target, draft = build(shape, args.draft_layers, getattr(mx, args.dtype))
            for context in args.prompt:
                prompt = random_prompt(target.vocab_size, context)
                records = paired_decode(target, draft, args.setups, args.block_size, prompt, args.rounds, defaults)
                for row in summarize(records, args.setups):
                    row = {"shape": shape, "context": context, "block_size": args.block_size, **row}
                    out.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
            del target, draft
            mx.clear_cache()
    info = {"device": str(mx.default_device()), "mlx": mx.__version__}
    try:
        info["device_name"] = mx.device_info().get("device_name")
    except Exception:
        pass
    print(json.dumps({"info": info, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
