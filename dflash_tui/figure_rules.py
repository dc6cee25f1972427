"""When a timed figure means something: over a handful of tokens, fixed costs swamp the rate."""

from typing import Any

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
