"""OpenAI chat-completions requests in, responses and stream chunks out.

Every field a request may carry is checked here; anything out of range or of
the wrong type is a RequestError with one message (a 400), never a traceback.
Fields that would change the output in a way this server cannot honour
(n > 1, tools, logit_bias, penalties, logprobs) are refused rather than ignored.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from dflash_tui.engine.block_limit import refusal

ALONE = 'a request\'s "dflash": {"baseline": true} runs the target alone'  # the server's way, for a refusal of 1
MAX_STOPS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind


@dataclass
class Limits:
    """What the server allows a request."""

    model_ids: tuple[str, ...]  # names a request may give as `model`
    max_tokens_limit: int
    block_size: Union[int, str, None] = None  # --block-size: a request's default (None: the draft's own)
    spec_metrics: str = "summary"  # none | summary | detailed: vLLM's --per-request-spec-decode-metrics
    draft_block: int = 0  # the draft's trained block size, the most a request may ask for (0: no draft)


@dataclass
class ChatRequest:
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    blocks: bool = False  # the dflash stream extension: every engine event as it happens
    spec_metrics: str = "summary"
    block_size: Union[int, str, None] = None  # dflash.block_size; None: the server's default
    # dflash.baseline: the target alone, nothing drafted. Its metrics.speculative_decoding stays, with zero
    # steps and an all-zero histogram: vLLM's acceptance_metrics.md reports the object "with an all-zero
    # histogram if the request drafted nothing" whenever speculative decoding is enabled on the server
    baseline: bool = False

    def settings(self, block_size: Union[int, str, None] = None) -> Any:
        """The engine's settings; `block_size` is the server's default, which the request's own overrides."""
        from dflash_tui.engine.conversation import GenerationSettings

        block = self.block_size if self.block_size is not None else block_size
        return GenerationSettings(max_tokens=self.max_tokens, block_size=block, temperature=self.temperature,
                                  top_p=self.top_p, top_k=self.top_k, min_p=self.min_p, seed=self.seed,
                                  baseline=self.baseline)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(data: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = data.get(name)
    if v is None:
        return default
    if not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v):
        raise RequestError(f"'{name}' must be a number", param=name)
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be between {lo:g} and {hi:g}, not {v:g}", param=name)
    return float(v)


def _text(value: Any, where: str) -> str:
    """A message content: a string, or a list of text parts; must be valid Unicode."""
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}: only text content parts are supported", param="messages")
            parts.append(part["text"])
        value = "".join(parts)
    if not isinstance(value, str):
        raise RequestError(f"{where}: content must be a string or a list of text parts", param="messages")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a JSON \\ud800 escape
        raise RequestError(f"{where}: content is not valid Unicode text", param="messages") from None
    return value


def parse_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            shown = role if isinstance(role, str) and len(role) < 40 and role.isprintable() else "that role"
            raise RequestError(f"{where}: role must be system, developer, user or assistant, not {shown!r}", param="messages")
        if m.get("tool_calls") or m.get("function_call"):
            raise RequestError(f"{where}: tool calls are not supported", param="messages")
        out.append({"role": ROLES[role], "content": _text(m.get("content"), where)})
    return out


