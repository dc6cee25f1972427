"""DFlash with the target sharded over several ranks by mlx-lm (`mx.distributed`).

Every rank loads the target through `mlx_lm.utils.sharded_load` (tensor
parallel: `Model.shard()`; pipeline parallel: `Model.model.pipeline()`, where
`Target` gathers the captured layers from the stages holding them) and a full
copy of the small draft, and runs the same decode loop. The sharded target's layer
outputs are all-reduced inside mlx-lm's own layers ("sharded-to-all" linears),
so the captured features are full hidden states on every rank; a vocab-sharded
head is gathered in `Target.head`. So every rank makes the same accept
decision, and `Ranks.agree` checks that it did: once per cycle an all_sum of
(accepted, emitted tokens' digest); a rank whose values differ from the mean
stops every rank with one error. The same all_sum carries rank 0's "stop"
(a cancelled request, a stop string): every rank stops after the same cycle.

A rank that dies surfaces as a RuntimeError of the ring backend in the next
collective; a rank that hangs (or a host that stops answering) would block the
others forever, since MLX has no timeout on collectives: a watchdog thread
ends the process with one line when no cycle completes within `timeout_s`.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NoReturn, Optional

import mlx.core as mx

from dflash_tui.errors import UserError

KINDS = ("tensor", "pipeline")  # mlx-lm's Model.shard() / Model.model.pipeline()
DIGEST_MOD = 1_000_003  # keeps digest * ranks inside int32
REPORT_GRACE_S = 20.0  # how long a failed follower leaves rank 0 to report the same failure


class DistributedError(UserError):
    """The ranks disagree, or one is gone: the run cannot go on."""


def init_group() -> mx.distributed.Group:
    """The group mlx.launch set up; one clear error outside it."""
    try:
        group = mx.distributed.init(strict=True)
    except Exception as exc:  # no backend configured: not started by mlx.launch
        raise UserError(f"--distributed needs to run under mlx.launch (no distributed backend: {exc})") from None
    if group.size() < 2:
        raise UserError("--distributed needs at least 2 ranks (mlx.launch -n 2 or a hostfile)")
    return group


def digest(tokens: list[int]) -> int:
    return sum((i + 1) * (t + 1) for i, t in enumerate(tokens)) % DIGEST_MOD


@dataclass
class Ranks:
    """This process's place among the ranks, and the per-cycle check and its costs."""

    group: Any
    kind: str = "tensor"
    timeout_s: float = 120.0
    checks: int = 0
    # wall time of the agreement all_sums (one network round each, including the wait for the
    # slowest rank); the sharded model's own all-reduces run inside its lazily evaluated forward
    # and cannot be timed apart from its compute, so they are not in it
    sync_ms: float = 0.0
    failed: bool = False  # set once this rank reports (or is stopped by) a failure
    broken: Optional[str] = None  # why the ranks can no longer run in step (a failed collective mid-turn)
    stop_agreed: bool = False  # rank 0 asked to stop, as of the last agreement check
    terminated: bool = False  # mlx.launch sent SIGTERM (another rank exited with an error)
    _leader_stop: Callable[[], bool] = field(default=lambda: False, repr=False)
    _watchdog: Optional["Watchdog"] = field(default=None, repr=False)

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_sum(self, values: list[int]) -> list[int]:
        out = mx.distributed.all_sum(mx.array(values, dtype=mx.int32), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return out.tolist()

    def agree(self, accepted: int, tokens: list[int]) -> None:
        """All ranks must have accepted the same number of the same tokens; rank 0's stop rides along."""
        stop = 1 if self.is_leader and self._leader_stop() else 0
        local = [accepted, len(tokens), digest(tokens), stop]
        tic = time.perf_counter()
        try:
            total = self.all_sum(local)
        except RuntimeError as exc:
            raise rank_lost(exc) from None
        self.sync_ms += (time.perf_counter() - tic) * 1e3
        self.checks += 1
        self.stop_agreed = total[3] > 0
        if total[:3] != [v * self.size for v in local[:3]]:
            raise DistributedError(
                f"the ranks disagree at check {self.checks}: rank {self.rank} accepted {accepted} of "
                f"{len(tokens)} tokens, the {self.size} ranks' sum is {total[0]}; stopping all ranks"
            )

    def follow_stop(self, should_cancel: Callable[[], bool]) -> Callable[[], bool]:
        """The turn's cancel check for every rank: rank 0's own `should_cancel`, as agreed at the
        last check (a rank that stopped on its own would leave the others in a collective)."""
        self._leader_stop = should_cancel if self.is_leader else (lambda: False)
        self.stop_agreed = False
        return lambda: self.stop_agreed

    def leaders_values(self, values: dict[int, float]) -> dict[int, float]:
        """Rank 0's measured values for every rank (the adaptive block sizer's costs are timed,
        so each rank's differ; the ranks must choose the same block sizes)."""
        keys = sorted(values)
        mine = [float(values[k]) if self.is_leader else 0.0 for k in keys]
        out = mx.distributed.all_sum(mx.array(mine, dtype=mx.float32), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return dict(zip(keys, out.tolist()))

    def settle(self) -> None:
        """Wait for anything still running on mlx-lm's generation stream: its `stream_generate`
        leaves the next step's forward in flight, and collectives of two streams running at once
        pair up wrongly across the ranks (the sums mix, the ranks silently diverge)."""
        from dflash_tui.engine.target import finish_stream_generate

        finish_stream_generate()
        mx.synchronize()

    def shared_seed(self, seed: Optional[int]) -> int:
        """One seed for every rank: rank 0's when none was given (so sampling agrees)."""
        if seed is not None:
            return seed
        mine = random.getrandbits(30) if self.is_leader else 0
        return self.all_sum([mine])[0]

    def checked(self, cycles: Iterator[Any]) -> Iterator[Any]:
        """The cycles, each checked for agreement; a lost rank becomes one DistributedError."""
        try:
            while True:
                self.beat()
                try:
                    cyc = next(cycles)
                except StopIteration:
                    return
                except RuntimeError as exc:
                    raise rank_lost(exc) from None
                self.agree(cyc.accepted, cyc.emitted)
                yield cyc
        finally:
            close = getattr(cycles, "close", None)
            if close is not None:
                close()

    # -- ending ----------------------------------------------------------------
    def stop_on_sigterm(self) -> None:
        """mlx.launch ends the other ranks with SIGTERM when one exits: turn that into one
        DistributedError (one line on rank 0) instead of a silent death."""

        def handler(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.terminated = True
            if not self.failed:  # a rank already on its way out with its own line says nothing more
                self.failed = True
                raise DistributedError("stopped by mlx.launch: another rank exited (killed, or failed first)")

        signal.signal(signal.SIGTERM, handler)

    def follower_failed(self, exc: UserError, grace_s: float = REPORT_GRACE_S) -> NoReturn:
        """Leave after this follower's own failure, the line said once. The ranks run the same
        code on the same files, so rank 0 mostly meets the same failure and reports it; exiting at
        once would make mlx.launch stop rank 0 before it got there, leaving only "another rank
        exited". So wait for mlx.launch's SIGTERM (rank 0 has exited) and leave silently; a failure
        of this rank alone (rank 0 got past it) is this rank's to report, after `grace_s`."""
        self.failed = True
        deadline = time.monotonic() + grace_s
        while not self.terminated and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.terminated:
            from dflash_tui.printable import one_line

            print(f"dflash-tui: rank {self.rank}: {one_line(str(exc))}", file=sys.stderr, flush=True)  # names stay inert
        raise SystemExit(exc.exit_code)

    # -- watchdog ------------------------------------------------------------
    def start_watchdog(self, out: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        if self._watchdog is None and self.timeout_s > 0:
            self._watchdog = Watchdog(self.timeout_s, self.rank, out)
            self._watchdog.start()

    def beat(self, grace: float = 0.0) -> None:
        """Progress: the next must come within timeout_s (+ grace, e.g. for loading)."""
        if self._watchdog is not None:
            self._watchdog.beat(grace)

    def idle(self) -> None:
        """Waiting for work (a follower between requests) is not a hang."""
        if self._watchdog is not None:
            self._watchdog.pause()

    def stats(self) -> dict[str, Any]:
        return {"ranks": self.size, "parallel": self.kind, "sync_ms": self.sync_ms, "agreement_checks": self.checks}

    def info(self) -> dict[str, Any]:
        """What a server tells its clients about the ranks."""
        return {"ranks": self.size, "parallel": self.kind}


def rank_lost(exc: BaseException) -> DistributedError:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DistributedError(f"a rank is gone or unreachable ({first}); stopping")


class Watchdog(threading.Thread):
    """Ends the process with one line when no beat came for `timeout_s` (a hung collective)."""

    def __init__(self, timeout_s: float, rank: int, out: Callable[[str], None]):
        super().__init__(name="dflash-rank-watchdog", daemon=True)
        self.timeout_s = timeout_s
        self.rank = rank
        self.out = out
        self.deadline: Optional[float] = None  # None: paused
        self.lock = threading.Lock()

    def beat(self, grace: float = 0.0) -> None:
        with self.lock:
            self.deadline = time.monotonic() + self.timeout_s + grace

    def pause(self) -> None:
        with self.lock:
            self.deadline = None

    def run(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout_s / 4))
            with self.lock:
                late = self.deadline is not None and time.monotonic() > self.deadline
            if late:
                if self.rank == 0:
                    self.out(f"dflash-tui: no answer from the other ranks for {self.timeout_s:g} s "
                             "(a rank hung or a host is unreachable); stopping")
                os._exit(1)


def load_sharded(source: str, kind: str, group: Any, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) through mlx-lm's `sharded_load`, sharded the way `kind` says."""
    from mlx_lm.utils import sharded_load

    if kind not in KINDS:
        raise ValueError(f"unknown parallelism {kind!r}")
    try:
        if kind == "pipeline":
            return sharded_load(source, trust_remote_code=trust_remote_code, pipeline_group=group)
        return sharded_load(source, trust_remote_code=trust_remote_code, tensor_group=group)
    except FileNotFoundError as exc:
        if kind == "pipeline" and exc.filename and str(exc.filename).endswith(".index.json"):
            msg = "pipeline parallel needs model.safetensors.index.json (mlx-lm reads it to pick each stage's files)"
        else:
            msg = str(exc).splitlines()[0]
        raise UserError(f"could not shard {source} over {group.size()} ranks ({kind} parallel): {msg}") from None
    except (ValueError, AssertionError) as exc:  # "does not support tensor parallelism", heads not divisible...
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"could not shard {source} over {group.size()} ranks ({kind} parallel): {msg}") from None
