"""Benchmark (not a test): every kernel a forward launches and its own device time, under Nsight Compute.

`cycle_profile` times whole forwards from the host; it cannot tell how much of a
forward the device is busy. This tool runs one of each forward of a cycle (and a
vanilla decode step) on a random-weight real-shape pair, each opened by a marker
kernel inside a profiler range, so that Nsight Compute times every kernel of each
alone; `--read` turns its CSV into one row per forward: kernels launched, their
summed device time, and the kernels that take the most. The sum of a forward's
kernels is its device time without the host: set beside `cycle_cost`'s wall times,
it says how much of a cycle is the device's and how much the host's, and what a
cycle would cost if the host were hidden entirely (`device_price`: draft plus
verify over the step).

Nsight Compute runs each kernel alone, so a kernel of a few microseconds reads a
little longer than inside a CUDA graph; compare forwards with each other.

    ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw \\
        --metrics gpu__time_duration.sum \\
        python -m dflash_tui.bench.kernel_census --shape qwen3-4b --context 128 > census.csv
    python -m dflash_tui.bench.kernel_census --read census.csv
    python -m dflash_tui.bench.kernel_census --shape tiny      # CPU smoke run (no markers, no profiler)
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import io
import json
import os
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.cycle_cost import SHAPES
from dflash_tui.bench.cycle_profile import prepare, rewinder
from dflash_tui.engine.cuda_base import on_cuda
from dflash_tui.engine.speculative import draft_proposals
from dflash_tui.engine.state import DecodeState

MARK = "dflash_census_"  # a marker kernel's name: MARK + phase slug
WARMUP = 3  # runs of each forward before the profiled one (kernel builds, the allocator)


def slug(phase: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", phase).strip("_")


class _Profiler:
    """The CUDA driver's profiler range (what `ncu --profile-from-start off` waits for)."""

    def __init__(self) -> None:
        self._cuda = ctypes.CDLL("libcuda.so.1") if on_cuda() else None

    def start(self) -> None:
        if self._cuda is not None:
            self._cuda.cuProfilerStart()

    def stop(self) -> None:
        if self._cuda is not None:
            self._cuda.cuProfilerStop()


_marks: dict[str, Any] = {}


def mark(phase: str) -> None:
    """Launch the marker kernel of `phase` (CUDA only): the kernels after it, up to the next
    marker, are that phase's."""
    if not on_cuda():
        return
    name = MARK + slug(phase)
    if name not in _marks:
        _marks[name] = mx.fast.cuda_kernel(name=name, input_names=["a"], output_names=["b"], source="b[0] = a[0];")
    out = _marks[name](inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
                       output_dtypes=[mx.float32])
    mx.eval(out)


def phases(state: DecodeState, token: int, block: int) -> list[tuple[str, Callable[[], Any], Callable[[], None]]]:
    """(name, run, reset) for each forward: `run` builds it (lazy), `reset` puts the caches back."""
    target, cache = state.target, state.target_cache
    trim = rewinder(cache)

    one, many = mx.array([[token]]), mx.array([[token] * block])
    mx.eval(one, many)

    def verify(step_rows: bool) -> Callable[[], Any]:
        def run() -> Any:
            target.use_step_rows(step_rows)
            target.begin_verify(cache)
            return list(target.forward(many, cache))
        return run

    def undo_verify() -> None:  # as a decode's rollback after nothing accepted (hybrids replay their tape)
        target.rollback(cache, 0, block)

    feats = target.forward(one, cache)[1]
    mx.eval(feats)
    trim(1)()

    def drafted() -> Any:
        state.pending.append(feats)  # the features a verify leaves for the next draft
        return draft_proposals(state, token, block)

    undo_draft = lambda: None  # noqa: E731 (a draft's block K/V is not kept; its context grows, as in a decode)
    return [("mlx-lm step", lambda: target.model(one, cache=cache), trim(1)),
            (f"engine verify {block}", verify(False), undo_verify),
            (f"engine verify {block} step rows", verify(True), undo_verify),
            (f"draft {block}", drafted, undo_draft)]


