"""The HTTP routes (Starlette): chat completions, models, health, metrics.

Every failure a client can cause is an OpenAI-style JSON error with one
message; an unexpected one is a 500 that says only "internal server error"
(the traceback goes to the server's log, never to the client).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from dflash_tui.engine.events import Block, Done, Prefill, event_to_dict
from dflash_tui.server import openai_format as fmt
from dflash_tui.server.engine_thread import END, SHUTTING_DOWN, EngineGone, EngineThread, Job, QueueFull
from dflash_tui.server.metrics import ServerMetrics
from dflash_tui.server.openai_format import Limits, RequestError
from dflash_tui.server.reply import Reply
from dflash_tui.server.signals import chain_exit_signals

log = logging.getLogger("dflash_tui.server")
MAX_BODY_BYTES = 1 << 20  # 1 MiB of JSON is far more than any context this engine serves


@dataclass
class ServerConfig:
    engine: EngineThread
    metrics: ServerMetrics
    limits: Limits
    model_id: str
    api_key: Optional[str] = None
    max_body_bytes: int = MAX_BODY_BYTES


def error(status: int, message: str, kind: str = "invalid_request_error", param: Optional[str] = None,
          code: Optional[str] = None, headers: Optional[dict[str, str]] = None) -> JSONResponse:
    return JSONResponse(fmt.error_body(message, kind, param, code), status_code=status, headers=headers)


class TokenTexts:
    """Token id -> its own text, cached (the block extension sends every drafted token's text)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[str]:
        out = []
        for i in ids:
            text = self._cache.get(i)
            if text is None:
                try:
                    text = self._tokenizer.decode([i])
                except Exception:  # an id the tokenizer does not know
                    text = f"<{i}>"
                if len(self._cache) < 1 << 18:
                    self._cache[i] = text
            out.append(text)
        return out


class JobStream(StreamingResponse):
    """A stream that stops its job however it ends, even if it never started to iterate."""

    def __init__(self, job: Job, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def build_app(cfg: ServerConfig) -> Starlette:
    token_texts = TokenTexts(cfg.engine.tokenizer)

    def exit_signal() -> None:  # Ctrl+C or SIGTERM: stop the engine now, so every open request ends at once
        cfg.engine.begin_stop()

    def unfinished() -> str:
        """Why a reply ended before its finish reason: the shutdown, or a cancel."""
        return SHUTTING_DOWN if cfg.engine.stopping else "the generation was stopped before it finished"

    def authorized(request: Request) -> bool:
        if cfg.api_key is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), cfg.api_key.encode())

    def refused(request: Request) -> Optional[Response]:
        if authorized(request):
            return None
        return error(401, "a valid API key is needed: Authorization: Bearer <key>", code="invalid_api_key",
                     headers={"WWW-Authenticate": "Bearer"})

    async def health(request: Request) -> Response:
        running, waiting = cfg.engine.counts()
        body = {"status": "ok", "model": cfg.model_id, "running": running, "waiting": waiting}
        distributed = getattr(cfg.engine, "distributed", None)  # serve --distributed: {"ranks", "parallel"}
        return JSONResponse({**body, "distributed": distributed} if distributed else body)

    async def models(request: Request) -> Response:
        if (r := refused(request)) is not None:
            return r
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.model_id, "object": "model", "created": 0, "owned_by": "dflash-tui",
            "dflash": {"draft": cfg.engine.draft is not None, "num_spec_tokens": cfg.engine.num_spec_tokens,
                       # the draft's trained size (what a request's block_size may reach; 0: no draft) and the
                       # server's --block-size (what a request that names none gets; null: the draft's own)
                       "draft_block_size": cfg.engine.draft_block, "block_size": cfg.engine.block_size,
                       # decode tok/s on the probe's prompt after load (null: not measured): a remote TUI's baseline
                       "probe": {"target_alone_tps": cfg.engine.target_alone_tps,
                                 "dflash_tps": cfg.engine.dflash_probe_tps},
                       **({"distributed": cfg.engine.distributed} if getattr(cfg.engine, "distributed", None) else {})},
        }]})

    async def metrics(request: Request) -> Response:
        if (r := refused(request)) is not None:
            return r
        return PlainTextResponse(cfg.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def chat_completions(request: Request) -> Response:
        if (r := refused(request)) is not None:
            return r
        chain_exit_signals(exit_signal, asyncio.get_running_loop())  # uvicorn's handler is in force by now
        try:
            data = await read_json(request, cfg.max_body_bytes)
            req = fmt.parse_chat_request(data, cfg.limits)
            prompt, limit = await run_in_threadpool(prompt_ids, cfg.engine, req.messages)
        except RequestError as exc:
            return error(exc.status, exc.message, exc.kind, exc.param, exc.code)
        settings = req.settings(cfg.limits.block_size)
        if limit is not None:  # the reply stops at the end of the model's context ("length")
            settings.max_tokens = min(settings.max_tokens, max(1, limit - len(prompt)))
        job = Job(prompt, settings, asyncio.get_running_loop())
        try:
            cfg.engine.submit(job)
        except QueueFull:
            cfg.metrics.reject("queue_full")
            return error(429, f"the server is busy: {cfg.engine.max_queue} requests are already waiting; retry later",
                         kind="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        except EngineGone:
            return error(503, SHUTTING_DOWN, kind="server_error")
        reply = Reply(job.arrived, len(prompt), cfg.engine.num_spec_tokens, req.stop, token_texts)
        cid, created = fmt.completion_id(), fmt.now()
        if req.stream:
            return JobStream(job, stream(job, req, reply, cid, created), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await complete(request, job, req, reply, cid, created)

    async def complete(request: Request, job: Job, req: fmt.ChatRequest, reply: Reply, cid: str, created: int) -> Response:
        watcher = asyncio.create_task(cancel_on_disconnect(request, job))
        try:
            async for ev in events(job):
                reply.on_event(ev)
                if reply.cut:
                    job.cancel("stop")
                    break
        finally:
            watcher.cancel()
            job.cancel()  # a no-op once the job has ended; stops it if this handler was cancelled
        if reply.error is not None:
            return engine_error(reply.error)
        if reply.finish_reason not in ("stop", "length"):
            return error(503, unfinished(), kind="server_error")
        use = fmt.usage(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
        return JSONResponse(fmt.completion(cid, cfg.model_id, created, reply.text, reply.finish_reason, use,
                                           reply.metrics(req.spec_metrics)))

    async def stream(job: Job, req: fmt.ChatRequest, reply: Reply, cid: str, created: int) -> AsyncIterator[str]:
        model = cfg.model_id
        try:
            yield sse(fmt.chunk(cid, model, created, {"role": "assistant", "content": ""}))
            async for ev in events(job):
                text = reply.on_event(ev)
                if reply.error is not None:
                    break
                if reply.cut:
                    job.cancel("stop")  # at once: the engine stops within the cycle under way
                parts: list[Any] = []  # the events the block extension sends now, in order
                if req.blocks:
                    parts = [ev] if isinstance(ev, Prefill) else list(reply.released)
                    if reply.cut:  # the block stream ends with its Done, as an uncut one does
                        parts.append(reply.cut_done(await engine_done(job)))
                    elif isinstance(ev, Done):
                        parts.append(ev)
                if text or parts:  # the text goes with the first of them, before any finishing chunk
                    yield sse(fmt.chunk(cid, model, created, {"content": text} if text else {},
                                        dflash=block_extension(parts[0], req) if parts else None))
                    for part in parts[1:]:
                        yield sse(fmt.chunk(cid, model, created, {}, dflash=block_extension(part, req)))
                if isinstance(ev, Done) or reply.cut:
                    break
            if reply.error is not None:
                yield sse(fmt.error_body(public_error(reply.error), "server_error"))
            elif reply.finish_reason in ("stop", "length"):
                figures = reply.metrics(req.spec_metrics)
                yield sse(fmt.chunk(cid, model, created, {}, reply.finish_reason, metrics=figures))
                if req.include_usage:
                    use = fmt.usage(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
                    yield sse(fmt.chunk(cid, model, created, None, usage=use, metrics=figures))
            else:
                yield sse(fmt.error_body(unfinished(), "server_error"))
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # the client went away (or the reply is complete): the engine stops within a cycle

    def block_extension(ev: Any, req: fmt.ChatRequest) -> Optional[dict[str, Any]]:
        if not req.blocks:
            return None
        out: dict[str, Any] = {"event": event_to_dict(ev)}
        if isinstance(ev, Block):
            out["drafted_text"] = token_texts(ev.drafted)
            out["emitted_text"] = token_texts(ev.emitted)
        return out

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = {404: "no such endpoint", 405: "method not allowed on this endpoint"}.get(status, "bad request")
        return error(status, message)

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error while serving %s", request.url.path)
        return error(500, "internal server error", kind="server_error")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found, Exception: internal})


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, at most `limit` bytes; a RequestError for anything else."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestError(f"the request body is larger than {limit} bytes", status=413)
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise RequestError(f"the request body is larger than {limit} bytes", status=413)
    except ClientDisconnect:  # nobody will read the answer
        raise RequestError("the client went away before sending the whole body") from None
    if not body:
        raise RequestError("the request body is empty; send a JSON object")
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting or numbers
        raise RequestError("the request body is not valid JSON") from None


def prompt_ids(engine: EngineThread, messages: list[dict[str, str]]) -> tuple[list[int], Optional[int]]:
    """Messages through the chat template, and the model's context in tokens (None: unknown); the
    context is checked here, before the queue."""
    from dflash_tui.engine.conversation import context_length

    conversation = engine.conversation  # None once the engine has stopped and let the pair go
    try:
        if conversation is None:
            raise EngineGone()
        prompt = engine.prompt_ids(messages)
    except Exception as exc:  # the chat template refused the messages (a template's raise_exception)
        if engine.stopping:  # Ctrl+C while the template ran: the pair may be gone
            raise RequestError(SHUTTING_DOWN, status=503, kind="server_error") from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise RequestError(f"the chat template refused these messages: {first}", param="messages") from None
    limit = context_length(conversation.target)
    if limit is not None and len(prompt) >= limit:
        raise RequestError(f"the prompt is {len(prompt)} tokens; the model's context is {limit} tokens",
                           param="messages", code="context_length_exceeded")
    return prompt, limit


async def events(job: Job) -> AsyncIterator[Any]:
    while True:
        ev = await job.events.get()
        if ev is END:
            return
        yield ev


async def engine_done(job: Job) -> dict[str, Any]:
    """After a cut: the stats of the engine's own Done (it comes within the cycle under way), or none."""
    async for ev in events(job):
        if isinstance(ev, Done):
            return dict(ev.stats)
    return {}


async def cancel_on_disconnect(request: Request, job: Job) -> None:
    """Wait for the client to hang up; then stop its generation."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def public_error(message: str) -> str:
    return (message.strip().splitlines() or ["generation failed"])[0][:300]


def engine_error(message: str) -> Response:
    """An engine Error event as a response: the engine's own words, one line."""
    if message.startswith("generation failed"):
        return error(500, public_error(message), kind="server_error")
    if message == SHUTTING_DOWN:  # a waiting request, failed when the engine stopped
        return error(503, message, kind="server_error")
    return error(400, public_error(message))
