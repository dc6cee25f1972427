"""Benchmark (not a test): listing and searching N saved sessions through the index, cold and warm.

Writes N synthetic sessions (valid schema 3 files with traces, about
`--kb` KB each, like real ones) into a temporary folder, then times:

- list / search cold: no index yet (every file is read once, the index built);
- list / search warm: the index up to date (the folder is scanned, nothing read);
- list after one file changed (one file read);
- the CLI, `dflash-tui sessions list` and `sessions search`, warm, as a process
  (interpreter start included);
- for comparison, reading every file whole (what a listing cost before the index).

Prints one JSON object. Times are medians over --repeat runs (cold: one run).

    python -m dflash_tui.bench.sessions_index --sessions 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.session_index import INDEX_NAME
from dflash_tui.session_schema import FORMAT, SCHEMA_VERSION

WORDS = ("the a of to in is it that for on with as this be by are or from at an value list function return "
         "python parse date file error test class method string number loop index key sort dict set tuple "
         "import print async await thread lock cache token draft target block cycle speed memory model "
         "prompt reply branch session search title export replay json yaml markdown code fence format").split()
RARE = "zebra"  # in about one session in a hundred: a search with few hits


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _trace(rng: random.Random, blocks: int) -> tuple[list[dict[str, Any]], str]:
    t, entries, pieces, tokens = 0.02, [], [], []
    entries.append({"t": t, "type": "prefill", "prompt_tokens": 40, "cached_tokens": 0, "seconds": t})
    for i in range(blocks):
        drafted = [rng.randrange(300) for _ in range(15)] if i else []
        accepted = rng.randrange(0, len(drafted) + 1) if drafted else 0
        emitted = drafted[:accepted] + [rng.randrange(300)]
        t += 0.012
        piece = " ".join(rng.choice(WORDS) for _ in emitted)
        entries.append({"t": round(t, 6), "type": "block", "index": i, "drafted": drafted, "accepted": accepted,
                        "emitted": emitted, "text": " " + piece, "draft_ms": 2.0, "verify_ms": 9.0,
                        "rollback_ms": 0.5, "eos": False})
        pieces.append(" " + piece)
        tokens += emitted
    text = "".join(pieces).strip()
    cycles = blocks - 1
    stats = {"mode": "dflash", "generated_tokens": len(tokens), "cycles": cycles,
             "tokens_per_cycle": (len(tokens) - 1) / max(cycles, 1), "acceptance": 0.5, "decode_tps": 80.0}
    entries.append({"t": round(t, 6), "type": "done", "tokens": tokens, "text": text, "finish_reason": "stop",
                    "stats": stats})
    return entries, text


def synthetic_session(i: int, rng: random.Random, kb: float) -> dict[str, Any]:
    """One valid session file's data: a system prompt and a few turns, about `kb` KB of JSON."""
    turns = rng.randint(2, 4)
    blocks = max(2, int(kb * 1024 / (turns * 460)))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant.", "trace": None}]
    for turn in range(turns):
        question = _text(rng, rng.randint(6, 20)) + (f" {RARE}" if i % 100 == 7 and turn == 0 else "")
        messages.append({"role": "user", "content": question, "trace": None})
        trace, text = _trace(rng, blocks)
        messages.append({"role": "assistant", "content": text, "trace": trace})
    ids = [f"m{k + 1}" for k in range(len(messages))]
    for k, m in enumerate(messages):
        m.update(id=ids[k], parent=ids[k - 1] if k else None, children=ids[k + 1:k + 2])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(1_700_000_000 + i * 60))
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "id": f"bench-{i:06d}",
            "title": messages[1]["content"][:60], "created": stamp, "updated": stamp, "target": "org/bench-target",
            "draft": "org/bench-draft", "device": "cpu", "baseline_tps": 50.0,
            "settings": {"temperature": 0.0, "block_size": 16}, "token_text": {str(t): f"w{t}" for t in range(300)},
            "revision": 1, "messages": messages, "roots": ids[:1], "view": ids}


def write_sessions(root: Path, n: int, kb: float, seed: int = 0) -> int:
    """N session files in `root`; returns their total size in bytes."""
    root.mkdir(parents=True, exist_ok=True)
    rng, total = random.Random(seed), 0
    for i in range(n):
        payload = json.dumps(synthetic_session(i, rng, kb), separators=(",", ":")).encode()
        (root / f"bench-{i:06d}.json").write_bytes(payload)
        total += len(payload)
    return total


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _median(fn: Callable[[], Any], repeat: int) -> float:
    return statistics.median(_timed(fn)[0] for _ in range(repeat))


def _cli(data_dir: Path, *args: str) -> Callable[[], None]:
    env = dict(os.environ, DFLASH_TUI_DATA_DIR=str(data_dir))

    def run() -> None:
        r = subprocess.run([sys.executable, "-m", "dflash_tui", "sessions", *args], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        if r.returncode not in (0, 1):
            raise RuntimeError(r.stderr.strip())

    return run


def measure(data_dir: Path, n: int, kb: float = 35.0, repeat: int = 5, cli: bool = True,
            parse_all: bool = True) -> dict[str, Any]:
    from dflash_tui.session_record import read_session
    from dflash_tui.sessions import SessionStore

    root = data_dir / "sessions"
    _, total = _timed(lambda: write_sessions(root, n, kb))
    store = SessionStore(root)
    out: dict[str, Any] = {"sessions": n, "json_mb": round(total / 1e6, 1), "repeat": repeat}
    if parse_all:
        out["read_every_file_s"] = round(_timed(lambda: [read_session(p) for p in root.glob("*.json")])[0], 3)
    out["list_cold_s"], (summaries, problems) = _timed(store.list)
    if len(summaries) != n or problems:
        raise RuntimeError(f"listed {len(summaries)} of {n} sessions, {len(problems)} problems")
    out["index_mb"] = round((root / INDEX_NAME).stat().st_size / 1e6, 1)
    out["list_warm_s"] = _median(store.list, repeat)
    changed = root / "bench-000000.json"
    out["list_one_changed_s"] = _median(lambda: (os.utime(changed), store.list()), repeat)
    out["search_warm_s"] = {q: _median(lambda q=q: store.search(q), repeat) for q in ("python", RARE, "parse dat")}
    out["search_hits"] = {q: len(store.search(q)[0]) for q in ("python", RARE, "parse dat")}
    (root / INDEX_NAME).unlink()
    out["search_cold_s"], _ = _timed(lambda: store.search(RARE))
    if cli:
        out["cli_list_warm_s"] = _median(_cli(data_dir, "list"), repeat)
        out["cli_search_warm_s"] = _median(_cli(data_dir, "search", RARE), repeat)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()} | {
        "search_warm_s": {q: round(v, 4) for q, v in out["search_warm_s"].items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000, help="how many sessions (default 10000)")
    parser.add_argument("--kb", type=float, default=35.0, help="about how big each file is (default 35 KB)")
    parser.add_argument("--repeat", type=int, default=5, help="warm runs per figure (median)")
    parser.add_argument("--no-cli", action="store_true", help="skip the CLI timings")
    parser.add_argument("--dir", metavar="PATH", help="a folder to use (default: a temporary one, removed after)")
    args = parser.parse_args(argv)
    require_at_least(parser, args, {"sessions": 1, "repeat": 1})
    if args.dir:
        result = measure(Path(args.dir), args.sessions, args.kb, args.repeat, not args.no_cli)
    else:
        with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
            result = measure(Path(tmp), args.sessions, args.kb, args.repeat, not args.no_cli)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
