"""The one engine: a long-lived thread that owns the model pair, and a bounded queue of jobs.

MLX's generation stream is per thread, so the pair is loaded and every request
generated in this same thread. Requests run one at a time, in arrival order;
each prompt reuses the cache for the tokens it shares with the previous one
(the Conversation does that by common prefix). Events cross to the event loop
through the job's asyncio queue; a cancelled job stops within one cycle.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from dflash_tui.engine.events import Block, Done, Error, Event, Prefill
from dflash_tui.server.metrics import RequestRecord, ServerMetrics
from dflash_tui.server.spec_tally import SpecTally

if TYPE_CHECKING:
    from dflash_tui.engine.distributed import Ranks

END = None  # the last item a job's queue receives
SHUTTING_DOWN = "the server is shutting down"  # what a request cut by Ctrl+C (or SIGTERM) is told: a 503
PROBE_TOKENS = 32  # as the TUI's baseline probe (config.toml's baseline_probe_tokens)


class QueueFull(Exception):
    pass


class EngineGone(Exception):
    pass


@dataclass
class Job:
    prompt: list[int]
    settings: Any  # GenerationSettings
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)
    events: "asyncio.Queue[Optional[Event]]" = field(default_factory=asyncio.Queue)
    finish_override: Optional[str] = None  # set by the reader when a stop string ended the reply
    _cancel: threading.Event = field(default_factory=threading.Event)

    def cancel(self, finish_reason: Optional[str] = None) -> None:
        if finish_reason is not None:
            self.finish_override = finish_reason
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def deliver(self, item: Optional[Event]) -> None:
        """From the engine thread: hand an event to the request's reader."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is reading
            self._cancel.set()


