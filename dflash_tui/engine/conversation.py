"""A conversation with a loaded pair: messages, prompt building, cache reuse across turns."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

import mlx.core as mx

from dflash_tui.engine.adaptive import measure_costs
from dflash_tui.engine.block_limit import refusal
from dflash_tui.engine.block_sizer import CANDIDATES, BlockSizer
from dflash_tui.engine.baseline import baseline_cycles
from dflash_tui.engine.distributed import Ranks, rank_lost
from dflash_tui.engine.events import Block, Done, Error, Event, Prefill
from dflash_tui.engine.loading import Pair
from dflash_tui.engine.sampling import KeyStream, SamplingConfig, sample
from dflash_tui.engine.speculative import Proposer, dflash_cycles, draft_logits
from dflash_tui.engine.state import DecodeState, common_prefix
from dflash_tui.errors import UserError

if TYPE_CHECKING:
    from dflash_tui.engine.prompt_cache_files import PromptCacheFiles

CancelFn = Callable[[], bool]


@dataclass
class GenerationSettings:
    max_tokens: int = 512
    block_size: Optional[Union[int, str]] = None  # None: the draft's own; "auto": adaptive
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    baseline: bool = False
    prefill_chunk: Optional[int] = None  # tokens a prefill forward takes at most; None: state.default_prefill_chunk()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sampling(self) -> SamplingConfig:
        """The token-choice part; raises ValueError on an out-of-range value."""
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p)


def _never() -> bool:
    return False


def context_length(target: Any) -> Optional[int]:
    """The model's context in tokens (max_position_embeddings; a hybrid's sits in text_config); None if unknown."""
    args = target.args
    for source in (args, getattr(args, "text_config", None)):
        value = source.get("max_position_embeddings") if isinstance(source, dict) else getattr(source, "max_position_embeddings", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _stopped_stats(use_draft: bool, prompt: list[int], cached: int, prefill_s: float) -> dict[str, Any]:
    """The figures of a turn stopped during its prefill: nothing generated."""
    zero = ("generated_tokens", "decode_s", "decode_tps", "cycles", "tokens_per_cycle", "acceptance", "draft_ms",
            "verify_ms", "rollback_ms", "prefill_tps")
    return {"mode": "dflash" if use_draft else "baseline", "prompt_tokens": len(prompt), "cached_tokens": cached,
            "prefill_s": prefill_s, "ttft_s": prefill_s, **{k: 0 for k in zero}}


class Conversation:
    """Messages plus the caches that already hold their tokens.

    Each turn re-renders the whole conversation through the chat template,
    finds how much of it the caches already hold, and prefills only the rest,
    so a turn's output equals a fresh run on the whole conversation.
    """

    def __init__(self, pair: Pair, system: Optional[str] = None, use_chat_template: bool = True):
        self.pair = pair
        self.target = pair.target
        self.tokenizer = pair.target.tokenizer
        self.use_chat_template = use_chat_template and getattr(self.tokenizer, "chat_template", None) is not None
        self.state = DecodeState(pair.target, pair.draft)
        self.propose: Proposer = draft_logits  # swappable, e.g. for an oracle in tests
        self.ranks: Optional[Ranks] = None  # set when the target is sharded over ranks: every cycle is checked
        self._sizer: Optional[BlockSizer] = None
        # saved caches on disk (engine/prompt_cache_files.py): a turn starts from one when it spares prefill
        self.saved: Optional["PromptCacheFiles"] = None
        self.messages: list[dict[str, str]] = []
        self.system = system
        self.reset(system)

    def reset(self, system: Optional[str] = None) -> None:
        """Start over (the caches are kept: the next turn reuses what still matches)."""
        self.system = system
        self.messages = [{"role": "system", "content": system}] if system else []

    def block_sizer(self, max_block: int) -> BlockSizer:
        """The adaptive sizer; its cost curve is measured once, its acceptance carries over turns."""
        if self._sizer is None or self._sizer.max_block != max(b for b in CANDIDATES if b <= max_block):
            costs = measure_costs(self.target, self.state.draft, tuple(b for b in CANDIDATES if b <= max_block))
            if self.ranks is not None:  # timed on each rank: all must choose by rank 0's
                costs = self.ranks.leaders_values(costs)
            self._sizer = BlockSizer(costs, max_block)
        self._sizer.chosen = {}
        return self._sizer

    def sizer_plan(self) -> Optional[tuple[int, int]]:
        """(the block size the adaptive sizer will choose next, target-alone steps in a row), or
        None before an adaptive turn has made the sizer."""
        return (self._sizer.peek(), self._sizer.alone) if self._sizer is not None else None

    def save_caches(self) -> Optional[Path]:
        """Write the caches of the last turn to disk (with `saved` set); the file, or None."""
        if self.saved is None:
            return None
        # what any next turn of this conversation can reuse: the prefix its renderings all share
        a, b = (self.prompt_tokens(self.messages + [{"role": "user", "content": text}]) for text in ("a", "b"))
        stable = a[: common_prefix(a, b)]
        return self.saved.save(self.state, reusable=common_prefix(self.state.tokens, stable))

    @property
    def eos_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids)

    def prompt_tokens(self, messages: Optional[list[dict[str, str]]] = None) -> list[int]:
        msgs = self.messages if messages is None else messages
        if self.use_chat_template:
            # DFlash drafts for Qwen3 were trained with thinking off
            return list(self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, enable_thinking=False))
        return list(self.tokenizer.encode("\n".join(m["content"] for m in msgs), add_special_tokens=True))

    # -- turns -------------------------------------------------------------
    def generate(self, user_text: str, settings: GenerationSettings, should_cancel: CancelFn = _never) -> Iterator[Event]:
        self.messages.append({"role": "user", "content": user_text})
        yield from self._turn(self.prompt_tokens(), settings, should_cancel, record=True, owns_user_message=True)

    def regenerate(self, settings: GenerationSettings, should_cancel: CancelFn = _never) -> Iterator[Event]:
        """Redo the last assistant reply."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            yield Error("nothing to regenerate")
            return
        yield from self._turn(self.prompt_tokens(), settings, should_cancel, record=True)

    def generate_tokens(self, prompt: list[int], settings: GenerationSettings, should_cancel: CancelFn = _never) -> Iterator[Event]:
        """Continue from raw prompt token ids (no messages recorded)."""
        yield from self._turn(list(prompt), settings, should_cancel, record=False)

    def _turn(self, prompt: list[int], settings: GenerationSettings, should_cancel: CancelFn, record: bool, owns_user_message: bool = False) -> Iterator[Event]:
        if not prompt:
            yield Error("empty prompt")
            return
        limit = context_length(self.target)
        if limit is not None and len(prompt) >= limit:  # refused before a minute of prefill, not after
            if owns_user_message:
                self.messages.pop()
            yield Error(f"the prompt is {len(prompt)} tokens; the model's context is {limit} tokens")
            return
        capped = limit is not None and len(prompt) + settings.max_tokens > limit  # past it the model was never trained
        if capped:
            settings = replace(settings, max_tokens=limit - len(prompt))  # the reply ends "length" where it is full
        try:
            sampling = settings.sampling()
        except ValueError as exc:
            yield Error(f"bad sampling settings: {exc}")
            return
        draft_block = self.state.draft.config.block_size if self.state.draft is not None else 0
        refused = isinstance(settings.block_size, int) and not settings.baseline and \
            refusal(settings.block_size, draft_block)
        if refused:  # the app and the server refuse it before asking; generate and bench pass it on
            if owns_user_message:
                self.messages.pop()
            yield Error(refused)
            return
        try:
            done = yield from self._decode(prompt, settings, sampling, should_cancel)
        except Exception as exc:  # an MLX failure (out of memory...) mid-turn: report, start clean
            self.state.reset()
            if owns_user_message:
                self.messages.pop()  # the turn never happened: sending it again must not double it
            yield Error(self._failure(exc))
            return
        if capped and done.finish_reason == "length":
            done.stats["context_full"] = True  # not max_tokens: the reply says so
        if record:
            self.messages.append({"role": "assistant", "content": done.text})
        yield done

    def _failure(self, exc: Exception) -> str:
        if isinstance(exc, UserError):  # the ranks disagree, or one is gone
            message = str(exc)
        elif self.ranks is not None and isinstance(exc, RuntimeError):  # a collective failed: a rank died
            message = str(rank_lost(exc))
        else:
            message = f"generation failed: {type(exc).__name__}: {exc}"
        if self.ranks is not None:  # a turn that failed midway left the ranks out of step
            self.ranks.broken = message
        return message

    def _decode(self, prompt: list[int], settings: GenerationSettings, sampling: SamplingConfig, should_cancel: CancelFn):
        state = self.state
        use_draft = state.draft is not None and not settings.baseline
        draft_block = state.draft.config.block_size if state.draft is not None else 1
        sizer = self.block_sizer(draft_block) if use_draft and settings.block_size == "auto" else None
        block_size = draft_block if settings.block_size in (None, "auto") else settings.block_size
        max_tokens = settings.max_tokens
        eos = self.eos_ids
        # one explicit key per turn: a seed reproduces the turn whatever else runs in the process
        keys = None if sampling.is_greedy else KeyStream(settings.seed)
        mx.reset_peak_memory()
        ranks = self.ranks
        sync_before, checks_before = (ranks.sync_ms, ranks.checks) if ranks is not None else (0.0, 0)
        if ranks is not None:
            ranks.beat()
            ranks.settle()
            should_cancel = ranks.follow_stop(should_cancel)  # every rank stops after the same cycle

        if self.saved is not None and ranks is None:
            self.saved.warm(state, prompt)  # a saved turn that holds more of this prompt than memory does
        # reuse what the caches already hold; at least one token must be prefilled
        cached = state.truncate(min(common_prefix(state.tokens, prompt), len(prompt) - 1, state.exact_reuse()))
        logits, prefill_s = state.prefill(prompt[cached:], settings.prefill_chunk, should_cancel)
        yield Prefill(prompt_tokens=len(prompt), cached_tokens=cached, seconds=prefill_s)
        if logits is None:  # stopped between prefill chunks: no reply; the caches keep what was prefilled
            return Done(tokens=[], text="", finish_reason="cancelled", stats=_stopped_stats(use_draft, prompt, cached, prefill_s))

        detok = self.tokenizer.detokenizer
        detok.reset()
        tokens: list[int] = []
        totals = {"cycles": 0, "drafted": 0, "accepted": 0, "cycle_tokens": 0, "draft_ms": 0.0, "verify_ms": 0.0, "rollback_ms": 0.0}
        finish = "length"
        decode_start = time.perf_counter()

        def emit(new: list[int]) -> tuple[list[int], str, bool]:
            """Cut at EOS / max_tokens; returns (what the reply keeps, its text, finished)."""
            nonlocal finish
            kept = []
            for t in new:
                if t in eos:
                    finish = "stop"
                    return kept, _text(kept), True
                kept.append(t)
                if len(tokens) + len(kept) >= max_tokens:
                    finish = "length"
                    return kept, _text(kept), True
            return kept, _text(kept), False

        def _text(kept: list[int]) -> str:
            before = len(detok.text)
            for t in kept:
                detok.add_token(t)
            return detok.text[before:]

        first = int(sample(logits, sampling, keys.next() if keys is not None else None).item())
        if ranks is not None:
            ranks.agree(0, [first])
        kept, text, finished = emit([first])
        tokens.extend(kept)
        first_at = last_at = time.perf_counter()  # decode speed: the first token to the reply's end
        yield Block(index=0, drafted=[], accepted=0, emitted=[first] if finish == "stop" else kept, text=text,
                    eos=finish == "stop")
        index = 1
        if not finished and max_tokens > 1:
            remaining = lambda: max_tokens - len(tokens)  # noqa: E731
            cycles = (
                dflash_cycles(state, first, sizer or block_size, remaining, should_cancel, self.propose, sampling, keys)
                if use_draft
                else baseline_cycles(state, first, remaining, should_cancel, sampling, keys)
            )
            if ranks is not None:
                cycles = ranks.checked(cycles)
            for cyc in cycles:
                kept, text, finished = emit(cyc.emitted)
                tokens.extend(kept)
                last_at = time.perf_counter()  # the cycle that only ends the reply is waited for too
                # what the cycle gave the reply: the kept tokens, and the EOS that ended it; a drafted
                # token past that end is not accepted, whatever the target says of it
                stopped = finished and finish == "stop"
                produced = cyc.emitted[: len(kept) + 1] if stopped else kept
                accepted = min(cyc.accepted, len(produced))
                if cyc.drafted:
                    totals["cycles"] += 1
                    totals["drafted"] += len(cyc.drafted)
                    totals["accepted"] += accepted
                    totals["cycle_tokens"] += len(produced)
                for k in ("draft_ms", "verify_ms", "rollback_ms"):
                    totals[k] += getattr(cyc, k)
                yield Block(index=index, drafted=cyc.drafted, accepted=accepted, emitted=produced, text=text,
                            draft_ms=cyc.draft_ms, verify_ms=cyc.verify_ms, rollback_ms=cyc.rollback_ms, eos=stopped)
                index += 1
                if finished:
                    break
            else:
                if should_cancel():
                    finish = "cancelled"
            cycles.close()
        decode_s = time.perf_counter() - decode_start
        detok.finalize()
        n = len(tokens)
        stats = {
            "mode": "dflash" if use_draft else "baseline",
            "block_size": ("auto" if sizer else block_size) if use_draft else 1,
            "block_sizes": dict(sorted(sizer.chosen.items())) if sizer else {},
            "prompt_tokens": len(prompt),
            "cached_tokens": cached,
            "prefill_s": prefill_s,
            "prefill_tps": (len(prompt) - cached) / prefill_s if prefill_s > 0 else 0.0,
            "ttft_s": prefill_s,
            "generated_tokens": n,
            "decode_s": decode_s,
            # the first token comes from prefill; decode speed counts the rest, over the time from
            # the first token to the end of the reply, the cycle or step that ends it included (a
            # cycle costs more than a step: leaving the one that only says EOS out would favour
            # DFlash); bench measures mlx_lm.stream_generate the same way
            "decode_tps": (n - 1) / (last_at - first_at) if n > 1 and last_at > first_at else 0.0,
            "cycles": totals["cycles"],
            "tokens_per_cycle": totals["cycle_tokens"] / totals["cycles"] if totals["cycles"] else 0.0,
            "acceptance": totals["accepted"] / totals["drafted"] if totals["drafted"] else 0.0,
            "draft_ms": totals["draft_ms"],
            "verify_ms": totals["verify_ms"],
            "rollback_ms": totals["rollback_ms"],
            "peak_memory": mx.get_peak_memory(),
            "temperature": sampling.temperature,
            "seed": keys.seed if keys is not None else None,  # the seed actually used: an unseeded run can be redone
        }
        if ranks is not None:
            stats.update(ranks.stats(), sync_ms=ranks.sync_ms - sync_before, agreement_checks=ranks.checks - checks_before)
        return Done(tokens=tokens, text=detok.text, finish_reason=finish, stats=stats)
