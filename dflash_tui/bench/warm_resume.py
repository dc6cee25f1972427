"""Benchmark (not a test): time to first token when a saved conversation is reopened, cold
(prefilled from scratch) against warm (its last turn's caches read from disk,
engine/prompt_cache_files.py).

One process, one pair. A conversation of about `--tokens` tokens is built from the
held-out prompts, one turn is run on it and its caches saved; then, `--runs` times
each, alternating, a new Conversation is opened on the same messages (as after a
restart) and asked one more question: cold without the saved file, warm with it.
Time to first token is from the call to the first token out, the file's reading
included. The first tokens must agree (the tokens are checked, not assumed).

`--shape NAME` (cycle_cost's shapes) runs a random-weight pair of a real model's shape
instead, built in memory with a small real tokenizer: a real-size target's prefill
against its cache file, where no checkpoint can be downloaded.

    python -m dflash_tui.bench.warm_resume --demo --tokens 3800 --json
    python -m dflash_tui.bench.warm_resume --shape qwen3-4b --tokens 4000 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx

from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.loading import Pair, load_pair
from dflash_tui.engine.prompt_cache_files import PromptCacheFiles

QUESTION = "Summarise what we discussed in one sentence."


def build_history(conv: Conversation, texts: list[str], tokens: int) -> list[dict[str, str]]:
    """User/assistant turns cycling through `texts` until the rendering reaches about `tokens` tokens."""
    messages: list[dict[str, str]] = []
    i = 0
    while True:
        text = texts[i % len(texts)]
        turn = [{"role": "user", "content": f"{text} (part {i})"},
                {"role": "assistant", "content": " ".join([text] * 3)}]
        if len(conv.prompt_tokens(messages + turn)) > tokens:
            if not messages:
                raise SystemExit(f"--tokens {tokens} is shorter than one turn of the conversation")
            return messages
        messages += turn
        i += 1


def first_token(conv: Conversation, settings: GenerationSettings) -> tuple[float, int, int]:
    """(seconds to the first token, its id, tokens the turn prefilled)."""
    tic = time.perf_counter()
    prefilled = -1
    for ev in conv.generate(QUESTION, settings):
        if ev.type == "prefill":
            prefilled = ev.prompt_tokens - ev.cached_tokens
        elif ev.type == "block":
            return time.perf_counter() - tic, ev.emitted[0], prefilled
        elif ev.type == "error":
            raise RuntimeError(ev.message)
    raise RuntimeError("no token came out")


def run(pair: Pair, texts: list[str], tokens: int, runs: int, root: Path) -> dict[str, Any]:
    settings = GenerationSettings(max_tokens=1)
    setup = Conversation(pair)
    setup.messages = build_history(setup, texts, tokens)
    last = setup.messages.pop(-2)["content"]  # the saved session's last turn, run for real
    setup.messages.pop()
    list(setup.generate(last, GenerationSettings(max_tokens=16)))
    setup.saved = PromptCacheFiles(pair, root)
    tic = time.perf_counter()
    path = setup.save_caches()
    save_s = time.perf_counter() - tic
    if path is None:
        raise RuntimeError("the caches were not saved")
    history = [dict(m) for m in setup.messages]
    del setup

    def opened(warm: bool) -> Conversation:
        conv = Conversation(pair)
        conv.messages = [dict(m) for m in history]
        if warm:
            conv.saved = PromptCacheFiles(pair, root)
        return conv

    # one of each first, untimed: kernels compile on first use
    first_token(opened(False), settings)
    first_token(opened(True), settings)
    cold, warm, firsts, prefilled = [], [], set(), {}
    for _ in range(runs):
        for kind, times in (("cold", cold), ("warm", warm)):
            mx.clear_cache()
            seconds, token, n = first_token(opened(kind == "warm"), settings)
            times.append(seconds)
            firsts.add(token)
            prefilled[kind] = n
    prompt = len(opened(False).prompt_tokens(history + [{"role": "user", "content": QUESTION}]))
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return {
        "device": str(mx.default_device()),
        "pair": [pair.target_name, pair.draft_name],
        "prompt_tokens": prompt,
        "prefilled_tokens": prefilled,
        "file_bytes": path.stat().st_size,
        "save_s": save_s,
        "ttft_cold_s": cold_s,
        "ttft_warm_s": warm_s,
        "speedup": cold_s / warm_s if warm_s > 0 else None,
        "same_first_token": len(firsts) == 1,
        "runs": runs,
    }


def shape_pair(shape: str, dtype: mx.Dtype = mx.bfloat16) -> Pair:
    """A random-weight pair of `shape` (cycle_cost's), driven by a small real tokenizer."""
    from dflash_tui.bench.cycle_cost import build
    from dflash_tui.bench.references import tokenizer_for

    target, draft = build(shape, 5, dtype)
    target.tokenizer = tokenizer_for()
    return Pair(target, draft, shape, f"{shape}-draft")


def main(argv: Optional[list[str]] = None) -> int:
    from dflash_tui.bench.cycle_cost import SHAPES
    from dflash_tui.commands.bench import read_prompts
    from dflash_tui.commands.common import (
        add_draft_quant_argument,
        add_model_arguments,
        resolve_pair,
    )

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(p)
    add_draft_quant_argument(p)
    p.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                   help="texts the conversation is built from (default: the demo's held-out prompts)")
    p.add_argument("--prompt", default=None)
    p.add_argument("--tokens", type=int, default=3800, help="length of the saved conversation, in tokens")
    p.add_argument("--runs", type=int, default=3, help="timed openings of each kind; the median is reported")
    p.add_argument("--shape", default=None, choices=sorted(SHAPES),
                   help="a random-weight pair of this shape (cycle_cost's) instead of --model / --demo")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.prompts is None and args.prompt is None:
        args.prompts = Path(__file__).resolve().parents[1] / "demo" / "heldout_prompts.jsonl"
    texts = read_prompts(args)
    if args.shape:
        if args.model or args.draft or args.demo:
            p.error("--shape builds its own pair: it cannot be combined with --model, --draft or --demo")
        pair = shape_pair(args.shape)
    else:
        model, draft = resolve_pair(args)
        pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code, draft_quant=args.draft_quant or 0)
    with tempfile.TemporaryDirectory(prefix="warm-resume-") as tmp:
        report = run(pair, texts, args.tokens, max(1, args.runs), Path(tmp))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['prompt_tokens']} tokens: first token cold {report['ttft_cold_s'] * 1000:.0f} ms "
              f"({report['prefilled_tokens']['cold']} prefilled), warm {report['ttft_warm_s'] * 1000:.0f} ms "
              f"({report['prefilled_tokens']['warm']} prefilled, {report['file_bytes'] / 2**20:.1f} MiB read), "
              f"{report['speedup']:.1f}x; same first token: {report['same_first_token']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