def _refuse_unsupported(data: dict) -> None:
    if data.get("n", 1) != 1:
        raise RequestError("'n' must be 1: one engine generates one choice", param="n")
    for name in ("tools", "functions", "logit_bias"):
        if data.get(name):
            raise RequestError(f"'{name}' is not supported by this server", param=name)
    if data.get("tool_choice") not in (None, "none"):
        raise RequestError("'tool_choice' is not supported by this server", param="tool_choice")
    if data.get("logprobs") or data.get("top_logprobs"):
        raise RequestError("'logprobs' is not supported by this server", param="logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if data.get(name) not in (None, 0, 0.0):
            raise RequestError(f"'{name}' is not supported: it would change the target's distribution", param=name)
    fmt = data.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise RequestError("'response_format' other than text is not supported", param="response_format")


def _max_tokens(data: dict, limit: int) -> int:
    a, b = data.get("max_tokens"), data.get("max_completion_tokens")
    if a is not None and b is not None and a != b:
        raise RequestError("'max_tokens' and 'max_completion_tokens' disagree", param="max_tokens")
    name, v = ("max_tokens", a) if a is not None else ("max_completion_tokens", b)
    if v is None:
        return limit
    if not _is_int(v) or v < 1:
        raise RequestError(f"'{name}' must be an integer >= 1", param=name)
    if v > limit:
        raise RequestError(f"'{name}' must be at most {limit} on this server", param=name)
    return v


def _stops(raw: Any) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise RequestError(f"'stop' may hold at most {MAX_STOPS} strings", param="stop")
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise RequestError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters", param="stop")
        _text(s, "stop")
    return list(stops)


@dataclass
class Extension:
    """The request's `dflash` object."""

    blocks: bool
    spec_metrics: str
    block_size: Union[int, str, None] = None
    baseline: bool = False


EXTENSION_KEYS = ("blocks", "detailed", "baseline", "block_size")


def _block_size(v: Any, draft_block: int) -> Union[int, str, None]:
    """`dflash.block_size` by the one rule of --block-size and /block (commands/common.py's
    `parse_block_size`, `block_limit.refusal`), in their words: "auto", 0 (the draft's own) or 2 up to
    the draft's own; 1 is refused with the way to run the target alone (`"baseline": true`)."""
    from dflash_tui.commands.common import BLOCK_SIZE_RULE, block_size_problem

    if v is None:
        return None  # the server's --block-size
    if v != "auto" and not _is_int(v):  # JSON's own types: "4", 4.0 or true is not a block size
        raise RequestError(f"'dflash.block_size' must be a number or \"auto\": {BLOCK_SIZE_RULE}", param="dflash")
    problem = block_size_problem(v, ALONE)
    if problem:
        raise RequestError(f"'dflash.block_size' {v}: {problem}", param="dflash")
    if v == 0:  # the draft's own, whatever the server's --block-size
        return draft_block or None
    if v != "auto" and not draft_block:
        raise RequestError(f"'dflash.block_size': block size {v} refused: this server has no draft: the target "
                           "runs alone, with no block to size (0 or auto)", param="dflash")
    if v != "auto" and (refused := refusal(v, draft_block)):
        raise RequestError(f"'dflash.block_size': {refused}", param="dflash")
    return v


def _dflash(raw: Any, limits: Limits) -> Extension:
    if raw is None:
        return Extension(False, limits.spec_metrics)
    if not isinstance(raw, dict) or set(raw) - set(EXTENSION_KEYS):
        raise RequestError("'dflash' must be an object with only 'blocks', 'detailed', 'baseline' (booleans) "
                           "and 'block_size' (\"auto\", 0 or a number from 2 up to the draft's own)", param="dflash")
    for key in ("blocks", "detailed", "baseline"):
        if not isinstance(raw.get(key, False), bool):
            raise RequestError(f"'dflash.{key}' must be true or false", param="dflash")
    return Extension(raw.get("blocks", False), "detailed" if raw.get("detailed") else limits.spec_metrics,
                     _block_size(raw.get("block_size"), limits.draft_block), raw.get("baseline", False))


def parse_chat_request(data: Any, limits: Limits) -> ChatRequest:
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    model = data.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise RequestError("'model' must be a string", param="model")
        if model not in limits.model_ids:
            raise RequestError(f"this server serves only '{limits.model_ids[0]}'; it does not load other models",
                               status=404, param="model", code="model_not_found")
    _refuse_unsupported(data)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", param="stream")
    options = data.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool)):
        raise RequestError("'stream_options' must be an object with a boolean 'include_usage'", param="stream_options")
    top_k = data.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise RequestError("'top_k' must be an integer >= 0 (or -1 for no limit)", param="top_k")
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0.0:
        raise RequestError("'top_p' must be greater than 0", param="top_p")
    seed = data.get("seed")
    if seed is not None and (not _is_int(seed) or not -1 <= seed < 1 << 64):  # a key takes 64 bits: no wrapping
        raise RequestError("'seed' must be an integer from 0 to 2^64 - 1 (or -1: none)", param="seed")
    if seed == -1:
        seed = None  # as --seed -1 and config.toml's seed = -1
    ext = _dflash(data.get("dflash"), limits)
    if ext.blocks and not stream:
        raise RequestError("'dflash.blocks' is a stream extension: it needs 'stream': true", param="dflash")
    return ChatRequest(
        messages=parse_messages(data.get("messages")),
        max_tokens=_max_tokens(data, limits.max_tokens_limit),
        temperature=_number(data, "temperature", 0.0, 0.0, 2.0),
        top_p=top_p,
        top_k=max(0, top_k or 0),
        min_p=_number(data, "min_p", 0.0, 0.0, 1.0),
        seed=seed,
        stop=_stops(data.get("stop")),
        stream=stream,
        include_usage=bool(stream and options and options.get("include_usage")),
        blocks=ext.blocks,
        spec_metrics=ext.spec_metrics,
        block_size=ext.block_size,
        baseline=ext.baseline,
    )


# -- responses -----------------------------------------------------------------
def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def error_body(message: str, kind: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion(cid: str, model: str, created: int, text: str, finish_reason: str, use: dict[str, Any],
               metrics: Optional[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason,
                     "logprobs": None}],
        "usage": use,
    }
    if metrics is not None:
        body["metrics"] = metrics
    return body


def chunk(cid: str, model: str, created: int, delta: Optional[dict[str, Any]], finish_reason: Optional[str] = None,
          **extra: Any) -> dict[str, Any]:
    """One stream chunk; delta None: a chunk with no choices (the usage chunk)."""
    body: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                                                   "logprobs": None}]}
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def now() -> int:
    return int(time.time())