class EngineThread:
    ranks: Optional["Ranks"] = None  # set under `serve --distributed` (ranked_engine.py)

    def __init__(self, model: str, draft: Optional[str], *, trust_remote_code: bool = False,
                 block_size: Union[int, str, None] = None, max_queue: int = 64,
                 probe_tokens: int = PROBE_TOKENS, draft_quant: int = 0) -> None:
        self.model, self.draft = model, draft
        self.draft_quant = draft_quant
        self.trust_remote_code = trust_remote_code
        self.block_size = block_size
        self.max_queue = max_queue
        self.conversation: Any = None
        self.load_error: Optional[str] = None
        self.num_spec_tokens = 0
        self.probe_tokens = probe_tokens
        # decode tok/s on the probe's prompt, measured after load as the TUI measures a local pair: the
        # target alone, then DFlash (None: not measured), so a remote TUI shows a measured speedup
        self.target_alone_tps: Optional[float] = None
        self.dflash_probe_tps: Optional[float] = None
        self.metrics: Optional[ServerMetrics] = None
        self._jobs: "collections.deque[Job]" = collections.deque()
        self._cond = threading.Condition()
        self._tokenize = threading.Lock()  # a fast tokenizer's state is not safe under concurrent encodes
        self._running: Optional[Job] = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dflash-serve-engine", daemon=True)

    # -- from other threads ---------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """True once the pair is loaded (or failed to: see load_error)."""
        return self._ready.wait(timeout)

    @property
    def tokenizer(self) -> Any:
        return self.conversation.tokenizer

    @property
    def draft_block(self) -> int:
        """The draft's trained block size, the largest a request may ask for (0: no draft)."""
        draft = getattr(getattr(self.conversation, "pair", None), "draft", None)
        return draft.config.block_size if draft is not None else 0

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Chat messages -> prompt token ids (the tokenizer is safe to use from a worker thread)."""
        with self._tokenize:
            return self.conversation.prompt_tokens(messages)

    def counts(self) -> tuple[int, int]:
        """(running, waiting), cancelled jobs not counted."""
        with self._cond:
            waiting = sum(1 for j in self._jobs if not j.cancelled)
            return (1 if self._running is not None else 0), waiting

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull past max_queue waiting jobs, EngineGone once stopping."""
        with self._cond:
            if self._stop.is_set() or not self._thread.is_alive():
                raise EngineGone()
            self._jobs = collections.deque(j for j in self._jobs if not j.cancelled)
            if len(self._jobs) >= self.max_queue:
                raise QueueFull()
            self._jobs.append(job)
            self._cond.notify()

    @property
    def stopping(self) -> bool:
        """True once the server is shutting down: no job is taken, the running one is being stopped."""
        return self._stop.is_set()

    def begin_stop(self) -> None:
        """Take no more jobs and end the running and waiting ones, without waiting (the event loop
        calls it at Ctrl+C): each reader gets SHUTTING_DOWN at once, even while the engine is inside
        a long prefill chunk, and the engine stops at its next cancel check."""
        self._stop.set()
        with self._cond:
            ended = [*self._jobs, *([self._running] if self._running is not None else [])]
            self._jobs.clear()
            self._cond.notify_all()
        for job in ended:
            job.cancel()
            job.deliver(Error(SHUTTING_DOWN))  # after the events already sent; what the engine sends later
            job.deliver(END)  # goes after this END, which nobody reads past

    def stop(self, timeout: float = 10.0) -> None:
        self.begin_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the thread ------------------------------------------------------
    def _loaded(self) -> bool:
        """Load the pair; False (and `load_error`, one line) if that failed. Either way `wait_ready` returns."""
        try:
            self._load()
        except Exception as exc:  # a UserError from loading, or anything else: one line
            text = str(exc).strip().splitlines()
            self.load_error = text[0] if text else type(exc).__name__
            return False
        finally:
            self._ready.set()
        return True

    def _run(self) -> None:
        if not self._loaded():
            return
        try:
            while True:
                with self._cond:
                    while not self._jobs and not self._stop.is_set():
                        self._cond.wait(0.5)
                    if self._stop.is_set():
                        break
                    job = self._jobs.popleft()
                    if job.cancelled:
                        job.deliver(END)
                        continue
                    self._running = job
                try:
                    self._generate(job)
                finally:
                    with self._cond:
                        self._running = None
                    job.deliver(END)
            with self._cond:  # shutting down: nobody waits for a reply that will not come
                for job in self._jobs:
                    job.deliver(Error(SHUTTING_DOWN))
                    job.deliver(END)
                self._jobs.clear()
        finally:
            self._release()

    def _load(self) -> None:
        from dflash_tui.engine.conversation import Conversation
        from dflash_tui.engine.loading import load_pair

        pair = load_pair(self.model, self.draft, trust_remote_code=self.trust_remote_code, require_draft=False,
                         ranks=self.ranks, draft_quant=self.draft_quant)
        self.conversation = Conversation(pair)
        self.conversation.ranks = self.ranks
        if pair.draft is not None:
            self.num_spec_tokens = pair.draft.config.block_size - 1
            if isinstance(self.block_size, int):
                self.num_spec_tokens = max(0, min(self.block_size, pair.draft.config.block_size) - 1)
        if self.probe_tokens > 0 and self.ranks is None:  # sharded, every rank would have to run it alike
            try:
                self._probe()
            except Exception:  # the pair serves; only the remote TUI's speedup stays unknown
                self.target_alone_tps = self.dflash_probe_tps = None

    def _probe(self) -> None:
        """The same measure as the TUI's probe (ui/worker.py): a warm-up, the target alone, then DFlash,
        greedy on one prompt; a figure from a reply that ended too soon to time stays None."""
        from dflash_tui.engine.conversation import GenerationSettings
        from dflash_tui.figure_rules import MIN_TIMED_TOKENS, PROBE_PROMPT

        conv = self.conversation
        prompt = conv.prompt_tokens([{"role": "user", "content": PROBE_PROMPT}])

        def timed(settings: Any, min_tokens: int) -> Optional[float]:
            done = None
            for ev in conv.generate_tokens(prompt, settings, self._stop.is_set):
                done = ev
            if not isinstance(done, Done) or done.finish_reason == "cancelled" or len(done.tokens) < min_tokens:
                return None
            return float(done.stats.get("decode_tps") or 0.0) or None

        tokens = max(self.probe_tokens, MIN_TIMED_TOKENS)  # fewer would time start-up, not the model
        timed(GenerationSettings(max_tokens=4, baseline=True), 1)  # warm-up: kernels compile on first use
        self.target_alone_tps = timed(GenerationSettings(max_tokens=tokens, baseline=True), MIN_TIMED_TOKENS)
        if self.num_spec_tokens > 0 and self.target_alone_tps is not None:
            self.dflash_probe_tps = timed(GenerationSettings(max_tokens=tokens, block_size=self.block_size),
                                          MIN_TIMED_TOKENS)

    def _release(self) -> None:
        """Drop the models and this thread's MLX streams while Python still runs."""
        self.conversation = None
        try:
            import mlx.core as mx

            mx.synchronize()
            mx.clear_streams()
        except Exception:  # an older MLX without clear_streams, or nothing was ever evaluated
            pass

    def _generate(self, job: Job) -> None:
        started = time.perf_counter()
        record = RequestRecord(finish_reason="error", prompt_tokens=len(job.prompt), queue_s=started - job.arrived,
                               tally=SpecTally(self.num_spec_tokens))
        should_cancel = lambda: job.cancelled or self._stop.is_set()  # noqa: E731
        try:
            for ev in self.conversation.generate_tokens(job.prompt, job.settings, should_cancel):
                if isinstance(ev, Prefill):
                    record.cached_tokens = ev.cached_tokens
                elif isinstance(ev, Block):
                    if record.ttft_s is None:
                        record.ttft_s = time.perf_counter() - job.arrived
                    record.generation_tokens += ev.reply_tokens
                    record.tally.observe(ev)
                elif isinstance(ev, Done):
                    record.finish_reason = ev.finish_reason
                    record.decode_tps = float(ev.stats.get("decode_tps") or 0.0)
                job.deliver(ev)
        except Exception as exc:  # the engine reports its own failures; this is the last net
            job.deliver(Error(f"generation failed: {type(exc).__name__}"))
        if job.finish_override is not None:
            record.finish_reason = job.finish_override
        record.e2e_s = time.perf_counter() - job.arrived
        if self.metrics is not None:
            self.metrics.record(record)
