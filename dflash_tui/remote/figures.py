"""Speculative-decoding figures a server reports, read into one shape (counts only: no token is invented).

Sources, in the order a client can trust them:

- vLLM's per-request `metrics.speculative_decoding` (a response's or the finishing chunk's `metrics`):
  `num_spec_steps`, `num_draft_tokens`, `num_accepted_draft_tokens`, and with the server's
  `--per-request-spec-decode-metrics detailed`, `per_step_accepted` / `per_step_drafted`
  (https://docs.vllm.ai/en/stable/features/speculative_decoding/acceptance_metrics/).
- SGLang's `meta_info` spec fields (python/sglang/srt/managers/tokenizer_manager.py in sgl-project/sglang):
  `spec_verify_ct` (verify steps), `spec_num_correct_drafts` / `spec_num_proposed_drafts` (older releases:
  `spec_accepted_drafts` / `spec_proposed_drafts`, or `spec_accept_token_num` / `spec_draft_token_num`),
  `spec_accept_length` = completion tokens / verify steps.
- The server's Prometheus `/metrics` counters before and after the request (vLLM's
  `vllm:spec_decode_num_drafts_total`, `…_num_draft_tokens_total`, `…_num_accepted_tokens_total`;
  `dflash-tui serve` writes the same names under `dflash:`). Server-wide: other clients' requests in
  between count too, which the pane says.

Anything malformed (a string for a count, accepted > drafted, lists of different lengths) is ignored
as a whole: no figure beats a wrong one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

MAX_STEPS = 100_000  # more per-step entries than any one reply has: the lists are dropped, the totals kept
VLLM = "vLLM per-request metrics"
SGLANG = "SGLang meta_info"
METRICS = "the server's /metrics, before and after (server-wide)"
_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
             "spec_decode_num_accepted_tokens_total")
_PREFIXES = ("vllm:", "dflash:", "sglang:")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass
class SpecFigures:
    source: str
    steps: int  # verification steps
    accepted: int  # accepted draft tokens
    drafted: Optional[int]  # proposed draft tokens (None: the server does not say)
    per_step: Optional[list[tuple[int, int]]] = None  # (accepted, drafted) of each step, in order

    def to_stats(self) -> dict[str, Any]:
        """Figures for a Done's stats (the keys the meter, the footers and the session read)."""
        out: dict[str, Any] = {"spec_source": self.source, "cycles": self.steps, "spec_accepted": self.accepted}
        if self.steps:
            out["tokens_per_cycle"] = 1.0 + self.accepted / self.steps  # vLLM's mean acceptance length
        if self.drafted:
            out["spec_drafted"] = self.drafted
            out["acceptance"] = self.accepted / self.drafted
        if self.per_step is not None:
            out["spec_steps"] = [[a, d] for a, d in self.per_step]
        return out


def _count(v: Any) -> Optional[int]:
    if type(v) is int and v >= 0:
        return v
    if type(v) is float and v >= 0 and v.is_integer():
        return int(v)
    return None


def _steps(accepted: Any, drafted: Any) -> Optional[list[tuple[int, int]]]:
    if not isinstance(accepted, list) or not isinstance(drafted, list) or len(accepted) != len(drafted):
        return None
    if len(accepted) > MAX_STEPS:
        return None
    out = []
    for a, d in zip(accepted, drafted):
        a, d = _count(a), _count(d)
        if a is None or d is None or a > d:
            return None
        out.append((a, d))
    return out


def from_vllm(metrics: Any) -> Optional[SpecFigures]:
    """`metrics` of a vLLM response or chunk; None without (valid) speculative figures."""
    sd = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(sd, dict):
        return None
    per_step = _steps(sd.get("per_step_accepted"), sd.get("per_step_drafted"))
    steps, accepted = _count(sd.get("num_spec_steps")), _count(sd.get("num_accepted_draft_tokens"))
    drafted = _count(sd.get("num_draft_tokens"))
    if per_step is not None and steps is None:
        steps, accepted, drafted = len(per_step), sum(a for a, _ in per_step), sum(d for _, d in per_step)
    if steps is None or accepted is None or (drafted is not None and accepted > drafted):
        return None
    if per_step is not None and len(per_step) != steps:
        per_step = None  # lists that disagree with the totals: the totals stand
    return SpecFigures(VLLM, steps, accepted, drafted, per_step)


def from_sglang(meta: Any) -> Optional[SpecFigures]:
    """SGLang's `meta_info`; None without (valid) speculative figures."""
    if not isinstance(meta, dict):
        return None
    steps = _count(meta.get("spec_verify_ct"))
    if not steps:
        return None
    accepted = drafted = None
    for a_key, d_key in (("spec_num_correct_drafts", "spec_num_proposed_drafts"),
                         ("spec_accepted_drafts", "spec_proposed_drafts"),
                         ("spec_accept_token_num", "spec_draft_token_num")):
        if a_key in meta:
            accepted, drafted = _count(meta.get(a_key)), _count(meta.get(d_key))
            break
    if accepted is None:  # only the mean: completion tokens = steps × length, one of them the target's own
        length, completion = meta.get("spec_accept_length"), _count(meta.get("completion_tokens"))
        if completion is not None and completion >= steps:
            accepted = completion - steps
        elif isinstance(length, (int, float)) and not isinstance(length, bool) and math.isfinite(length) and length >= 1:
            accepted = round((length - 1) * steps)
        else:
            return None
    if drafted is not None and accepted > drafted:
        return None
    return SpecFigures(SGLANG, steps, accepted, drafted)


def parse_counters(text: str) -> dict[str, float]:
    """The speculative counters of a Prometheus text page, summed over labels, by name without prefix."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        for prefix in _PREFIXES:
            if name.startswith(prefix) and name[len(prefix):] in _COUNTERS:
                try:
                    value = float(m.group(3))
                except ValueError:
                    break
                if math.isfinite(value):
                    key = name[len(prefix):]
                    out[key] = out.get(key, 0.0) + value
                break
    return out


def from_counters(before: dict[str, float], after: dict[str, float]) -> Optional[SpecFigures]:
    """What the counters grew by over one request; None if they did not (or went back: a restart)."""
    if not all(k in before and k in after for k in _COUNTERS):
        return None
    steps, drafted, accepted = (int(after[k] - before[k]) for k in _COUNTERS)
    if steps <= 0 or drafted < 0 or accepted < 0 or accepted > drafted:
        return None
    return SpecFigures(METRICS, steps, accepted, drafted)