def run_census(shape: str, context: int, block: int) -> list[str]:
    """Run every forward, the last time inside a profiler range after its marker; the phases run."""
    profiler = _Profiler()
    done = []
    for name, run, reset in phases(*prepare(shape, context), block):
        for _ in range(WARMUP):
            mx.eval(run())
            reset()
        mx.synchronize()
        profiler.start()
        mark(name)
        mx.eval(run())
        mx.synchronize()
        profiler.stop()
        reset()
        done.append(name)
    return done


# -- reading Nsight Compute's CSV ---------------------------------------------------------

_UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}


@dataclass
class Phase:
    name: str  # the marker's slug
    kernels: int = 0
    device_ms: float = 0.0
    by_kernel: Counter = field(default_factory=Counter)  # kernel name -> ms
    launches: Counter = field(default_factory=Counter)  # kernel name -> launches

    def row(self, top: int) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("by_kernel", "launches")}
        d["top"] = [{"kernel": k, "ms": ms, "launches": self.launches[k]} for k, ms in self.by_kernel.most_common(top)]
        return d


def short_name(kernel: str) -> str:
    """A kernel's name without its argument list (templates kept)."""
    depth, out = 0, []
    for ch in kernel:
        if ch == "(" and depth == 0 and out:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out).removeprefix("void ").strip()


def read_census(text: str) -> list[Phase]:
    """The phases of an `ncu --csv --page raw --metrics gpu__time_duration.sum` output: the
    kernels after each marker, up to the next (kernels before the first marker are left out)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no Nsight Compute CSV table in the input (was it run with --csv --page raw?)")
    table = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    if not table or "gpu__time_duration.sum" not in table[0]:
        raise ValueError("the CSV has no gpu__time_duration.sum column (run ncu with --metrics gpu__time_duration.sum)")
    unit_row = table[0] if not table[0]["ID"].strip().isdigit() else None
    unit = (unit_row or {}).get("gpu__time_duration.sum", "ns").strip() or "ns"
    if unit not in _UNITS:
        raise ValueError(f"unknown time unit {unit!r} in the CSV")
    scale = _UNITS[unit]
    found: list[Phase] = []
    for r in table:
        if not r["ID"].strip().isdigit():
            continue
        name = r["Kernel Name"]
        if MARK in name:
            found.append(Phase(re.split(r"[^A-Za-z0-9_]", name.split(MARK, 1)[1])[0]))
            continue
        if not found:
            continue
        ms = float(r["gpu__time_duration.sum"].replace(",", "")) * scale
        p, k = found[-1], short_name(name)
        p.kernels += 1
        p.device_ms += ms
        p.by_kernel[k] += ms
        p.launches[k] += 1
    if not found:
        raise ValueError("no marker kernels in the CSV: was it made by kernel_census under ncu --profile-from-start off?")
    return found


def device_price(found: list[Phase], block: int) -> Optional[float]:
    """(draft + batched verify) / step in device time: the cycle's price with the host hidden."""
    ms = {p.name: p.device_ms for p in found}
    step, verify, draft = ms.get("mlx_lm_step"), ms.get(f"engine_verify_{block}"), ms.get(f"draft_{block}")
    return (verify + draft) / step if step and verify is not None and draft is not None else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--read", metavar="CSV", help="read an ncu CSV of a census instead of running one")
    p.add_argument("--top", type=int, default=8, help="kernels listed per forward (with --read)")
    args = p.parse_args(argv)
    require_at_least(p, args, {"context": 1, "block_size": 2, "top": 1})
    if args.read:
        try:
            if not os.path.isfile(args.read):  # a directory, a FIFO or a device would never give a table
                raise OSError(f"{args.read}: not a regular file")
            with open(args.read, encoding="utf-8", errors="replace") as f:
                found = read_census(f.read())
        except (OSError, ValueError) as exc:
            print(f"kernel_census: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({"phases": [ph.row(args.top) for ph in found],
                          "device_price": device_price(found, args.block_size)}, indent=1))
        return 0
    if not 2 <= args.block_size <= 16 or args.context < 1:
        p.error("--block-size must be 2..16 and --context at least 1")
    done = run_census(args.shape, args.context, args.block_size)
    # stderr: under ncu --csv the table is stdout
    print(json.dumps({"shape": args.shape, "context": args.context, "phases": done, "device": str(mx.default_device()),
                      "markers": on_cuda()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
