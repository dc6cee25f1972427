"""DFlash vs `mlx_lm.stream_generate` on the same prompt tokens, measured side by side.

Decode speed excludes prefill on both sides: tokens after the first, over the
time from the first token to the last.

Each prompt's row is its median run (by DFlash tok/s). The summary's tokens/cycle and
acceptance pool those rows, as the README defines them: the tokens the cycles gave over
the cycles, the accepted over the drafted, all prompts' cycles counted together (not a
mean of the rows' ratios). Its speedup is the median of the rows' speedups.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Optional, Union

import mlx.core as mx

from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Done, cycle_counts
from dflash_tui.engine.loading import Pair
from dflash_tui.engine.target import finish_stream_generate
from dflash_tui.errors import UserError
from dflash_tui.model_names import draft_label, model_label


@dataclass
class RunFigures:
    decode_tps: float
    ttft_s: float
    peak_memory: int
    tokens: list[int]
    tokens_per_cycle: float = 1.0
    acceptance: float = 0.0
    # the raw counts behind tokens_per_cycle and acceptance (DFlash runs): what the summary pools
    counts: dict[str, int] = field(default_factory=dict)
    phases_ms: dict[str, float] = field(default_factory=dict)  # per cycle
    block_sizes: dict[int, int] = field(default_factory=dict)


def run_baseline(pair: Pair, prompt: list[int], max_tokens: int) -> RunFigures:
    import mlx_lm

    mx.reset_peak_memory()
    tokens, first_at, last_at = [], None, None
    tic = time.perf_counter()
    for r in mlx_lm.stream_generate(pair.target.model, pair.target.tokenizer, prompt, max_tokens=max_tokens):
        now = time.perf_counter()
        if r.finish_reason == "stop":  # the step that says EOS is waited for, as the engine's last cycle is
            last_at = now if first_at is not None else last_at
            break
        tokens.append(r.token)
        first_at = first_at or now
        last_at = now
    finish_stream_generate()
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
    events = fresh_turn(conv, prompt, settings)
    done: Done = events[-1]
    s = done.stats
    cycles = max(1, s["cycles"])
    phases = {k: s[f"{k}_ms"] / cycles for k in ("draft", "verify", "rollback")}
    phases["host"] = max(0.0, s["decode_s"] * 1e3 / cycles - sum(phases.values()))
    return RunFigures(decode_tps=s["decode_tps"], ttft_s=s["ttft_s"], peak_memory=s["peak_memory"], tokens=done.tokens,
                      tokens_per_cycle=s["tokens_per_cycle"], acceptance=s["acceptance"], phases_ms=phases,
                      block_sizes=s.get("block_sizes") or {}, counts=cycle_counts(events))


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
          block_size: Union[int, str, None] = "auto", temperature: float = 0.0,
          texts: Optional[list[str]] = None) -> dict[str, Any]:
    """Median of `runs` for each prompt, both decoders interleaved run by run. `texts`: the prompts as
    written, kept in the report beside their rows (the table names each row by its first words)."""
    conv = Conversation(pair)
    settings = GenerationSettings(max_tokens=max_tokens, block_size=block_size, temperature=temperature)
    # warm-up both paths (kernel compilation, the adaptive cost curve) before anything is timed
    run_baseline(pair, prompts[0], 8)
    run_dflash(conv, prompts[0], GenerationSettings(max_tokens=8, block_size=block_size))
    results = []
    for n, prompt in enumerate(prompts):
        base_runs, df_runs = [], []
        for i in range(runs):
            base_runs.append(run_baseline(pair, prompt, max_tokens))
            time.sleep(cooldown)
            df_runs.append(run_dflash(conv, prompt, settings))
            if i + 1 < runs:
                time.sleep(cooldown)
        b, d = _median_run(base_runs), _median_run(df_runs)
        results.append({
            **({"prompt": texts[n]} if texts is not None and n < len(texts) else {}),
            "prompt_tokens": len(prompt),
            "generated_tokens": len(d.tokens),
            "baseline": _public(b),
            "dflash": _public(d),
            "speedup": d.decode_tps / b.decode_tps if b.decode_tps else None,
            "identical": all(r.tokens == base_runs[0].tokens for r in base_runs + df_runs) if temperature == 0 else None,
        })
    return {
        "machine": machine_info(),
        "target": pair.target_name,
        "draft": pair.draft_name,
        # the verify's multi-query attention: MLX's fused kernel, or the engine's CUDA kernel
        "attention": pair.target.attention_mode,
        "settings": {"max_tokens": max_tokens, "runs": runs, "cooldown_s": cooldown, "block_size": block_size, "temperature": temperature},
        "results": results,
        "summary": summarize(results, temperature),
    }


def summarize(results: list[dict[str, Any]], temperature: float) -> dict[str, Any]:
    """The rows together. tokens_per_cycle and acceptance are pooled: the rows' cycle tokens over their
    cycles, their accepted over their drafted (None where no cycle drafted), with the totals they come
    from. speedup_median is the median of the per-prompt speedups (each row's DFlash tok/s over its
    target-alone tok/s), not a ratio of pooled speeds."""
    total = {k: sum(r["dflash"].get(k, 0) for r in results) for k in ("cycles", "cycle_tokens", "drafted", "accepted")}
    speedups = [r["speedup"] for r in results if r["speedup"]]
    return {
        "speedup_median": statistics.median(speedups) if speedups else None,  # median of the per-prompt speedups
        "tokens_per_cycle": total["cycle_tokens"] / total["cycles"] if total["cycles"] else None,  # pooled
        "acceptance": total["accepted"] / total["drafted"] if total["drafted"] else None,  # pooled
        **total,
        "all_identical": all(r["identical"] for r in results) if temperature == 0 else None,
    }


def _public(r: RunFigures) -> dict[str, Any]:
    out = {"decode_tps": r.decode_tps, "ttft_s": r.ttft_s, "peak_memory": r.peak_memory, "tokens_per_cycle": r.tokens_per_cycle,
           "acceptance": r.acceptance}
    if r.phases_ms:
        out.update(r.counts)
        out["phases_ms_per_cycle"] = r.phases_ms
        out["block_sizes"] = {str(k): v for k, v in r.block_sizes.items()}
    return out


def prompt_label(text: Optional[str], number: int, width: int = 60) -> str:
    """A prompt as the table names it: its first words on one line, cut at `width`; "prompt N" without its text."""
    if not text or not text.strip():
        return f"prompt {number}"
    words = " ".join(text.split())
    if len(words) <= width:
        return words
    cut = words[:width - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:") + "…"  # whole words where it can


def format_table(report: dict[str, Any]) -> str:
    """The report for a reader: the pair by its names (model_names, never install paths), the source's
    commit only where it is known (a git checkout), each prompt numbered with its first words."""
    m = report["machine"]
    draft = draft_label(report["target"], report["draft"]) if report.get("draft") else "no draft"
    commit = f", dflash-tui commit {m['commit']}" if m.get("commit") else ""
    lines = [f"{model_label(report['target'])}  <-  {draft}",
             f"{m['device']} ({m['backend']}), mlx {m['mlx']}, mlx-lm {m['mlx-lm']}{commit}",
             f"verify attention: {report['attention']} (the baseline is mlx_lm.stream_generate on the same weights)",
             f"max_tokens {report['settings']['max_tokens']}, block {report['settings']['block_size']}, median of {report['settings']['runs']}", ""]
    keyed = [(i, r["prompt"]) for i, r in enumerate(report["results"], 1) if r.get("prompt")]
    if keyed:  # the key to the rows' numbers
        lines += [f"prompt {i}: {prompt_label(text, i)}" for i, text in keyed] + [""]
    lines.append(f"{'prompt':>6} {'base tok/s':>10} {'dflash tok/s':>12} {'speedup':>8} {'tok/cycle':>9} {'accept':>7} "
                 f"{'ttft ms':>8} {'peak MiB':>9} {'same':>5}  draft/verify/rollback/host ms")
    for i, r in enumerate(report["results"], 1):
        b, d = r["baseline"], r["dflash"]
        ph = d.get("phases_ms_per_cycle", {})
        lines.append(
            f"{i:>6} {b['decode_tps']:>10.1f} {d['decode_tps']:>12.1f} {r['speedup'] or 0:>7.2f}x {d['tokens_per_cycle']:>9.2f} "
            f"{d['acceptance']:>6.0%} {d['ttft_s'] * 1e3:>8.1f} {d['peak_memory'] / 2**20:>9.0f} {str(r['identical']):>5}  "
            + "/".join(f"{ph.get(k, 0):.1f}" for k in ("draft", "verify", "rollback", "host"))
        )
    s = report["summary"]
    lines.append("")
    lines.append(f"speedup {s['speedup_median'] or 0:.2f}x (median of per-prompt speedups)")
    if s["cycles"]:
        lines.append(f"all prompts pooled: {s['tokens_per_cycle']:.2f} tokens/cycle ({s['cycle_tokens']} tokens over "
                     f"{s['cycles']} cycles), acceptance {s['acceptance']:.0%} ({s['accepted']} of {s['drafted']} drafted)")
    else:
        lines.append("all prompts pooled: no cycle drafted (target only)")
    lines.append(f"identical outputs: {s['all_identical']}")
    return "\n".join(lines)
