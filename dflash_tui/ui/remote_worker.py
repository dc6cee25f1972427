"""The engine worker for a remote engine: the same thread, requests and Messages as the local one
(ui/worker.py), with a server behind it instead of MLX.

A Load connects (the model is the server's, or the one named); a Generate streams the conversation
to the server and posts what comes back exactly as the local engine's events are posted. The
conversation's messages live here, as the local Conversation keeps them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from textual.message import Message

from dflash_tui.remote.client import RemoteClient, RemoteError, RemoteTarget
from dflash_tui.ui import messages as msg
from dflash_tui.ui.worker import (FLUSH_INTERVAL_S, EngineWorker, Generate, Load, NewConversation, Restore, SetSystem,
                                  _first_line)

IDLE_FLUSH_S = FLUSH_INTERVAL_S  # a quiet stream's held blocks go out after this long


class RemoteWorker(EngineWorker):
    """`Load(model)` connects to the server (`model`: the name to use; the URL itself means the server's own)."""

    def __init__(self, post: Callable[[Message], Any], target: RemoteTarget,
                 client_factory: Callable[[RemoteTarget], RemoteClient] = RemoteClient, **kwargs: Any) -> None:
        super().__init__(post, **kwargs)
        self.target = target
        self._client_factory = client_factory
        self.client: Optional[RemoteClient] = None
        self.messages: list[dict[str, str]] = []
        self.system: Optional[str] = None

    # the app reads `conversation.messages` in a few places (tests too): the same shape
    @property
    def conversation(self) -> Any:
        return self if self.client is not None and self.client.info is not None else None

    @conversation.setter
    def conversation(self, value: Any) -> None:  # EngineWorker's __init__ and _release set it
        pass

    def cancel(self) -> None:
        """Esc: the turn ends now, not at the server's next chunk (it may never come)."""
        super().cancel()
        client = self.client
        if client is not None:
            client.abort()

    def stop(self) -> None:
        super().stop()
        client = self.client
        if client is not None:
            client.abort()

    def _release(self) -> None:
        if self.client is not None:
            self.client.close()
        self.client = None

    def _sample_memory(self) -> None:
        pass  # the memory is the server's: nothing of it is here to sample

    def _handle(self, request: object) -> None:
        if isinstance(request, Load):
            self._connect(request)
        elif isinstance(request, Generate):
            self._generate(request)
        elif isinstance(request, NewConversation):
            self.system = request.system or None
            self.messages = [{"role": "system", "content": self.system}] if self.system else []
        elif isinstance(request, SetSystem):
            self.system = request.text or None
            rest = [m for m in self.messages if m["role"] != "system"]
            self.messages = ([{"role": "system", "content": self.system}] if self.system else []) + rest
        elif isinstance(request, Restore):
            self.messages = [dict(m) for m in request.messages]
            self.system = next((m["content"] for m in self.messages if m["role"] == "system"), None)

    def _connect(self, req: Load) -> None:
        tic = time.perf_counter()
        url = self.target.url
        self._post(msg.EngineLoading(req.model, f"connecting to {url}", 0.2))
        model = None if req.model in ("", url) else req.model
        client = self._client_factory(RemoteTarget(url, self.target.api_key, model or self.target.model))
        try:
            info = client.connect()
        except (RemoteError, ValueError) as exc:
            client.close()
            self._post(msg.EngineFailed(req.model, str(exc), kept=self.client is not None))
            return
        if self.client is not None:
            self.client.close()
        self.client = client
        if not self.messages and req.system:
            self.system = req.system
            self.messages = [{"role": "system", "content": req.system}]
        tokens = client.token_text

        def decode(token_id: int) -> str:
            text = tokens.get(token_id)
            return text if text is not None else f"<{token_id}>"

        draft = "the server's draft" if info.kind == "dflash" and info.draft else None
        no_draft = None
        if info.kind == "dflash" and not info.draft:
            no_draft = "the server runs its target alone"
        self._post(msg.EngineReady(info.model, draft, info.where, info.block_size or 1, decode,
                                   time.perf_counter() - tic, no_draft=no_draft, server=info))
        # the speedup's baseline is the server's own probe (dflash-tui serve), measured as a local one is;
        # any other server reports none, and the meter says so rather than guess
        self._post(msg.BaselineMeasured(info.target_alone_tps, "probe"))
        if info.dflash_probe_tps is not None:
            self._post(msg.ProbeMeasured(info.dflash_probe_tps))

    def _generate(self, req: Generate) -> None:
        client = self.client
        if client is None or client.info is None:
            self._post(msg.TurnFailed(req.turn_id, "not connected to a server"))
            return
        if client.refresh_figures():  # before the reply, so that its speedup and its record use them
            self._post(msg.BaselineMeasured(client.info.target_alone_tps, "probe"))
            self._post(msg.ProbeMeasured(client.info.dflash_probe_tps))
        if req.text is not None:
            self.messages.append({"role": "user", "content": req.text})
        elif self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()  # regenerate: the last reply goes, its question is asked again
        asked = [dict(m) for m in self.messages]
        replied: list[str] = []

        def events():
            for ev in client.chat(asked, req.settings, self._should_cancel, idle_s=IDLE_FLUSH_S):
                if ev is None:  # the server is quiet: the pump shows what it holds
                    pass
                elif ev.type == "done":
                    replied.append(ev.text)
                    self.messages.append({"role": "assistant", "content": ev.text})
                elif ev.type == "error" and req.text is not None and self.messages[-1:] == [asked[-1]]:
                    self.messages.pop()  # the question was not answered: it is not part of the conversation
                yield ev

        try:
            self._pump(req.turn_id, events(), lambda: [dict(m) for m in self.messages])
        except Exception as exc:  # never expected: the client turns a server's failures into Error events
            self._post(msg.TurnFailed(req.turn_id, f"remote turn failed: {_first_line(exc)}"))


async def switch_to_remote(app: Any, url: str) -> None:
    """The app's engine moves to the server at `url` (from the model picker): the local pair is let go,
    its memory freed, then the server is asked for its model. config.toml's key goes only to its server."""
    from dflash_tui.remote.client import normalize_url

    if app.generating:
        app.notify("A reply is streaming; press Esc to stop it first", severity="warning")
        return
    try:
        normalize_url(url)
    except ValueError as exc:
        app.notify(str(exc), title="not a server", severity="error")
        return
    key = app.options.api_key if url == app.options.remote else ""
    target = RemoteTarget(url, key or None, None)
    await app.engine.stopped()
    app.remote = target
    app.engine = RemoteWorker(app.post_message, target)
    app.engine.start(app)
    app.load_model(url, None)
