"""A remote engine: an OpenAI-compatible chat server turned into the engine's events.

From `dflash-tui serve` the events are the engine's own (its block-stream extension, rebuilt with
`event_from_dict`). From any other server they are made here: a Prefill when the first text comes
(its time is the time to first token), one Block per streamed piece of text with nothing drafted and
no token ids (the pane shows no row for it), and a Done with the figures the server gave: vLLM's
`metrics.speculative_decoding`, SGLang's `meta_info`, else its `/metrics` counters before and after.

Everything a server sends is checked; anything else ends the turn with one line (an Error event).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union
from urllib.parse import urlsplit, urlunsplit

try:  # huggingface_hub (a dependency already) brings httpx2, httpx's successor with the same API
    import httpx2 as httpx
except ImportError:  # pragma: no cover - an older environment
    import httpx  # type: ignore[no-redef]

from dflash_tui.engine.events import Block, Done, Error, Event, Prefill, event_from_dict
from dflash_tui.remote import figures as fig
from dflash_tui.remote.block_tally import BlockTally
from dflash_tui.remote.live_stream import LiveStream, Refused, Silence
from dflash_tui.remote.sse import StreamGarbage
from dflash_tui.session_schema import check_event

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0  # the longest silence before the reply starts (a busy server's queue, a long prefill)
STALL_TIMEOUT_S = 30.0  # the longest silence once it streams: no cycle or token takes this long
REFRESH_TIMEOUT_S = 2.0  # the figures read before a turn: a server that does not answer them at once is left to the turn
MAX_TOKEN_TEXTS = 1 << 18
MAX_ERROR_CHARS = 300


class RemoteError(Exception):
    """A server that cannot be used; the message is one line for the user."""


@dataclass
class RemoteTarget:
    url: str  # http(s)://host[:port][/prefix], without /v1
    api_key: Optional[str] = None
    model: Optional[str] = None  # None: the one the server lists (the first of several)


@dataclass
class ServerInfo:
    url: str  # public: no user, password or query
    model: str
    kind: str  # "dflash" (dflash-tui serve: block stream) | "openai" (any other)
    draft: bool = False
    block_size: int = 0  # the draft's own (trained) block size, the most /block may ask for; 0: unknown
    # the block size a request that names none runs with (the server's --block-size): "auto" or a size
    default_block: Union[int, str, None] = None
    models: list[str] = field(default_factory=list)
    has_metrics: bool = False  # /metrics answers with speculative counters
    # dflash-tui serve's probe after load (decode tok/s on one prompt): the target alone, then DFlash
    target_alone_tps: Optional[float] = None
    dflash_probe_tps: Optional[float] = None

    @property
    def where(self) -> str:
        host = urlsplit(self.url).netloc
        return f"dflash-tui serve at {host}" if self.kind == "dflash" else f"server at {host}"


def normalize_url(text: str) -> str:
    """`text` as a base URL (scheme, host, port, path prefix; a trailing /v1 dropped); ValueError if not one."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {text!r:.80}")
    try:
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise ValueError(f"bad port in {text!r:.80}") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def public_url(url: str) -> str:
    """The URL without what may be a secret (user, password, query): for the screen and session files."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _rate(value: Any) -> Optional[float]:
    """A tokens-per-second figure a server sent, if it is one."""
    return float(value) if type(value) in (int, float) and 0 < value < 1e7 else None


def _one_line(text: Any) -> str:
    line = (str(text).strip().splitlines() or [""])[0]
    return line[:MAX_ERROR_CHARS]


def _error_message(body: bytes) -> str:
    """The `error.message` of an OpenAI-style error body, else its first line."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        if text.startswith("<"):  # a web page's first line (<!DOCTYPE HTML>) says nothing
            return "a web page, not an API's error: is this an OpenAI-compatible server's address?"
        return _one_line(text) or "no message"
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message")
        if isinstance(err, str) and err.strip():
            return _one_line(err)
    return "no message"


