"""The engine worker: one long-lived thread that owns the models.

MLX's generation stream is per thread, so loading and generating happen in the
same thread, started once with the app and ended (its MLX streams freed) when
the app exits. The UI talks to it through a queue of requests and hears back
through typed Messages; blocks are coalesced so the UI re-renders a few times a
second, not once per token.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from textual.message import Message

from dflash_tui.ui import messages as msg
from dflash_tui.figure_rules import MIN_TIMED_TOKENS, PROBE_PROMPT, measures_target_alone

FLUSH_INTERVAL_S = 0.2  # 5 repaints a second: live to the eye; faster starves the engine of the GIL
STOP_TIMEOUT_S = 10.0  # a generation stops within a cycle; a load in progress cannot be interrupted


# -- requests --------------------------------------------------------------
@dataclass
class Load:
    model: str
    draft: Optional[str] = None
    trust_remote_code: bool = False
    probe_tokens: int = 32
    system: Optional[str] = None
    block_size: Optional[Union[int, str]] = "auto"  # the DFlash probe's (None: the draft's own)
    draft_quant: int = 0  # 4 or 8: the draft's linear layers quantized at load
    prompt_cache_bytes: int = 0  # cap of the saved conversation caches on disk (0: none saved or read)


@dataclass
class Generate:
    turn_id: int
    text: Optional[str]  # None: regenerate the last reply
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class NewConversation:
    system: Optional[str] = None


@dataclass
class SetSystem:
    text: Optional[str]


@dataclass
class Restore:
    """Replace the conversation's messages (a session opened from disk)."""

    messages: list[dict[str, str]]


class _Stop:
    pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def device_name() -> str:
    import mlx.core as mx

    dev = mx.default_device()
    kind = "gpu" if dev.type == mx.gpu else "cpu"
    try:
        info = mx.device_info()
    except Exception:  # not every backend reports
        info = {}
    name = info.get("device_name") or info.get("architecture") or ""
    return f"{kind} · {name}" if name else kind


