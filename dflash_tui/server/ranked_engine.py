"""Rank 0's engine thread under `serve --distributed`: the same queue of jobs, each handed to
the other ranks (engine/rank_channel.py) before it runs, heartbeats while idle.

When the ranks can no longer run in step (a rank died, hung, or disagreed) the thread
fails what is queued, records why in `fatal`, and calls `on_fatal` so the server stops;
`serve` then prints that one line and exits non-zero.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Union

from dflash_tui.engine.distributed import Ranks
from dflash_tui.engine.events import Error
from dflash_tui.errors import UserError
from dflash_tui.server.engine_thread import END, SHUTTING_DOWN, EngineThread


class RankedEngineThread(EngineThread):
    def __init__(self, model: str, draft: Optional[str], ranks: Ranks, *, trust_remote_code: bool = False,
                 block_size: Union[int, str, None] = None, max_queue: int = 64, draft_quant: int = 0) -> None:
        super().__init__(model, draft, trust_remote_code=trust_remote_code, block_size=block_size, max_queue=max_queue,
                         draft_quant=draft_quant)
        from dflash_tui.engine.rank_channel import Channel

        self.ranks = ranks
        self.channel = Channel(ranks)
        self.fatal: Optional[str] = None
        self.on_fatal: Callable[[], None] = lambda: None
        self._fatal_lock = threading.Lock()

    @property
    def distributed(self) -> dict[str, Any]:
        return self.ranks.info()

    def fail(self, message: str) -> bool:
        """Record the one reason the ranks stopped; False if one was already recorded."""
        with self._fatal_lock:
            if self.fatal is not None:
                return False
            self.fatal = message
            self.ranks.failed = True
        return True

    def _load(self) -> None:
        super()._load()
        self.channel.heartbeat()  # every rank has loaded: from here each must answer within the timeout

    def _run(self) -> None:
        if not self._loaded():  # a failure here may be another rank's, passed on by the heartbeat
            return
        try:
            self._loop()
        except UserError as exc:  # DistributedError: a rank is gone, hung, or disagreed
            if self.fail(str(exc)):
                self.on_fatal()
        finally:
            with self._cond:  # nobody waits for a reply that will not come
                for job in self._jobs:
                    job.deliver(Error(self.fatal or SHUTTING_DOWN))
                    job.deliver(END)
                self._jobs.clear()
            self._release()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._stop.is_set():
                    self._cond.wait(self.channel.heartbeat_s)
                if self._stop.is_set():
                    break
                job = self._jobs.popleft() if self._jobs else None
                if job is not None and job.cancelled:
                    job.deliver(END)
                    continue
                self._running = job
            if job is None:
                if self.channel.heartbeat_due():
                    self.channel.heartbeat()
                continue
            try:
                try:
                    job.settings = self.channel.send_request(job.prompt, job.settings).settings
                except UserError as exc:
                    job.deliver(Error(str(exc)))
                    raise
                self._generate(job)
            finally:
                with self._cond:
                    self._running = None
                job.deliver(END)
            if self.ranks.broken is not None:
                raise UserError(self.ranks.broken)
        self.channel.shutdown()
