"""What a session file may hold: every field's type and range, checked before anything uses it.

`check_session(data)` takes parsed JSON, migrates an older layout, and returns
it as the current layout, or raises ValueError saying what is wrong. Schema 3
holds the messages as a tree (see session_tree and docs/sessions.md); a schema
1 or 2 file becomes a tree of one branch in memory, and its file is rewritten
only by the next save. A file
that passes can be listed, shown, exported and replayed without surprises:
counts are whole numbers in range, times are finite, texts are text, token ids
are ids, and every text is valid Unicode.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional

from dflash_tui.session_trace import timed_trace
from dflash_tui.session_tree import check_tree, linear

FORMAT = "dflash-tui-session"
SCHEMA_VERSION = 3
ROLES = ("system", "user", "assistant")
MAX_INT = 2**53  # no count, size or id from a real run comes near this; JSON readers agree up to here
MAX_TOKEN_ID = 2**31 - 1
# a sampling seed: the engine drew 64-bit ones before it drew 31-bit ones, and a seed given through the API
# is recorded modulo 2^64 (engine/sampling.KeyStream), so a file may hold any seed below 2^64
MAX_SEED = 2**64
MAX_BLOCK = 1025  # the largest block: a server may speculate up to 1024 tokens a step (remote/client.py)


def _fail(what: str) -> None:
    raise ValueError(what)


def _check(cond: bool, what: str) -> None:
    if not cond:
        _fail(what)


# type() is, not isinstance: a bool is an int to isinstance, and these run on every value of a file
def is_int(v: Any) -> bool:
    return type(v) is int and -MAX_INT <= v <= MAX_INT


def is_number(v: Any) -> bool:
    # a float as large as 1e300 is finite, and prints as 300 digits wherever a figure is shown
    kind = type(v)
    return (kind is int or (kind is float and math.isfinite(v))) and -MAX_INT <= v <= MAX_INT


def _text(v: Any) -> bool:
    return type(v) is str


def _count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_INT


def _amount(v: Any) -> bool:
    return is_number(v) and v >= 0


# tok/s a run can show: 0 (too short to time) or within these; a rate of 1e-300 made a 300-digit speedup
MIN_RATE, MAX_RATE = 1e-3, 1e9


def _is_time(text: str) -> bool:
    from datetime import datetime

    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return len(text) <= 40


def _rate(v: Any) -> bool:
    return is_number(v) and (v == 0 or MIN_RATE <= v <= MAX_RATE)


def _sampling(key: str) -> Callable[[Any], bool]:
    """A sampling setting within what the app takes for it (config.toml's and the slash commands' range)."""
    def ok(v: Any) -> bool:
        from dflash_tui.config import VALIDATORS, BadValue

        try:
            return is_number(v) and VALIDATORS[key](v) is not None
        except BadValue:
            return False

    return ok


def _token_ids(v: Any) -> bool:
    return type(v) is list and all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in v)


def _seed(v: Any) -> bool:
    return type(v) is int and -MAX_INT <= v < MAX_SEED


def _block_size(v: Any) -> bool:
    return v is None or v == "auto" or _count(v)


def _scalar(v: Any) -> bool:
    return v is None or type(v) in (bool, str) or is_number(v)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


# -- every value, whatever its place ---------------------------------------------------
def check_values(data: Any) -> None:
    """Every text valid Unicode and every number finite: the JSON encoder's pass, as a save would make."""
    try:
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        _fail("text with a lone surrogate (not valid Unicode)")
    except ValueError:
        _fail("a number that is not finite (NaN or Infinity)")
    except RecursionError:
        _fail("nested too deep")


