"""What a session file may hold: every field's type and range, checked before anything uses it.

`check_session(data)` takes parsed JSON, migrates an older layout, and returns
it as the current layout, or raises ValueError saying what is wrong. A file
that passes can be listed, shown, exported and replayed without surprises:
counts are whole numbers in range, times are finite, texts are text, token ids
are ids, and nothing nests deeper than our own files do.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from dflash_tui.session_trace import timed_trace

FORMAT = "dflash-tui-session"
SCHEMA_VERSION = 2
ROLES = ("system", "user", "assistant")
MAX_DEPTH = 12  # our files nest 7 deep (session > messages > message > trace > entry > stats > block_sizes)
MAX_INT = 2**53  # no count, size or id from a real run comes near this; JSON readers agree up to here
MAX_TOKEN_ID = 2**31 - 1


def _fail(what: str) -> None:
    raise ValueError(what)


def _check(cond: bool, what: str) -> None:
    if not cond:
        _fail(what)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, str)) or is_number(v)


# -- every value, whatever its place ---------------------------------------------------
def check_values(data: Any) -> None:
    """No deeper than MAX_DEPTH, no lone surrogates in any text or key, numbers finite and in range."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            _check(-MAX_INT <= value <= MAX_INT, f"a number out of range ({len(str(abs(value)))} digits)"
                   if abs(value) < 10**100 else "a number out of range (over 100 digits)")
        elif isinstance(value, float):
            _check(math.isfinite(value), "a number that is not finite (NaN or Infinity)")
        elif isinstance(value, (list, dict)):
            _check(depth < MAX_DEPTH, f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_text(key)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        else:
            _fail(f"a value of type {type(value).__name__}")


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _fail("text with a lone surrogate (not valid Unicode)")


# -- fields by type --------------------------------------------------------------------------
def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _count(v: Any) -> bool:
    return is_int(v) and v >= 0


def _amount(v: Any) -> bool:
    return is_number(v) and v >= 0


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in v)


def _block_size(v: Any) -> bool:
    return v is None or v == "auto" or _count(v)


# the settings a session records (GenerationSettings); others must be plain values
SETTINGS: dict[str, Callable[[Any], bool]] = {
    "max_tokens": _opt(_count), "block_size": _block_size, "temperature": _opt(_amount), "top_p": _opt(_amount),
    "top_k": _opt(_count), "min_p": _opt(_amount), "seed": _opt(is_int), "baseline": _opt(lambda v: isinstance(v, bool)),
    "prefill_chunk": _opt(_count), "mode": _opt(lambda v: isinstance(v, str)),
}
# the figures a reply's Done carries; the views do arithmetic on every one of them (None too is refused)
STATS: dict[str, Callable[[Any], bool]] = {
    **{k: _count for k in ("generated_tokens", "cycles", "prompt_tokens", "cached_tokens", "peak_memory")},
    **{k: _amount for k in ("tokens_per_cycle", "acceptance", "decode_tps", "prefill_tps", "ttft_s",
                                  "prefill_s", "decode_s", "draft_ms", "verify_ms", "rollback_ms", "temperature")},
    "mode": _opt(lambda v: isinstance(v, str)), "block_size": _block_size, "seed": _opt(is_int),
    "block_sizes": lambda v: isinstance(v, dict) and all(_scalar(x) for x in v.values()),
}


def _check_fields(data: dict[str, Any], known: dict[str, Callable[[Any], bool]], where: str) -> None:
    for key, value in data.items():
        check = known.get(key)
        ok = check(value) if check is not None else _scalar(value)
        _check(ok, f"{where}: bad value for '{key}'")


# -- events -------------------------------------------------------------------------------------
# type -> {field: (check, required)}; every field of the engine's event dataclasses
_EVENTS: dict[str, dict[str, tuple[Callable[[Any], bool], bool]]] = {
    "prefill": {"prompt_tokens": (_count, True), "cached_tokens": (_count, True), "seconds": (_amount, True)},
    "block": {"index": (_count, True), "drafted": (_token_ids, True), "accepted": (_count, True),
              "emitted": (_token_ids, True), "text": (lambda v: isinstance(v, str), True),
              "draft_ms": (_amount, False), "verify_ms": (_amount, False), "rollback_ms": (_amount, False)},
    "done": {"tokens": (_token_ids, True), "text": (lambda v: isinstance(v, str), True),
             "finish_reason": (lambda v: isinstance(v, str), True), "stats": (lambda v: isinstance(v, dict), False)},
    "error": {"message": (lambda v: isinstance(v, str), True)},
}


