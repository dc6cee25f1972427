"""A tiny real server (Starlette on uvicorn, in a thread) whose chat stream sends a first piece of
text and then goes silent, as a stuck server does; it notes when the client hangs up."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "stall-model"


def _chunk(content: str) -> str:
    body = {"id": "chatcmpl-stall", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n"


class ThreadServer:
    """A Starlette app served by uvicorn in a thread on a free local port; `with` starts and stops it."""

    def __init__(self, app: Starlette) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        end = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < end, "the test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


class StallServer(ThreadServer):
    def __init__(self, first: str = "Hello") -> None:
        self.first = first
        self.hung_up = threading.Event()  # the client closed the stream while the server was silent
        self.requests = 0

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        async def chat(request: Request) -> StreamingResponse:
            await request.body()
            self.requests += 1

            async def stream() -> Any:
                try:
                    yield _chunk(self.first)
                    await asyncio.sleep(3600)  # silence
                except asyncio.CancelledError:  # starlette cancels the stream when the client disconnects
                    self.hung_up.set()
                    raise

            return StreamingResponse(stream(), media_type="text/event-stream")

        super().__init__(Starlette(routes=[Route("/v1/models", models),
                                           Route("/v1/chat/completions", chat, methods=["POST"])]))