# -- fields by type --------------------------------------------------------------------------
SAMPLING = ("temperature", "top_p", "min_p")
# the settings a session records (GenerationSettings); others must be plain values
SETTINGS: dict[str, Callable[[Any], bool]] = {
    "max_tokens": _opt(_count), "block_size": _block_size, **{k: _opt(_sampling(k)) for k in SAMPLING},
    "top_k": _opt(_count), "seed": _opt(_seed), "baseline": _opt(lambda v: type(v) is bool),
    "prefill_chunk": _opt(_count), "mode": _opt(_text),
}
# the figures a reply's Done carries; the views do arithmetic on every one of them (None too is refused)
STATS: dict[str, Callable[[Any], bool]] = {
    **{k: _count for k in ("generated_tokens", "cycles", "prompt_tokens", "cached_tokens", "peak_memory", "max_tokens",
                            "top_k")},
    **{k: _amount for k in ("tokens_per_cycle", "acceptance", "ttft_s", "prefill_s", "decode_s", "draft_ms",
                            "verify_ms", "rollback_ms")},
    **{k: _rate for k in ("decode_tps", "prefill_tps", "baseline_tps")},
    **{k: _sampling(k) for k in SAMPLING},
    "mode": _opt(_text), "block_size": _block_size, "seed": _opt(_seed),
    "block_sizes": lambda v: type(v) is dict and all(_scalar(x) for x in v.values()),
    # a remote server's per-step counts: [accepted, drafted] of each verification step
    "spec_steps": lambda v: type(v) is list and all(
        type(p) is list and len(p) == 2 and _count(p[0]) and _count(p[1]) and p[0] <= p[1] for p in v),
}


def _check_fields(data: dict[str, Any], known: dict[str, Callable[[Any], bool]], where: str) -> None:
    for key, value in data.items():
        check = known.get(key)
        if not (check(value) if check is not None else _scalar(value)):
            _fail(f"{where}: bad value for '{key}'")


# -- events -------------------------------------------------------------------------------------
# type -> {field: check}, every field of the engine's event dataclasses; and the ones without a default
_EVENTS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "prefill": {"prompt_tokens": _count, "cached_tokens": _count, "seconds": _amount},
    "block": {"index": _count, "drafted": _token_ids, "accepted": _count, "emitted": _token_ids, "text": _text,
              "draft_ms": _amount, "verify_ms": _amount, "rollback_ms": _amount, "eos": lambda v: type(v) is bool},
    "done": {"tokens": _token_ids, "text": _text, "finish_reason": _text, "stats": lambda v: type(v) is dict},
    "error": {"message": _text},
}
_REQUIRED = {"prefill": ("prompt_tokens", "cached_tokens", "seconds"),
             "block": ("index", "drafted", "accepted", "emitted", "text"),
             "done": ("tokens", "text", "finish_reason"), "error": ("message",)}


_BLOCK_KEYS = frozenset(("type", "t", *_EVENTS["block"]))


def _fine_block(e: dict[str, Any]) -> bool:
    """The common case, a well-formed timed block, in one expression (a long reply has thousands)."""
    drafted, emitted, accepted = e.get("drafted"), e.get("emitted"), e.get("accepted")
    return (_BLOCK_KEYS.issuperset(e) and _count(e.get("index")) and _token_ids(drafted) and _token_ids(emitted)
            and type(accepted) is int and 0 <= accepted <= len(drafted) and len(emitted) <= accepted + 1
            and type(e.get("text")) is str and _amount(e.get("t")) and _amount(e.get("draft_ms", 0.0))
            and _amount(e.get("verify_ms", 0.0)) and _amount(e.get("rollback_ms", 0.0))
            and type(e.get("eos", False)) is bool)


def check_event(entry: Any, timed: bool = True) -> None:
    """One trace entry: an engine event's fields, each of its type; "t" (seconds) when `timed`.
    Raises ValueError saying what is wrong (the caller says where)."""
    if timed and type(entry) is dict and entry.get("type") == "block" and _fine_block(entry):
        return
    if type(entry) is not dict:
        _fail("not an object")
    kind = entry.get("type")
    fields = _EVENTS.get(kind) if type(kind) is str else None
    if fields is None:
        _fail("not an engine event")
    for key, value in entry.items():
        if key == "type" or key == "t":
            continue
        check = fields.get(key)
        if check is None:
            _fail(f"unknown field '{key}' in a {kind} event")
        if not check(value):
            _fail(f"bad '{key}' in a {kind} event")
    for key in _REQUIRED[kind]:
        if key not in entry:
            _fail(f"a {kind} event without '{key}'")
    if (timed or "t" in entry) and not _amount(entry.get("t")):
        _fail("a bad time")
    if kind == "block":
        _check(entry["accepted"] <= len(entry["drafted"]), "accepted more tokens than were drafted")
        _check(len(entry["emitted"]) <= entry["accepted"] + 1, "emitted more than accepted + 1 tokens")
    elif kind == "prefill":
        _check(entry["cached_tokens"] <= entry["prompt_tokens"], "more cached tokens than prompt tokens")
    elif kind == "done":
        stats = entry.get("stats") or {}
        _check_fields(stats, STATS, "stats")
        _check(_figures_possible(stats), "stats: figures no run can give (acceptance over 100%, or more tokens "
                                         "per cycle than a block holds)")


