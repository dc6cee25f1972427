"""DFlash vs `mlx_lm.stream_generate` on the same prompt tokens, measured side by side.

Decode speed excludes prefill on both sides: tokens after the first, over the
time from the first token to the last.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Union

import mlx.core as mx

from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Done
from dflash_tui.engine.loading import Pair
from dflash_tui.errors import UserError


@dataclass
class RunFigures:
    decode_tps: float
    ttft_s: float
    peak_memory: int
    tokens: list[int]
    tokens_per_cycle: float = 1.0
    acceptance: float = 0.0
    phases_ms: dict[str, float] = field(default_factory=dict)  # per cycle
    block_sizes: dict[int, int] = field(default_factory=dict)


def run_baseline(pair: Pair, prompt: list[int], max_tokens: int) -> RunFigures:
    import mlx_lm

    mx.reset_peak_memory()
    tokens, first_at, last_at = [], None, None
    tic = time.perf_counter()
    for r in mlx_lm.stream_generate(pair.target.model, pair.target.tokenizer, prompt, max_tokens=max_tokens):
        now = time.perf_counter()
        if r.finish_reason == "stop":
            break
        tokens.append(r.token)
        first_at = first_at or now
        last_at = now
    n = len(tokens)
    span = (last_at - first_at) if n > 1 else 0.0
    return RunFigures(decode_tps=(n - 1) / span if span > 0 else 0.0, ttft_s=(first_at or tic) - tic,
                      peak_memory=mx.get_peak_memory(), tokens=tokens)


def fresh_turn(conv: Conversation, prompt: list[int], settings: GenerationSettings) -> list[Any]:
    """One turn of `prompt` from empty caches (every run starts cold, like the baseline): its events,
    the last a Done; the engine's refusal (a block past the draft's, a prompt past the context) is one line."""
    conv.state.reset()
    events = list(conv.generate_tokens(prompt, settings))
    if events[-1].type != "done":
        raise UserError(getattr(events[-1], "message", "generation failed"))
    return events


def run_dflash(conv: Conversation, prompt: list[int], settings: GenerationSettings) -> RunFigures:
    done: Done = fresh_turn(conv, prompt, settings)[-1]
    s = done.stats
    cycles = max(1, s["cycles"])
    phases = {k: s[f"{k}_ms"] / cycles for k in ("draft", "verify", "rollback")}
    phases["host"] = max(0.0, s["decode_s"] * 1e3 / cycles - sum(phases.values()))
    return RunFigures(decode_tps=s["decode_tps"], ttft_s=s["ttft_s"], peak_memory=s["peak_memory"], tokens=done.tokens,
                      tokens_per_cycle=s["tokens_per_cycle"], acceptance=s["acceptance"], phases_ms=phases,
                      block_sizes=s.get("block_sizes") or {})


def _median_run(runs: list[RunFigures]) -> RunFigures:
    return sorted(runs, key=lambda r: r.decode_tps)[len(runs) // 2]


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    for pkg in ("mlx", "mlx-lm", "dflash-tui"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = None
    try:
        dev = mx.device_info()
        info["device"] = dev.get("device_name") or dev.get("architecture") or str(mx.default_device())
    except Exception:
        info["device"] = str(mx.default_device())
    info["backend"] = str(mx.default_device())
    try:
        root = Path(__file__).resolve().parents[2]
        info["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, timeout=5).stdout.strip() or None
    except Exception:
        info["commit"] = None
    return info


def bench(pair: Pair, prompts: list[list[int]], max_tokens: int = 256, runs: int = 3, cooldown: float = 1.0,
          block_size: Union[int, str, None] = "auto", temperature: float = 0.0) -> dict[str, Any]:
    """Median of `runs` for each prompt, both decoders interleaved run by run."""
    conv = Conversation(pair)
    settings = GenerationSettings(max_tokens=max_tokens, block_size=block_size, temperature=temperature)
    # warm-up both paths (kernel compilation, the adaptive cost curve) before anything is timed
    run_baseline(pair, prompts[0], 8)
    run_dflash(conv, prompts[0], GenerationSettings(max_tokens=8, block_size=block_size))
    results = []
    for prompt in prompts:
        base_runs, df_runs = [], []
        for i in range(runs):
            base_runs.append(run_baseline(pair, prompt, max_tokens))
            time.sleep(cooldown)
            df_runs.append(run_dflash(conv, prompt, settings))
            if i + 1 < runs:
                time.sleep(cooldown)
        b, d = _median_run(base_runs), _median_run(df_runs)
        results.append({
            "prompt_tokens": len(prompt),
            "generated_tokens": len(d.tokens),
            "baseline": _public(b),
            "dflash": _public(d),
            "speedup": d.decode_tps / b.decode_tps if b.decode_tps else None,
            "identical": all(r.tokens == base_runs[0].tokens for r in base_runs + df_runs) if temperature == 0 else None,
        })
    speedups = [r["speedup"] for r in results if r["speedup"]]
    return {
        "machine": machine_info(),
        "target": pair.target_name,
        "draft": pair.draft_name,
        # the verify's multi-query attention: MLX's fused kernel, or the engine's CUDA kernel
        "attention": pair.target.attention_mode,
        "settings": {"max_tokens": max_tokens, "runs": runs, "cooldown_s": cooldown, "block_size": block_size, "temperature": temperature},
        "results": results,
        "summary": {
            "speedup_median": statistics.median(speedups) if speedups else None,
            "tokens_per_cycle_mean": statistics.mean(r["dflash"]["tokens_per_cycle"] for r in results),
            "all_identical": all(r["identical"] for r in results) if temperature == 0 else None,
        },
    }


def _public(r: RunFigures) -> dict[str, Any]:
    out = {"decode_tps": r.decode_tps, "ttft_s": r.ttft_s, "peak_memory": r.peak_memory, "tokens_per_cycle": r.tokens_per_cycle,
           "acceptance": r.acceptance}
    if r.phases_ms:
        out["phases_ms_per_cycle"] = r.phases_ms
        out["block_sizes"] = {str(k): v for k, v in r.block_sizes.items()}
    return out


def format_table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"{report['target']}  <-  {report['draft']}",
             f"{m['device']} ({m['backend']}), mlx {m['mlx']}, mlx-lm {m['mlx-lm']}, commit {m['commit']}",
             f"verify attention: {report['attention']} (the baseline is mlx_lm.stream_generate on the same weights)",
             f"max_tokens {report['settings']['max_tokens']}, block {report['settings']['block_size']}, median of {report['settings']['runs']}", "",
             f"{'prompt':>6} {'base tok/s':>10} {'dflash tok/s':>12} {'speedup':>8} {'tok/cycle':>9} {'accept':>7} {'ttft ms':>8} {'peak MB':>8} {'same':>5}  draft/verify/rollback/host ms"]
    for i, r in enumerate(report["results"]):
        b, d = r["baseline"], r["dflash"]
        ph = d.get("phases_ms_per_cycle", {})
        lines.append(
            f"{i:>6} {b['decode_tps']:>10.1f} {d['decode_tps']:>12.1f} {r['speedup'] or 0:>7.2f}x {d['tokens_per_cycle']:>9.2f} "
            f"{d['acceptance']:>6.0%} {d['ttft_s'] * 1e3:>8.1f} {d['peak_memory'] / 2**20:>8.0f} {str(r['identical']):>5}  "
            + "/".join(f"{ph.get(k, 0):.1f}" for k in ("draft", "verify", "rollback", "host"))
        )
    s = report["summary"]
    lines.append("")
    lines.append(f"median speedup {s['speedup_median'] or 0:.2f}x, mean tokens/cycle {s['tokens_per_cycle_mean']:.2f}, identical outputs: {s['all_identical']}")
    return "\n".join(lines)