class RemoteClient:
    """One server; used from one thread (the UI's engine thread)."""

    def __init__(self, target: RemoteTarget, read_timeout: float = READ_TIMEOUT_S,
                 connect_timeout: float = CONNECT_TIMEOUT_S, stall_timeout: float = STALL_TIMEOUT_S) -> None:
        self.target = target
        self.base = normalize_url(target.url)
        self.url = public_url(self.base)
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
                                 follow_redirects=False, trust_env=False)
        self.read_timeout = read_timeout
        self.stall_timeout = min(stall_timeout, read_timeout)
        self._live: Optional[LiveStream] = None  # the turn streaming now, for abort()
        self.info: Optional[ServerInfo] = None
        self.token_text: dict[int, str] = {}  # from the block stream: what each token id reads as

    def close(self) -> None:
        self.abort()
        self.http.close()

    def abort(self) -> None:
        """From any thread (the UI's Esc): the turn streaming now ends at once, as cancelled, and the
        connection is dropped so that the server stops generating."""
        live = self._live
        if live is not None:
            live.abort()

    # -- plain requests --------------------------------------------------------------
    def _get(self, path: str, timeout: Optional[float] = None) -> httpx.Response:
        try:
            return self.http.get(self.base + path, **({"timeout": timeout} if timeout else {}))
        except httpx.ConnectError:
            raise RemoteError(f"cannot reach {self.url}: nothing answers there") from None
        except httpx.TimeoutException:
            raise RemoteError(f"{self.url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise RemoteError(f"{self.url}: {_one_line(exc) or type(exc).__name__}") from None

    def refresh_figures(self) -> bool:
        """Read a dflash-tui server's figures again (a restarted server measures its probe anew); True if
        they changed. A server that now serves another pair keeps none: they would compare other things."""
        old = self.info
        if old is None or old.kind != "dflash":
            return False
        try:
            new = self._served(REFRESH_TIMEOUT_S)
        except RemoteError:  # down, changed or slow: the turn itself says so
            return False
        if (new.model, new.draft, new.block_size, new.default_block) != (old.model, old.draft, old.block_size,
                                                                        old.default_block):
            new.target_alone_tps = new.dflash_probe_tps = None
        changed = (new.target_alone_tps, new.dflash_probe_tps) != (old.target_alone_tps, old.dflash_probe_tps)
        old.target_alone_tps, old.dflash_probe_tps = new.target_alone_tps, new.dflash_probe_tps
        return changed

    def connect(self) -> ServerInfo:
        """Ask the server what it serves (GET /v1/models); RemoteError in one line if it cannot be used."""
        self.info = self._served()
        return self.info

    def _served(self, timeout: Optional[float] = None) -> ServerInfo:
        """What GET /v1/models says the server serves (RemoteError in one line if it cannot be used)."""
        r = self._get("/v1/models", timeout)
        if r.status_code >= 500 and self.target.model:  # a server whose list is broken can still chat
            return ServerInfo(self.url, self.target.model, "openai")
        if r.status_code in (401, 403):
            raise RemoteError(f"{self.url} wants an API key (--api-key, or api_key in config.toml): "
                              f"{_error_message(r.content)}")
        if r.status_code == 404:  # every OpenAI-compatible server lists its models there
            raise RemoteError(f"{self.url} is not an OpenAI-compatible server (nothing at /v1/models: 404), "
                              "or not its base address")
        if r.status_code != 200:
            raise RemoteError(f"{self.url}/v1/models answered {r.status_code}: {_error_message(r.content)}")
        try:
            listed = r.json().get("data")
        except (ValueError, AttributeError):
            listed = None
        if not isinstance(listed, list):
            raise RemoteError(f"{self.url} is not an OpenAI-compatible server (/v1/models is not a model list)")
        entries = {m["id"]: m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)}
        wanted = self.target.model
        if wanted:
            if entries and wanted not in entries:
                names = ", ".join(list(entries)[:5])
                raise RemoteError(f"{self.url} does not serve {wanted!r}; it lists {names}")
            model = wanted
        elif entries:
            model = next(iter(entries))
        else:
            raise RemoteError(f"{self.url} lists no model; name one with --model")
        ext = entries.get(model, {}).get("dflash")
        info = ServerInfo(self.url, model, "dflash" if isinstance(ext, dict) else "openai", models=list(entries))
        if isinstance(ext, dict):
            info.draft = ext.get("draft") is True
            spec = ext.get("num_spec_tokens")  # the server's own block size - 1 (its --block-size, if a size)
            served = spec + 1 if type(spec) is int and 0 <= spec < 1024 else 0
            own = ext.get("draft_block_size")  # the draft's trained size, where the server reports it
            info.block_size = own if type(own) is int and 0 < own <= 1024 else served
            default = ext.get("block_size")  # the server's --block-size, where it reports it
            info.default_block = default if default == "auto" or (type(default) is int and 0 < default <= 1024) \
                else served or None
            probe = ext.get("probe") if isinstance(ext.get("probe"), dict) else {}
            info.target_alone_tps = _rate(probe.get("target_alone_tps"))
            info.dflash_probe_tps = _rate(probe.get("dflash_tps")) if info.target_alone_tps else None
        else:
            info.has_metrics = self._counters() is not None
        return info

    def _counters(self) -> Optional[dict[str, float]]:
        try:
            r = self.http.get(self.base + "/metrics", timeout=CONNECT_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        if r.status_code != 200 or len(r.content) > 16 << 20:
            return None
        counters = fig.parse_counters(r.text)
        return counters or None

    # -- a chat turn -------------------------------------------------------------------
    def request_body(self, messages: list[dict[str, str]], settings: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.info.model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True},
                                "max_tokens": settings.get("max_tokens") or 512,
                                "temperature": settings.get("temperature", 0.0), "top_p": settings.get("top_p", 1.0)}
        for key in ("top_k", "min_p"):  # not OpenAI's own: sent only when they change something
            if settings.get(key):
                body[key] = settings[key]
        if settings.get("seed") is not None:
            body["seed"] = settings["seed"]
        if self.info.kind == "dflash":  # dflash-tui serve: the TUI's block size and /baseline go too
            ext: dict[str, Any] = {"blocks": True, "detailed": True}
            if settings.get("baseline"):
                ext["baseline"] = True
            block = settings.get("block_size")
            if self.info.draft and (block == "auto" or (type(block) is int and block >= 0)):
                ext["block_size"] = block  # 0: the draft's own; None: nothing sent, the server's own applies
            body["dflash"] = ext
        return body

    def _tally(self, body: dict[str, Any]) -> BlockTally:
        """The figures a stopped reply of this request ends with, as the engine would give them."""
        ext = body.get("dflash", {})
        mode = "baseline" if ext.get("baseline") or not self.info.draft else "dflash"
        block = ext.get("block_size", self.info.default_block)
        if block == 0:
            block = self.info.block_size or None
        temperature = body.get("temperature") or 0.0
        return BlockTally(mode, block, temperature, body.get("seed") if temperature > 0 else None)

    def chat(self, messages: list[dict[str, str]], settings: dict[str, Any],
             should_cancel: Callable[[], bool] = lambda: False, idle_s: Optional[float] = None) -> Iterator[Optional[Event]]:
        """Stream one reply as events; it always ends with a Done or an Error (never raises for the server).
        With `idle_s`, a None comes after each `idle_s` of silence."""
        if self.info is None:
            yield Error("not connected to a server")
            return
        before = self._counters() if self.info.has_metrics else None
        started = time.perf_counter()
        body = self.request_body(messages, settings)
        live = LiveStream(lambda: self.http.stream("POST", self.base + "/v1/chat/completions", json=body),
                          self.read_timeout, self.stall_timeout)
        self._live = live.start()
        finished = False  # the stream ended as streams do: its reader may read it to the end
        try:
            lines = live.lines(should_cancel, idle_s)
            if self.info.kind == "dflash":
                yield from self._dflash_events(live, lines, should_cancel, self._tally(body))
            else:
                yield from self._openai_events(live, lines, should_cancel, started, before)
            finished = not should_cancel()
        except Refused as exc:
            yield Error(f"the server refused the request ({exc.status}): {_error_message(exc.body)}")
        except Silence as exc:
            yield Error(f"the server sent nothing for {exc.seconds:.0f} s"
                        + (" mid-reply" if exc.replying else "") + "; the turn was given up")
        except httpx.TimeoutException:
            yield Error(f"the server sent nothing for {self.read_timeout:.0f} s; the turn was given up")
        except httpx.ConnectError:
            yield Error(f"cannot reach {self.url}: nothing answers there")
        except StreamGarbage as exc:
            yield Error(f"the server's stream is broken ({exc})")
        except httpx.HTTPError as exc:
            if should_cancel():  # the stop itself cut the connection
                yield Error("the turn was stopped")
            else:
                yield Error(f"the connection to {self.url} broke: {_one_line(exc) or type(exc).__name__}")
        finally:
            self._live = None
            if not finished:  # stopped, broken or given up: hang up, so that the server stops too
                live.abort()

    @staticmethod
    def _chunk(data: str) -> dict[str, Any]:
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise StreamGarbage(f"a chunk that is not JSON: {_one_line(data)[:60]!r}") from None
        if not isinstance(chunk, dict):
            raise StreamGarbage("a chunk that is not a JSON object")
        return chunk

    def _dflash_events(self, live: LiveStream, lines: Iterator[Optional[str]], should_cancel: Callable[[], bool],
                       tally: BlockTally) -> Iterator[Optional[Event]]:
        for data in lines:
            if data is None:
                yield None
                continue
            if data.strip() == "[DONE]":
                break
            chunk = self._chunk(data)
            if "error" in chunk:
                yield Error(f"the server: {_error_message(data.encode())}")
                return
            ext = chunk.get("dflash")
            if not isinstance(ext, dict) or "event" not in ext:
                continue
            raw = ext["event"]
            try:
                check_event(raw, timed=False)
                ev = event_from_dict(raw)
            except ValueError as exc:
                raise StreamGarbage(f"a block event that does not check: {exc}") from None
            live.replying = True
            tally.add(ev)
            if isinstance(ev, Block):
                self._remember(ev.drafted, ext.get("drafted_text"))
                self._remember(ev.emitted, ext.get("emitted_text"))
            if isinstance(ev, Done):
                ev.stats["server"] = self.url
                yield ev
                return
            yield ev
            if should_cancel():
                break
        if should_cancel():  # stopped (Esc): what came is the reply, with the figures of what came
            yield tally.done("cancelled", server=self.url)
        else:
            yield Error("the server closed the stream before the reply was finished")

    def _remember(self, ids: list[int], texts: Any) -> None:
        if not isinstance(texts, list) or len(texts) != len(ids) or len(self.token_text) >= MAX_TOKEN_TEXTS:
            return
        for i, t in zip(ids, texts):
            if isinstance(t, str) and len(t) <= 256:
                self.token_text[i] = t

    def _openai_events(self, live: LiveStream, lines: Iterator[Optional[str]], should_cancel: Callable[[], bool],
                       started: float, before: Optional[dict[str, float]]) -> Iterator[Optional[Event]]:
        text_parts: list[str] = []
        pieces = 0
        first_at = last_at = None
        finish: Optional[str] = None
        usage: dict[str, Any] = {}
        found: Optional[fig.SpecFigures] = None
        ended = False
        for data in lines:
            if data is None:
                yield None
                continue
            if data.strip() == "[DONE]":
                ended = True
                break
            chunk = self._chunk(data)
            if "error" in chunk:
                yield Error(f"the server: {_error_message(data.encode())}")
                return
            found = fig.from_vllm(chunk.get("metrics")) or fig.from_sglang(chunk.get("meta_info")) or found
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            choices = chunk.get("choices")
            choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
            found = fig.from_sglang(choice.get("meta_info")) or found
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                now = time.perf_counter()
                live.replying = True
                if first_at is None:
                    first_at = now
                    yield Prefill(0, 0, now - started)
                last_at = now
                text_parts.append(content)
                yield Block(pieces, [], 0, [], content)
                pieces += 1
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
            if should_cancel():
                break
        if should_cancel():  # stopped (Esc), also while the server was silent
            finish = "cancelled"
        if finish is None:
            got = sum(len(p) for p in text_parts)
            yield Error("the server closed the stream " + (f"mid-reply ({got} characters came)" if got or not ended
                                                          else "without a reply"))
            return
        if found is None and before is not None and finish != "cancelled":
            after = self._counters()
            found = fig.from_counters(before, after) if after is not None else None
        counted = usage.get("completion_tokens")
        tokens = counted if type(counted) is int and counted >= 0 else pieces
        stats: dict[str, Any] = {"mode": "remote", "server": self.url, "generated_tokens": tokens,
                                 "tokens_counted": "usage" if tokens is counted else "chunks"}
        prompt = usage.get("prompt_tokens")
        if type(prompt) is int and prompt >= 0:
            stats["prompt_tokens"] = prompt
        if first_at is not None:
            stats["ttft_s"] = first_at - started
            if last_at is not None and last_at > first_at and tokens > 1:
                stats["decode_s"] = last_at - first_at
                stats["decode_tps"] = (tokens - 1) / (last_at - first_at)
        stats.update(found.to_stats() if found is not None else {"spec_source": "none"})
        yield Done([], "".join(text_parts), finish if finish in ("stop", "length", "cancelled") else "stop", stats)