def _figures_possible(stats: dict[str, Any]) -> bool:
    """Acceptance is a share of the drafted tokens; a cycle emits at most its block (a fixed size's, else
    the largest any entry point takes)."""
    block = stats.get("block_size")
    cap = block if type(block) is int and block > 0 else MAX_BLOCK
    return stats.get("acceptance", 0) <= 1 and stats.get("tokens_per_cycle", 0) <= cap


def check_trace(trace: Any, where: str) -> list[dict[str, Any]]:
    _check(type(trace) is list, f"{where}: trace is not a list")
    last = 0.0
    for i, entry in enumerate(trace):
        try:
            check_event(entry)
            _check(entry["t"] >= last - 1e-9, "goes back in time")
        except ValueError as exc:
            raise ValueError(f"{where}: trace entry {i}: {exc}") from None
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
                try:
                    check_event(entry, timed=False)
                except ValueError as exc:
                    raise ValueError(f"message {i}: event {j}: {exc}") from None
        messages.append({"role": m.get("role"), "content": m.get("content"),
                         "trace": timed_trace(events) if isinstance(events, list) else None})
    out["messages"] = messages
    return out


def _migrate_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 kept one list of messages: it becomes the tree's one branch, all in view."""
    raw = data.get("messages")
    _check(isinstance(raw, list), "'messages' is not a list")
    for i, m in enumerate(raw):
        _check(isinstance(m, dict), f"message {i} is not an object")
    out = dict(data, schema_version=3)
    out.update(linear([{k: v for k, v in m.items() if k not in ("id", "parent", "children")} for m in raw]))
    return out


MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2}  # version n -> a dict in version n + 1


def check_session(data: Any, valid_id: Callable[[str], bool], values_checked: bool = False) -> dict[str, Any]:
    """The session's data in the current layout, every field checked; raises ValueError saying what is wrong.
    `values_checked`: the reader already knows every text is valid Unicode and every number finite."""
    _check(isinstance(data, dict), "not a JSON object")
    _check(data.get("format") == FORMAT, "not a dflash-tui session (foreign JSON)")
    version = data.get("schema_version")
    _check(is_int(version) and version >= 1, "bad schema_version")
    if version > SCHEMA_VERSION:
        _fail(f"written by a newer dflash-tui (schema {version}; this one reads up to {SCHEMA_VERSION})")
    if not values_checked:
        check_values(data)
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    sid = data.get("id")
    _check(isinstance(sid, str) and valid_id(sid), "bad session id")
    for key in ("title", "created", "updated", "target"):
        _check(isinstance(data.get(key), str), f"'{key}' is missing or not text")
    for key in ("created", "updated"):  # the list sorts by them: "9999-99-99" would sit first forever
        _check(_is_time(data[key]), f"'{key}' is not a date and time (ISO 8601)")
    for key in ("draft", "device", "server"):
        _check(data.get(key) is None or isinstance(data.get(key), str), f"'{key}' must be text or null")
    baseline: Optional[float] = data.get("baseline_tps")
    _check(baseline is None or (_rate(baseline) and baseline > 0), "bad baseline_tps")
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
        _check(isinstance(m, dict), f"message {i} is not an object")
    check_tree(messages, data.get("roots"), data.get("view"))
    for m in messages:
        where = f"message {m['id']}"
        _check(m.get("role") in ROLES, f"{where} has an unknown role")
        _check(isinstance(m.get("content"), str), f"{where} has no text")
        if m.get("trace") is not None:
            check_trace(m["trace"], where)
    return data
