"""When a timed figure means something: over a handful of tokens, fixed costs swamp the rate."""

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from dflash_tui.engine.events import Done

# a speedup needs a reply (or probe) of at least this many tokens, a prefill speed this many new prompt tokens
MIN_TIMED_TOKENS = 16

# the prompt of the speed probes after a load (the TUI's, and `dflash-tui serve`'s for remote TUIs)
PROBE_PROMPT = "Write a short paragraph about the sea."


def measures_target_alone(done: Any) -> bool:
    """Whether a finished reply (a Done event) is a target-alone speed the speedup may divide by: a
    target-only reply, not stopped, of MIN_TIMED_TOKENS tokens or more."""
    return (done.stats.get("mode") == "baseline" and done.finish_reason != "cancelled"
            and len(done.tokens) >= MIN_TIMED_TOKENS and bool(done.stats.get("decode_tps")))


def tokens_words(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


def finish_words(finish_reason: str, stats: dict) -> str:
    """How a reply ended, in a reply's line of figures ("" for the end of text)."""
    if finish_reason == "cancelled":
        return "stopped"
    if finish_reason == "length":  # the engine ends a reply where the model's context is full, as at max_tokens
        return "context full" if stats.get("context_full") else "hit max tokens"
    return ""


def reply_summary(done: Optional["Done"]) -> str:
    """A reply's line of figures, in the same words wherever it is shown: the chat's footer (live, a
    branch shown again, replay), `sessions show` and the Markdown export ("" without a Done). The token
    count is the engine's, else (a file without it) the reply's token ids."""
    if done is None:
        return ""
    stats = done.stats
    n = stats.get("generated_tokens", len(done.tokens))
    parts = [tokens_words(n)]
    if n == 0:
        pass  # stopped before its first token: no mode ran
    elif stats.get("mode") == "dflash" and stats.get("cycles") == 0:
        parts.append("target only (no cycle drafted)")  # tokens per cycle is never below 1 where there is one
    elif stats.get("mode") == "dflash":
        parts.append(f"{stats.get('tokens_per_cycle', 0):.2f} tok/cycle")
        parts.append(f"{100 * stats.get('acceptance', 0):.0f}% accepted")
    elif stats.get("mode") == "remote":
        if stats.get("cycles"):
            parts.append(f"{stats.get('tokens_per_cycle', 0):.2f} tok/step")
            if "acceptance" in stats:
                parts.append(f"{100 * stats['acceptance']:.0f}% accepted")
        else:
            parts.append("no speculative figures")
        if stats.get("ttft_s") is not None:
            parts.append(f"ttft {stats['ttft_s']:.2f} s")
    else:
        parts.append("target only")
    if stats.get("decode_tps"):
        parts.append(f"{stats['decode_tps']:.1f} tok/s")
    parts.append(finish_words(done.finish_reason, stats))
    return " · ".join(p for p in parts if p)
