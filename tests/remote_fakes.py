"""A loopback HTTP server that plays recorded responses (for shapes of servers that cannot run here)
and hostile ones (garbage, a stream cut mid-reply, silence). A real socket: the client's own code runs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

Route = Callable[[BaseHTTPRequestHandler], None]


def sse(*chunks: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(content: Optional[str] = None, finish: Optional[str] = None, **extra: Any) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    body.update(extra)
    return body


def models(*ids: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()


class FakeServer:
    """`routes[(method, path)] = handler(req)` or `(status, content_type, body)`; the requests it got in `seen`."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Any] = {}
        self.seen: list[tuple[str, str, Any]] = []
        self.release = threading.Event()  # ends every handler that waits (a silent server)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                owner.seen.append((method, self.path, json.loads(body) if body else None))
                route = owner.routes.get((method, self.path))
                if route is None:
                    return self._send(404, "application/json", b'{"error": {"message": "no such endpoint"}}')
                if callable(route):
                    return route(self)
                self._send(*route)

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> "FakeServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def stream_then(raw: bytes, hang: Optional[threading.Event] = None) -> Route:
    """A stream that sends `raw` and closes the connection, or with `hang` goes silent until it is set."""

    def handler(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Connection", "close")
        req.end_headers()
        req.wfile.write(raw)
        req.wfile.flush()
        if hang is not None:
            hang.wait(30)
        req.close_connection = True

    return handler