class EngineWorker:
    """Owns the pair and the Conversation; every MLX call happens in its thread."""

    def __init__(self, post: Callable[[Message], Any], flush_interval: float = FLUSH_INTERVAL_S) -> None:
        self._post = post
        self._queue: "queue.Queue[object]" = queue.Queue()
        self._cancel = threading.Event()
        # set while the UI has painted the last batch: a slow UI gets bigger batches, never a backlog
        self._ui_ready = threading.Event()
        self._ui_ready.set()
        self._flush_interval = flush_interval
        self._hold = 0.0  # the UI asks for this long between batches, so that drawing them stays cheap
        # its own thread, not a pooled one: MLX's per-thread streams are freed when it ends and never reused
        self._thread: Optional[threading.Thread] = None
        self.worker: Any = None  # the Textual worker supervising the thread, when started with an app
        self._stop = threading.Event()
        self._finished = threading.Event()  # set once the thread has released its models and streams
        self._on_finished: Optional[Callable[[], Any]] = None  # how the thread tells the supervising worker
        self.thread_id: Optional[int] = None
        self.pair = None
        self.conversation = None
        self._loaded: Optional[Load] = None  # the request that loaded the pair in memory
        self._peak = 0  # MLX's peak is reset each turn; the meter shows the peak since load

    # -- called from the UI thread ----------------------------------------
    def start(self, app: Any = None) -> threading.Thread:
        """Start the engine thread; with an app, also a Textual worker that drives its lifetime."""
        self._thread = threading.Thread(target=self._run, name="dflash-engine")
        self._thread.start()
        if app is not None:
            self.worker = app.run_worker(self._supervise, name="engine", group="engine", exit_on_error=False)
        return self._thread

    async def _supervise(self) -> None:
        """The engine as seen by Textual's worker API: cancelling this worker stops the thread.

        MLX work stays on the dedicated thread, which Textual's pooled thread workers could not give.
        """
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        # woken by the thread itself when it ends: no polling timer that would take the GIL from a decode
        self._on_finished = lambda: loop.call_soon_threadsafe(ended.set)
        try:
            if not self._finished.is_set():
                await ended.wait()
        except asyncio.CancelledError:
            self.stop()
            raise

    def submit(self, request: object) -> None:
        if isinstance(request, Generate):
            self._cancel.clear()
        self._queue.put(request)

    def blocks_shown(self, hold_s: float = 0.0) -> None:
        """The UI painted the last batch; the next one may go `hold_s` after the last was sent."""
        self._hold = hold_s
        self._ui_ready.set()

    def cancel(self) -> None:
        """Stop the running generation after the current cycle; what was produced is kept."""
        self._cancel.set()

    def stop(self) -> None:
        self._stop.set()
        self._cancel.set()
        self._queue.put(_Stop())

    async def stopped(self, timeout: Optional[float] = None) -> bool:
        """Stop the thread and wait (without blocking the event loop) until it has let go of MLX."""
        timeout = STOP_TIMEOUT_S if timeout is None else timeout
        self.stop()
        end = time.monotonic() + timeout
        while self._thread is not None and not self._finished.is_set() and time.monotonic() < end:
            await asyncio.sleep(0.02)
        return self._finished.is_set()

    @property
    def alive(self) -> bool:
        """The thread is still running (inside a load or an MLX call, after a stop that timed out)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """The thread has ended, its models and MLX streams released."""
        return self._finished.is_set()

    # -- the thread --------------------------------------------------------
    def _stopping(self) -> bool:
        # the main thread gone means the interpreter is exiting without the app's own stop
        return self._stop.is_set() or not threading.main_thread().is_alive()

    def _should_cancel(self) -> bool:
        return self._cancel.is_set() or self._stopping()

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        try:
            self._serve()
        finally:
            self._release()
            self._finished.set()
            if self._on_finished is not None:
                try:
                    self._on_finished()
                except RuntimeError:  # the app's event loop is already closed
                    pass

    def _release(self) -> None:
        """Drop the models and this thread's MLX streams while Python still runs.

        Left to thread or interpreter teardown, MLX's cleanup can abort the process
        ("terminate called without an active exception").
        """
        self.pair = self.conversation = None
        try:
            import mlx.core as mx

            mx.synchronize()
            mx.clear_streams()
        except Exception:  # an older MLX without clear_streams, or nothing was ever evaluated
            pass

    def _serve(self) -> None:
        while not self._stopping():
            try:
                request = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(request, _Stop):
                break
            try:
                self._handle(request)
            except Exception as exc:  # the worker must outlive any one request
                turn = getattr(request, "turn_id", -1)
                if isinstance(request, Generate):
                    self._post(msg.TurnFailed(turn, f"generation failed: {_first_line(exc)}"))
                elif isinstance(request, Load):
                    self._post(msg.EngineFailed(request.model, f"could not load {request.model}: {_first_line(exc)}"))
                else:
                    self._post(msg.EngineNotice(f"engine error: {_first_line(exc)}", "error"))

    def _handle(self, request: object) -> None:
        if isinstance(request, Load):
            self._load(request)
        elif isinstance(request, Generate):
            self._generate(request)
        elif isinstance(request, NewConversation):
            if self.conversation is not None:
                self.conversation.reset(system=request.system or None)
        elif isinstance(request, SetSystem):
            if self.conversation is not None:
                self._set_system(request.text or None)
        elif isinstance(request, Restore):
            if self.conversation is not None:
                self.conversation.messages = [dict(m) for m in request.messages]
                system = next((m["content"] for m in request.messages if m["role"] == "system"), None)
                self.conversation.system = system

    def _set_system(self, text: Optional[str]) -> None:
        conv = self.conversation
        rest = [m for m in conv.messages if m["role"] != "system"]
        conv.system = text
        # the next turn re-renders the whole conversation, so the caches follow by themselves
        conv.messages = ([{"role": "system", "content": text}] if text else []) + rest

    def _load(self, req: Load) -> None:
        from dflash_tui.engine.conversation import Conversation
        from dflash_tui.engine.loading import load_located, locate_pair
        from dflash_tui.engine.registry import choose_draft
        from dflash_tui.errors import UserError

        tic = time.perf_counter()
        self._post(msg.EngineLoading(req.model, "starting", 0.0))

        def progress(stage: str, fraction: float) -> None:
            self._post(msg.EngineLoading(req.model, stage, fraction))

        try:
            # names, downloads and fit first, with the pair in use still loaded: a typo or an offline
            # hub id leaves it (and its conversation) as it was; a target with no known draft runs alone
            files = locate_pair(req.model, req.draft or None, progress=progress, require_draft=False)
        except UserError as exc:
            self._post(msg.EngineFailed(req.model, str(exc), kept=self.pair is not None))
            return
        previous, messages = self._loaded, (list(self.conversation.messages) if self.conversation else [])
        # drop the old pair first: two models at once may not fit
        self.pair = self.conversation = self._loaded = None
        self._peak = 0
        try:
            pair = load_located(files, trust_remote_code=req.trust_remote_code, progress=progress,
                                draft_quant=req.draft_quant)
        except Exception as exc:  # corrupt weights, out of memory: back to the pair before, if there was one
            text = str(exc) if isinstance(exc, UserError) else (
                f"out of memory while loading {req.model}" if isinstance(exc, MemoryError)
                else f"could not load {req.model}: {_first_line(exc)}")
            kept = previous is not None and self._reload(previous, messages, progress)
            self._post(msg.EngineFailed(req.model, text, kept=kept))
            return
        self.pair, self._loaded = pair, req
        self.conversation = Conversation(pair, system=req.system or None)
        self._attach_saved(req)
        tokenizer = pair.target.tokenizer
        block = pair.draft.config.block_size if pair.draft is not None else 1
        no_draft = None if pair.draft is not None else choose_draft(req.model).reason
        self._post(msg.EngineReady(pair.target_name, pair.draft_name, device_name(), block,
                                   _decoder(tokenizer), time.perf_counter() - tic, no_draft=no_draft,
                                   draft_quant=pair.draft_quant))
        self._sample_memory()
        self._measure(req, block)

    def _reload(self, previous: Load, messages: list[dict[str, str]], progress: Callable[[str, float], None]) -> bool:
        """Load the pair that was in use again, with its conversation; False if that fails too."""
        from dflash_tui.engine.conversation import Conversation
        from dflash_tui.engine.loading import load_pair

        progress(f"that failed: reloading {previous.model}", 0.5)
        try:
            pair = load_pair(previous.model, previous.draft or None, trust_remote_code=previous.trust_remote_code,
                             require_draft=False, draft_quant=previous.draft_quant)
        except Exception:  # the files changed under us: nothing is loaded now
            return False
        self.pair, self._loaded = pair, previous
        self.conversation = Conversation(pair)
        self._attach_saved(previous)
        self.conversation.messages = messages
        self.conversation.system = next((m["content"] for m in messages if m["role"] == "system"), None)
        if pair.draft is not None and previous.probe_tokens > 0:
            self._measure_costs(pair.draft.config.block_size)
        return True

    def _attach_saved(self, req: Load) -> None:
        """Saved conversation caches on disk for this pair (engine/prompt_cache_files.py), if wanted."""
        if req.prompt_cache_bytes <= 0:
            return
        from dflash_tui.config import cache_dir
        from dflash_tui.engine.prompt_cache_files import PromptCacheFiles

        try:
            self.conversation.saved = PromptCacheFiles(self.pair, cache_dir() / "prompt-caches", req.prompt_cache_bytes,
                                                       notify=lambda text: self._post(msg.EngineNotice(text, "warning")))
        except Exception as exc:  # the pair works without them
            self._post(msg.EngineNotice(f"saved conversation caches off: {_first_line(exc)}", "warning"))

    def _save_caches(self) -> None:
        """After a turn, while the user reads it: its caches to disk, for a later reopening."""
        conv = self.conversation
        if conv is None or conv.saved is None:
            return
        try:
            conv.save_caches()
        except Exception as exc:  # never the turn's problem
            self._post(msg.EngineNotice(f"conversation cache not saved: {_first_line(exc)}", "warning"))

    def _measure(self, req: Load, block: int) -> None:
        """After a load: the target alone's speed, the block sizes' cost curve, then DFlash's speed on the
        same prompt, so the meter shows a measured speedup before the first reply."""
        if req.probe_tokens <= 0:
            return
        tokens = max(req.probe_tokens, MIN_TIMED_TOKENS)  # fewer would time start-up, not the model
        try:
            self._probe(tokens)
        except Exception as exc:  # the pair works; only the speedup stays unknown
            self._post(msg.BaselineMeasured(None, "probe"))
            self._post(msg.EngineNotice(f"baseline probe failed: {_first_line(exc)}", "warning"))
            return
        if self.pair.draft is None:
            return
        self._measure_costs(block)
        try:
            self._probe_dflash(tokens, req.block_size)
        except Exception as exc:
            self._post(msg.ProbeMeasured(None))
            self._post(msg.EngineNotice(f"DFlash probe failed: {_first_line(exc)}", "warning"))

    def _measure_costs(self, block: int) -> None:
        try:  # the adaptive block size's cost curve, now rather than in the first reply's wait
            self.conversation.block_sizer(block)
        except Exception as exc:  # the first "auto" turn measures it again
            self._post(msg.EngineNotice(f"block-size cost curve not measured: {_first_line(exc)}", "warning"))
            return
        self._post(msg.SizerPlan(*self.conversation.sizer_plan()))

    def _probe(self, tokens: int) -> None:
        """Measure the target alone on a short prompt, so the meter's speedup is measured, not guessed."""
        from dflash_tui.engine.conversation import GenerationSettings

        self._timed_probe(GenerationSettings(max_tokens=4, baseline=True), 1)  # warm-up: kernels compile on first use
        tps = self._timed_probe(GenerationSettings(max_tokens=tokens, baseline=True), MIN_TIMED_TOKENS)
        self._post(msg.BaselineMeasured(tps, "probe"))

    def _probe_dflash(self, tokens: int, block_size: Optional[Union[int, str]]) -> None:
        """DFlash on the probe's prompt, greedy, with the block size the app asks for."""
        from dflash_tui.engine.conversation import GenerationSettings

        tps = self._timed_probe(GenerationSettings(max_tokens=tokens, block_size=block_size), MIN_TIMED_TOKENS)
        self._post(msg.ProbeMeasured(tps))
        plan = self.conversation.sizer_plan() if block_size == "auto" else None
        if plan is not None:
            self._post(msg.SizerPlan(*plan))

    def _timed_probe(self, settings: Any, min_tokens: int) -> Optional[float]:
        """Decode tok/s of one reply to the probe's prompt; None if it stopped early or was too short to time."""
        conv = self.conversation
        prompt = conv.prompt_tokens([{"role": "user", "content": PROBE_PROMPT}])
        done = None
        for ev in conv.generate_tokens(prompt, settings, self._should_cancel):
            done = ev
        if done is None or done.type != "done" or done.finish_reason == "cancelled" or len(done.tokens) < min_tokens:
            return None
        return done.stats.get("decode_tps") or None

    def _generate(self, req: Generate) -> None:
        from dflash_tui.engine.conversation import GenerationSettings

        conv = self.conversation
        if conv is None:
            self._post(msg.TurnFailed(req.turn_id, "no model is loaded"))
            return
        settings = GenerationSettings(**req.settings)
        events = (
            conv.generate(req.text, settings, self._should_cancel)
            if req.text is not None
            else conv.regenerate(settings, self._should_cancel)
        )
        adaptive = settings.block_size == "auto" and not settings.baseline
        last_plan: Optional[tuple[int, int]] = None

        def tell_plan() -> None:
            """The sizer's next choice, when it changed (read here, in the thread that drives the sizer)."""
            nonlocal last_plan
            plan = conv.sizer_plan() if adaptive else None
            if plan is not None and plan != last_plan:
                last_plan = plan
                self._post(msg.SizerPlan(*plan))

        self._pump(req.turn_id, events, lambda: [dict(m) for m in conv.messages], tell_plan)
        self._save_caches()

    def _pump(self, turn_id: int, events: Iterable[Any], messages: Callable[[], list[dict[str, str]]],
              after_batch: Callable[[], None] = lambda: None) -> None:
        """A turn's events to the UI: the prefill at once, blocks in batches the UI can paint, then the end."""
        pending: list = []
        last_flush = last_event = time.perf_counter()
        last_memory = 0.0
        self._ui_ready.set()
        self._hold = 0.0

        def flush(now: float, final: bool = False) -> None:
            nonlocal pending, last_flush, last_memory
            if not final and (not self._ui_ready.is_set() or now - last_flush < self._hold):
                return  # the UI is still painting the previous batch, or asked for a pause: keep collecting
            if pending:
                self._ui_ready.clear()
                self._post(msg.TurnBlocks(turn_id, pending, now - last_flush))
                pending = []
                after_batch()
            last_flush = now
            if now - last_memory > 0.5:
                self._sample_memory()
                last_memory = now

        for ev in events:
            now = time.perf_counter()
            if ev is None:  # a remote engine's stream is idle: what is held goes out, not at its next chunk
                flush(now)
                continue
            if ev.type == "prefill":
                self._post(msg.TurnPrefill(turn_id, ev))
                last_flush = now
            elif ev.type == "block":
                pending.append(ev)
                # slow cycles go out at once; fast ones are batched up to the flush interval
                if now - last_flush >= self._flush_interval or now - last_event >= self._flush_interval:
                    flush(now)
            elif ev.type == "done":
                flush(now, final=True)
                self._sample_memory()
                if measures_target_alone(ev):  # before the turn ends: the reply is saved with it
                    self._post(msg.BaselineMeasured(ev.stats.get("decode_tps") or None, "turn"))
                self._post(msg.TurnDone(turn_id, ev, messages()))
            elif ev.type == "error":
                flush(now, final=True)
                self._post(msg.TurnFailed(turn_id, ev.message))
            last_event = now

    def _sample_memory(self) -> None:
        import mlx.core as mx
        import psutil

        self._peak = max(self._peak, mx.get_peak_memory())
        self._post(msg.MemorySample(mx.get_active_memory(), self._peak, psutil.Process().memory_info().rss))


def _decoder(tokenizer) -> Callable[[int], str]:
    """Token id -> its own text (cached: the acceptance view asks for the same ids again and again)."""
    cache: dict[int, str] = {}

    def decode(token_id: int) -> str:
        text = cache.get(token_id)
        if text is None:
            try:
                text = tokenizer.decode([token_id])
            except Exception:  # an id the tokenizer does not know
                text = f"<{token_id}>"
            cache[token_id] = text
        return text

    return decode
