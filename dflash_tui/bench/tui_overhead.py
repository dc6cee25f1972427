"""Benchmark (not a test): decode tok/s inside the TUI against headless `generate`.

Both use the same pair, prompt and settings; runs alternate (headless, TUI,
headless, ...) and the medians are compared. The TUI figure is the engine's own
decode tok/s measured in the worker thread while the app draws every block, so
it shows what the UI costs the engine. Each TUI run is also divided by the
headless run just before it: pairs close in time cancel slow drifts in machine
load, so their median and spread say more than the two medians on a busy machine.

The block size is fixed (16) unless --block-size says otherwise: with `auto` the
app keeps one conversation, whose block sizer (cost curve and acceptance) carries
over turns, while each headless run starts fresh, which favours the TUI.

    python -m dflash_tui.bench.tui_overhead --demo --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.commands.common import add_model_arguments, resolve_pair


def headless(model: str, draft: str, prompt: str, max_tokens: int, block_size) -> float:
    from dflash_tui.engine.conversation import Conversation, GenerationSettings
    from dflash_tui.engine.loading import load_pair

    pair = headless.pair = getattr(headless, "pair", None) or load_pair(model, draft)
    conv = Conversation(pair)
    done = [e for e in conv.generate(prompt, GenerationSettings(max_tokens=max_tokens, block_size=block_size))][-1]
    headless.tokens = done.stats.get("generated_tokens")
    return done.stats["decode_tps"]


async def in_tui(model: str, draft: str, prompt: str, max_tokens: int, block_size, runs: int, between) -> list[float]:
    from dflash_tui.ui.app import DFlashApp

    app = DFlashApp(model=model, draft=draft, probe_tokens=0)
    rates: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        while app.model_state != "ready":
            await pilot.pause(0.1)
        app.options.max_tokens = max_tokens
        app.options.block_size = block_size if block_size is not None else 0
        seen = app.meter.on_done
        done = asyncio.Event()

        def record(ev):
            rates.append(ev.stats["decode_tps"])
            in_tui.tokens = ev.stats.get("generated_tokens")
            seen(ev)
            done.set()

        app.meter.on_done = record
        for _ in range(runs):
            between()
            app.action_new_chat()  # it asks only where a conversation was not saved: never here
            await pilot.pause(0.2)
            app.prompt.value = prompt
            done.clear()
            # what Enter does, without pilot.press: after a key it polls until the process is idle
            # (up to twice a second of sleeps at 50 Hz, while the engine decodes), which a user's
            # keypress never does
            app.prompt.submit()
            # woken by the reply's end: polling (or pilot.pause, which messages every widget and forces a
            # repaint) would take the GIL from the engine
            await done.wait()
            await pilot.pause(0.2)
    return rates


def _release_main_thread() -> None:
    """The headless runs used MLX on this thread: free it here, not in interpreter teardown (which can abort)."""
    import mlx.core as mx

    headless.pair = None
    mx.synchronize()
    mx.clear_streams()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--prompt", default="Write a function that returns the sum of a list of numbers.")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--block-size", default="16", help="a number, or auto (see above)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    require_at_least(p, args, {"max_tokens": 1, "runs": 1})
    block = args.block_size if args.block_size == "auto" else int(args.block_size)
    model, draft = resolve_pair(args)
    # the app must not touch the user's real config or sessions
    scratch = tempfile.mkdtemp()
    os.environ.setdefault("DFLASH_TUI_CONFIG_DIR", os.path.join(scratch, "config"))
    os.environ.setdefault("DFLASH_TUI_DATA_DIR", os.path.join(scratch, "data"))
    head: list[float] = []
    headless(model, draft, args.prompt, 16, block)  # warm-up
    tui = asyncio.run(in_tui(model, draft, args.prompt, args.max_tokens, block, args.runs,
                             lambda: head.append(headless(model, draft, args.prompt, args.max_tokens, block))))
    _release_main_thread()
    h, t = statistics.median(head), statistics.median(tui)
    pairs = sorted(b / a for a, b in zip(head, tui))
    print(f"reply           {getattr(headless, 'tokens', '?')} tokens headless, {getattr(in_tui, 'tokens', '?')} in the TUI")
    print(f"headless decode {h:.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in head)})")
    print(f"in the TUI      {t:.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in tui)})")
    print(f"TUI / headless  {t / h:.1%} (medians)")
    print(f"paired runs     median {statistics.median(pairs):.1%}, quartiles {_quartiles(pairs)}, "
          f"range {pairs[0]:.1%}..{pairs[-1]:.1%}")
    return 0


def _quartiles(xs: list[float]) -> str:
    if len(xs) < 4:
        return "—"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.1%}..{q[2]:.1%}"


if __name__ == "__main__":
    raise SystemExit(main())
