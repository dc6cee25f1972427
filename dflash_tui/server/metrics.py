"""Server-wide counters, rendered in Prometheus' text exposition format.

Names follow vLLM's where the meaning is the same, with `dflash:` for `vllm:`
(vllm-project/vllm docs/design/metrics.md at 0328b592a3d35f9b4dc5549d2a3fb8d1531c8e5f and
vllm/v1/spec_decode/metrics.py at 016a8587edb04ae53c913a1da9355a07dc0ca4ae):
`spec_decode_num_drafts`, `spec_decode_num_draft_tokens`, `spec_decode_num_accepted_tokens`,
`spec_decode_num_accepted_tokens_per_pos{position}` (counters, exposed with `_total`),
`prompt_tokens`, `generation_tokens`, `request_success{finished_reason}`,
`prefix_cache_queries` / `prefix_cache_hits` (in tokens), `num_requests_running` /
`num_requests_waiting`, and the histograms `time_to_first_token_seconds`,
`e2e_request_latency_seconds`, `request_queue_time_seconds`. Ours alone:
`request_decode_tokens_per_second` and `requests_rejected`.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field
from typing import Callable

from dflash_tui.server.spec_tally import SpecTally

PREFIX = "dflash:"
TIME_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
SPEED_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)


@dataclass
class RequestRecord:
    """What one finished request adds to the counters."""

    finish_reason: str  # stop | length | cancelled | error
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    queue_s: float = 0.0
    ttft_s: float | None = None  # None: no token came
    e2e_s: float = 0.0
    decode_tps: float = 0.0
    tally: SpecTally | None = None


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class ServerMetrics:
    """Thread-safe: the engine thread records, the event loop renders."""

    def __init__(self, model_name: str, gauges: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> None:
        self._lock = threading.Lock()
        self._model = _label_value(model_name)
        self._gauges = gauges  # () -> (running, waiting)
        self.finished: dict[str, int] = {}
        self.rejected: dict[str, int] = {}
        self.prompt_tokens = self.cached_tokens = self.generation_tokens = 0
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.ttft = _Histogram(TIME_BUCKETS)
        self.e2e = _Histogram(TIME_BUCKETS)
        self.queue = _Histogram(TIME_BUCKETS)
        self.decode_tps = _Histogram(SPEED_BUCKETS)

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def record(self, r: RequestRecord) -> None:
        with self._lock:
            self.finished[r.finish_reason] = self.finished.get(r.finish_reason, 0) + 1
            self.prompt_tokens += r.prompt_tokens
            self.cached_tokens += r.cached_tokens
            self.generation_tokens += r.generation_tokens
            self.queue.observe(r.queue_s)
            self.e2e.observe(r.e2e_s)
            if r.ttft_s is not None:
                self.ttft.observe(r.ttft_s)
            if r.decode_tps > 0:
                self.decode_tps.observe(r.decode_tps)
            if r.tally is not None:
                self.drafts += r.tally.steps
                self.draft_tokens += r.tally.drafted
                self.accepted_tokens += r.tally.accepted
                per_pos = r.tally.accepted_per_position()
                if len(per_pos) > len(self.accepted_per_pos):
                    self.accepted_per_pos.extend([0] * (len(per_pos) - len(self.accepted_per_pos)))
                for i, v in enumerate(per_pos):
                    self.accepted_per_pos[i] += v

    def render(self) -> str:
        """The text exposition format (version 0.0.4)."""
        running, waiting = self._gauges()
        out: list[str] = []
        base = f'model_name="{self._model}"'

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> None:
            full = PREFIX + name
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} {kind}")
            for suffix, labels, value in samples:
                label_text = base + ("," + labels if labels else "")
                out.append(f"{full}{suffix}{{{label_text}}} {_num(value)}")

        def histogram(name: str, help_text: str, h: _Histogram) -> None:
            samples: list[tuple[str, str, float]] = []
            cumulative = 0
            for bound, count in zip(h.buckets, h.counts):
                cumulative += count
                samples.append(("_bucket", f'le="{bound}"', cumulative))
            samples += [("_bucket", 'le="+Inf"', h.n), ("_sum", "", float(h.total)), ("_count", "", h.n)]
            family(name, "histogram", help_text, samples)

        with self._lock:
            family("num_requests_running", "gauge", "Requests being generated (at most one: one engine).", [("", "", running)])
            family("num_requests_waiting", "gauge", "Requests waiting in the queue.", [("", "", waiting)])
            family("request_success_total", "counter", "Finished requests by finish reason.",
                   [("", f'finished_reason="{_label_value(k)}"', v) for k, v in sorted(self.finished.items())])
            family("requests_rejected_total", "counter", "Requests refused before generation, by reason.",
                   [("", f'reason="{_label_value(k)}"', v) for k, v in sorted(self.rejected.items())])
            family("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", [("", "", self.prompt_tokens)])
            family("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the cache.", [("", "", self.prompt_tokens)])
            family("prefix_cache_hits_total", "counter", "Prompt tokens found in the cache (shared with the previous request).",
                   [("", "", self.cached_tokens)])
            family("generation_tokens_total", "counter", "Generated tokens.", [("", "", self.generation_tokens)])
            histogram("time_to_first_token_seconds", "Time from arrival to the first token (queue + prefill).", self.ttft)
            histogram("e2e_request_latency_seconds", "Time from arrival to the end of generation.", self.e2e)
            histogram("request_queue_time_seconds", "Time spent waiting for the engine.", self.queue)
            histogram("request_decode_tokens_per_second", "Decode speed of each request (first token to last).", self.decode_tps)
            family("spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts (verification steps).",
                   [("", "", self.drafts)])
            family("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", [("", "", self.draft_tokens)])
            family("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", [("", "", self.accepted_tokens)])
            family("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.",
                   [("", f'position="{i}"', v) for i, v in enumerate(self.accepted_per_pos)])
        return "\n".join(out) + "\n"
