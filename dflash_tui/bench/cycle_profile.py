"""Benchmark (not a test): where a cycle's time goes, Python against the device.

For one random-weight real-shape target at one context, each forward variant is
timed as `build` (Python building the lazy graph, up to the evaluation call) and
`total` (until the result is on the host), median over `--reps` runs, every run
on the same cache length (the cache is trimmed back after each):

- `mlx-lm step`: the bare mlx-lm model on one token (what `stream_generate` runs);
- `engine step`: the engine's `Target.forward` on one token (capture hooks armed);
- `mlx-lm verify L`: the bare model on L tokens; `engine verify L`: `Target.forward`
  on L tokens, with and without its mid-forward evaluation (`flush_every`), and the
  same with step rows (every row computed as the decode step at its position);
- `engine verify L six groups`: where the verify launches mid-forward at all (a GPU), the same
  launched in six layer groups instead of two;
- `draft L`: the draft's proposals for a block of L;
- `mlx-lm forward N` (with `--rows N ...`): the bare model on N tokens, to see where a
  forward's cost jumps with its rows (a kernel that changes with the row count);
- `python, mlx-lm verify L` / `python, engine verify L` (with `--python-profile K`): the K
  Python functions with the most own time while each builds its graph (cProfile over the
  reps, ms per forward), to see what the engine's build adds to mlx-lm's.

`encode` is the time MLX's evaluation call takes to launch the built graph on the host
(on a GPU it returns before the device is done; on the CPU it runs the work itself).
Where `build` plus `encode` is close to `total`, the forward is bound by the host
(Python, MLX's graph building and launching), not by the GPU; a faster kernel then buys
nothing. `kernel_census` gives each forward's device time to set beside these.

    python -m dflash_tui.bench.cycle_profile --shape qwen3-4b qwen3-8b-4bit --context 128 4096
    python -m dflash_tui.bench.cycle_profile --shape tiny --reps 3     # CPU smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from typing import Any, Callable

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.bench.cycle_cost import SHAPES, build, random_prompt, regroup
from dflash_tui.engine.speculative import draft_proposals
from dflash_tui.engine.state import DecodeState


def _timed(run: Callable[[], Any], reset: Callable[[], None], reps: int) -> dict[str, float]:
    builds, encodes, totals = [], [], []
    for i in range(reps + 2):
        mx.synchronize()
        tic = time.perf_counter()
        out = run()
        built = time.perf_counter()
        mx.async_eval(out)  # returns once MLX has encoded (launched) the graph on the host
        encoded = time.perf_counter()
        mx.eval(out)
        done = time.perf_counter()
        reset()
        if i >= 2:  # the first two warm up (kernel builds, allocator)
            builds.append((built - tic) * 1e3)
            encodes.append((encoded - built) * 1e3)
            totals.append((done - tic) * 1e3)
    return {"build_ms": statistics.median(builds), "encode_ms": statistics.median(encodes),
            "total_ms": statistics.median(totals)}


def _copied(state: Any) -> Any:
    return tuple(list(x) if isinstance(x, list) else x for x in state) if isinstance(state, tuple) else state


def rewinder(cache: list[Any]) -> Callable[[int], Callable[[], None]]:
    """`trim(n)` -> a reset that drops the last n rows of the attention caches and gives the
    recurrent ones their state of now back (copied both ways: a forward replaces the arrays of
    a recurrent cache in its own list)."""
    states = {i: _copied(c.state) for i, c in enumerate(cache) if not hasattr(c, "trim")}

    def trim(n: int) -> Callable[[], None]:
        def reset() -> None:
            for i, c in enumerate(cache):
                if i in states:
                    c.state = _copied(states[i])
                else:
                    c.trim(n)
        return reset
    return trim


def python_time(run: Callable[[], Any], reset: Callable[[], None], reps: int, top: int) -> dict[str, Any]:
    """The `top` functions by own time while `run` builds its graph, ms per call (evaluation
    and `reset` outside the profile)."""
    prof = cProfile.Profile()
    for i in range(reps + 1):
        if i:
            prof.enable()
        out = run()
        if i:
            prof.disable()
        mx.eval(out)
        reset()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, primitive, own s, cumulative s, callers)}
    total = sum(v[2] for v in stats.values())
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    where = lambda f: f"{f[0].split('site-packages/')[-1].split('dflash_tui/')[-1]}:{f[1]} {f[2]}"  # noqa: E731
    return {"build_python_ms": total * 1e3 / reps,
            "top": [{"function": where(f), "calls": v[0] // reps, "own_ms": v[2] * 1e3 / reps,
                     "cumulative_ms": v[3] * 1e3 / reps} for f, v in ranked]}


def prepare(shape: str, context: int, dtype: mx.Dtype = mx.bfloat16) -> tuple[DecodeState, int]:
    """A random-weight pair of `shape` (a 5-layer draft) with `context` random tokens prefilled;
    (its state, the next token)."""
    target, draft = build(shape, 5, dtype)
    state = DecodeState(target, draft)
    logits, _ = state.prefill(random_prompt(target.vocab_size, context))
    return state, int(logits.argmax().item())


def profile(shape: str, context: int, block: int, reps: int, dtype: mx.Dtype,
            sweep: tuple[int, ...] = (), python_top: int = 0) -> list[dict[str, Any]]:
    state, token = prepare(shape, context, dtype)
    target, cache = state.target, state.target_cache
    rows: list[dict[str, Any]] = []

    trim = rewinder(cache)

    def add(name: str, run: Callable[[], Any], reset: Callable[[], None]) -> None:
        try:
            row = {"shape": shape, "context": context, "variant": name, **_timed(run, reset, reps)}
        except Exception as exc:  # one variant failing must not lose the others
            row = {"shape": shape, "context": context, "variant": name, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    def verify(tokens: mx.array) -> tuple:  # as the decode loop runs one (hybrids record their steps)
        target.begin_verify(cache)
        return target.forward(tokens, cache)

    def undo_verify() -> None:
        target.rollback(cache, 0, block)

    one = mx.array([[token]])
    many = mx.array([[token] * block])
    bare = target.model
    add("mlx-lm step", lambda: bare(one, cache=cache), trim(1))
    add("engine step", lambda: target.forward(one, cache)[0], trim(1))
    add(f"mlx-lm verify {block}", lambda: bare(many, cache=cache), trim(block))
    for n in sweep:
        add(f"mlx-lm forward {n}", lambda n=n: bare(mx.array([[token] * n]), cache=cache), trim(n))
    add(f"engine verify {block}", lambda: list(verify(many)), undo_verify)
    keep = target.flush_every
    target.flush_every = 0
    add(f"engine verify {block} no flush", lambda: list(verify(many)), undo_verify)
    target.flush_every = keep
    if keep:
        regroup(target, -(-len(target.layers) // 6))
        add(f"engine verify {block} six groups", lambda: list(verify(many)), undo_verify)
        regroup(target, keep)
    # the same verify with every row computed as the decode step at its position
    # (engine/step_rows.py; on MLX CUDA only, elsewhere the same as the plain verify)
    before = target.step_rows
    target.use_step_rows(True)
    add(f"engine verify {block} step rows", lambda: list(verify(many)), undo_verify)
    target.flush_every = 0
    add(f"engine verify {block} step rows no flush", lambda: list(verify(many)), undo_verify)
    target.flush_every = keep
    target.use_step_rows(before)
    if python_top:
        for name, run, reset, steps in ((f"mlx-lm verify {block}", lambda: bare(many, cache=cache), trim(block), False),
                                        (f"engine verify {block}", lambda: list(verify(many)), undo_verify, False),
                                        (f"engine verify {block} step rows", lambda: list(verify(many)), undo_verify,
                                         True)):
            target.use_step_rows(steps)
            row = {"shape": shape, "context": context, "variant": f"python, {name}",
                   **python_time(run, reset, reps, python_top)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        target.use_step_rows(before)
    state.pending.append(target.forward(one, cache)[1])
    mx.eval(state.pending)
    trim(1)()
    add(f"draft {block}", lambda: draft_proposals(state, token, block), lambda: None)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["tiny"])
    p.add_argument("--context", type=int, nargs="+", default=[128])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--rows", type=int, nargs="*", default=[], metavar="N",
                   help="also time the bare model on N tokens for each N")
    p.add_argument("--python-profile", type=int, default=0, metavar="K",
                   help="also list the K Python functions with the most own time in each verify's graph building")
    args = p.parse_args(argv)
    require_at_least(p, args, {"rows": 1, "context": 1, "block_size": 2, "reps": 1, "python_profile": 0})
    rows = [r for shape in args.shape for ctx in args.context
            for r in profile(shape, ctx, args.block_size, args.reps, getattr(mx, args.dtype), tuple(args.rows),
                         args.python_profile)]
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