def check_event(entry: Any, where: str, timed: bool = True) -> None:
    """One trace entry: an engine event's fields, each of its type; "t" (seconds) when `timed`."""
    _check(isinstance(entry, dict), f"{where} is not an object")
    kind = entry.get("type")
    _check(isinstance(kind, str) and kind in _EVENTS, f"{where} is not an engine event")
    fields = _EVENTS[kind]
    for key, value in entry.items():
        if key in ("type", "t"):
            continue
        _check(key in fields, f"{where}: unknown field '{key}' in a {kind} event")
        _check(fields[key][0](value), f"{where}: bad '{key}' in a {kind} event")
    missing = [k for k, (_, required) in fields.items() if required and k not in entry]
    _check(not missing, f"{where}: a {kind} event without {', '.join(missing)}")
    if timed or "t" in entry:
        _check(_amount(entry.get("t")), f"{where} has a bad time")
    if kind == "block":
        _check(entry["accepted"] <= len(entry["drafted"]), f"{where}: accepted more tokens than were drafted")
        _check(len(entry["emitted"]) <= entry["accepted"] + 1, f"{where}: emitted more than accepted + 1 tokens")
    elif kind == "prefill":
        _check(entry["cached_tokens"] <= entry["prompt_tokens"], f"{where}: more cached tokens than prompt tokens")
    elif kind == "done":
        _check_fields(entry.get("stats") or {}, STATS, f"{where}: stats")


def check_trace(trace: Any, where: str) -> list[dict[str, Any]]:
    _check(isinstance(trace, list), f"{where}: trace is not a list")
    last = 0.0
    for i, entry in enumerate(trace):
        check_event(entry, f"{where}: trace entry {i}")
        _check(entry["t"] >= last - 1e-9, f"{where}: trace entry {i} goes back in time")
        last = entry["t"]
    return trace


# -- layouts ---------------------------------------------------------------------------------------
def _migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 (the first layout) nested the pair under "model" and kept untimed "events"."""
    model = data.get("model") or {}
    _check(isinstance(model, dict), "'model' is not an object")
    out = {k: v for k, v in data.items() if k != "model"}
    out.update(target=model.get("target", ""), draft=model.get("draft"), revision=0, schema_version=2)
    raw = data.get("messages")
    _check(raw is None or isinstance(raw, list), "'messages' is not a list")
    messages = []
    for i, m in enumerate(raw or []):
        _check(isinstance(m, dict), f"message {i} is not an object")
        events = m.get("events")
        if isinstance(events, list):
            for j, entry in enumerate(events):  # before timed_trace reads their timings
                check_event(entry, f"message {i}: event {j}", timed=False)
        messages.append({"role": m.get("role"), "content": m.get("content"),
                         "trace": timed_trace(events) if isinstance(events, list) else None})
    out["messages"] = messages
    return out


MIGRATIONS = {1: _migrate_v1}  # version n -> a dict in version n + 1


def check_session(data: Any, valid_id: Callable[[str], bool]) -> dict[str, Any]:
    """The session's data in the current layout, every field checked; raises ValueError saying what is wrong."""
    _check(isinstance(data, dict), "not a JSON object")
    _check(data.get("format") == FORMAT, "not a dflash-tui session (foreign JSON)")
    version = data.get("schema_version")
    _check(is_int(version) and version >= 1, "bad schema_version")
    if version > SCHEMA_VERSION:
        shown = version if version < 10**6 else "?"
        _fail(f"written by a newer dflash-tui (schema {shown}; this one reads up to {SCHEMA_VERSION})")
    check_values(data)
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    sid = data.get("id")
    _check(isinstance(sid, str) and valid_id(sid), "bad session id")
    for key in ("title", "created", "updated", "target"):
        _check(isinstance(data.get(key), str), f"'{key}' is missing or not text")
    for key in ("draft", "device"):
        _check(data.get(key) is None or isinstance(data.get(key), str), f"'{key}' must be text or null")
    baseline: Optional[float] = data.get("baseline_tps")
    _check(baseline is None or (is_number(baseline) and baseline > 0), "bad baseline_tps")
    settings = data.get("settings", {})
    _check(isinstance(settings, dict), "'settings' is not an object")
    _check_fields(settings, SETTINGS, "settings")
    token_text = data.get("token_text", {})
    _check(isinstance(token_text, dict), "'token_text' is not an object")
    for key, text in token_text.items():
        _check(key.isdigit() and key.isascii() and len(key) <= 10 and isinstance(text, str), "bad 'token_text' entry")
    revision = data.get("revision", 0)
    _check(_count(revision), "bad revision")
    messages = data.get("messages")
    _check(isinstance(messages, list), "'messages' is not a list")
    for i, m in enumerate(messages):
        where = f"message {i}"
        _check(isinstance(m, dict), f"{where} is not an object")
        _check(m.get("role") in ROLES, f"{where} has an unknown role")
        _check(isinstance(m.get("content"), str), f"{where} has no text")
        if m.get("trace") is not None:
            check_trace(m["trace"], where)
    return data
