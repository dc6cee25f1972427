"""When a timed figure means something: over a handful of tokens, fixed costs swamp the rate."""

# a speedup needs a reply (or probe) of at least this many tokens, a prefill speed this many new prompt tokens
MIN_TIMED_TOKENS = 16

# the prompt of the speed probes after a load (the TUI's, and `dflash-tui serve`'s for remote TUIs)
PROBE_PROMPT = "Write a short paragraph about the sea."
