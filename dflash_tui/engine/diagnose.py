"""What `dflash-tui doctor` finds: the draft that would be used and why, every check with its
verdict, the backend and kernels, and the memory the pair needs. Nothing is loaded or downloaded."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

from dflash_tui.engine.facts import (
    DraftFacts, Location, TargetFacts, cache_bytes, check_vocab_rows, draft_facts, human_bytes, locate,
    read_config, target_facts,
)
from dflash_tui.engine.fit import Check, fit_checks
from dflash_tui.engine.registry import choose_draft
from dflash_tui.errors import UserError

DEFAULT_TOKENS = 8192
# what reading a hostile or broken config.json can raise (CheckpointError is a ValueError)
_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError)


@dataclass
class Backend:
    backend: str  # "Metal" | "CUDA" | "CPU"
    device: str
    kernels: str
    attention: str  # the multi-query attention mode the draft and the verify run
    budget: Optional[int]  # bytes the pair may use
    budget_source: str


@dataclass
class Memory:
    tokens: int  # the context length the figures are for
    target_weights: int
    target_cache: int  # KV of attention layers + the fixed state of linear ones
    draft_weights: int
    draft_cache: int
    hybrid_extra: int  # state snapshots and the verify's per-step states (hybrids only)
    total: int
    context: int  # the target's own maximum context
    total_at_context: int
    budget: Optional[int]
    max_tokens: Optional[int]  # the longest context that fits the budget (at most `context`)


@dataclass
class Diagnosis:
    target: str
    target_location: Location
    draft: Optional[str]
    draft_reason: str
    draft_location: Optional[Location]
    checks: list[Check]
    backend: Backend
    target_facts: Optional[TargetFacts] = None
    draft_facts: Optional[DraftFacts] = None
    memory: Optional[Memory] = None
    wont_work: list[str] = field(default_factory=list)
    distributed: Any = None  # RankFacts (engine/rank_diagnose.py) under doctor --distributed

    @property
    def hybrid(self) -> Optional[bool]:
        return self.target_facts.hybrid if self.target_facts else None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    @property
    def unchecked(self) -> list[Check]:
        return [c for c in self.checks if c.ok is None]


# -- the machine -------------------------------------------------------------------------------
def backend_facts() -> Backend:
    import mlx.core as mx

    from dflash_tui.engine.cuda_kernels import kernels_wanted, on_cuda
    from dflash_tui.engine.draft import default_attention_mode

    try:
        info: dict[str, Any] = dict(mx.device_info())
    except Exception:  # not every backend reports
        info = {}
    name = str(info.get("device_name") or info.get("architecture") or "")
    on_gpu = mx.default_device() == mx.gpu
    if on_gpu and mx.metal.is_available():
        kind = "Metal"
        budget = info.get("max_recommended_working_set_size") or info.get("memory_size")
        source = "Metal's recommended working set"
    elif on_cuda():
        kind = "CUDA"
        budget = info.get("free_memory") or info.get("total_memory") or info.get("memory_size")
        source = "free GPU memory" if info.get("free_memory") else "GPU memory"
    else:
        import psutil

        kind, budget, source = "CPU", psutil.virtual_memory().available, "available system memory"
    if kernels_wanted():
        kernels = ("the engine's CUDA block kernels (block_attention, gated_delta_steps)" if on_cuda()
                   else "the engine's block kernels as pure-MLX references (DFLASH_TUI_KERNELS is set)")
    else:
        kernels = "MLX's own (fused attention, mlx-lm's Gated DeltaNet)"
    try:
        attention = default_attention_mode()
    except UserError as exc:
        attention = f"invalid: {exc}"
    return Backend(kind, name, kernels, attention, int(budget) if budget else None, source)


# -- the pair ----------------------------------------------------------------------------------
def _where(loc: Location, what: str) -> Check:
    if loc.where == "directory":
        return Check(what, True, f"local directory {loc.path}")
    if loc.where == "hub cache":
        if loc.missing:
            return Check(what, None, f"partly in the Hugging Face cache ({len(loc.missing)} weight files missing): "
                                     "the rest would be downloaded on first run")
        return Check(what, True, f"in the Hugging Face cache at {loc.path}")
    if loc.where == "not downloaded":
        return Check(what, None, "not in the Hugging Face cache: it would be downloaded on first run "
                                 "(doctor downloads nothing)")
    return Check(what, False, "no such directory, and not a hub repo id like owner/name")


def _mlx_lm_support(folder) -> Check:
    """Can the installed mlx-lm build this architecture? (imports the model module only)"""
    import mlx_lm
    from mlx_lm.utils import _get_classes  # the lookup mlx_lm.load itself uses

    cfg = read_config(folder)
    if "DFlash" in " ".join(str(a) for a in cfg.get("architectures") or []):
        return Check("architecture", False, "this is a DFlash draft, not a target model; pass it as --draft")
    if cfg.get("model_file"):
        return Check("architecture", None, "the checkpoint ships its own model code: it runs only with --trust-remote-code")
    try:
        _model, args_class = _get_classes(config=cfg)
    except Exception as exc:
        return Check("architecture", False, f"mlx-lm {mlx_lm.__version__} cannot build it: {exc}")
    try:  # its settings as mlx_lm.load reads them: a field the architecture needs and the file lacks fails here
        args_class.from_dict(cfg)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Check("architecture", False, f"mlx-lm {mlx_lm.__version__} cannot read its config.json: {first}")
    return Check("architecture", True, f"model_type {cfg.get('model_type')} (mlx-lm {mlx_lm.__version__})")


def _hybrid_extra(t: TargetFacts, block: int, backend: str) -> int:
    """A hybrid keeps up to HybridTarget's max_snapshots copies of its linear state for
    multi-turn truncation, and (outside Metal) every step's recurrent state of a verify."""
    if not t.hybrid:
        return 0
    from dflash_tui.engine.hybrid import HybridTarget

    snapshots = inspect.signature(HybridTarget.__init__).parameters["max_snapshots"].default
    per_step = 0 if backend == "Metal" or block <= 1 else block * t.recurrent_bytes * t.kinds["linear"]
    return snapshots * t.fixed_state + per_step


def memory_needed(t: TargetFacts, d: Optional[DraftFacts], tokens: Optional[int], backend: Backend) -> Memory:
    """Memory at `tokens` of context (None: DEFAULT_TOKENS, or the model's context if shorter)."""
    if tokens is None:
        tokens = min(DEFAULT_TOKENS, t.context or DEFAULT_TOKENS)
    block = d.config.block_size if d else 1
    extra = _hybrid_extra(t, block, backend.backend)
    draft_weights = d.weights_bytes if d else 0

    def total(n: int) -> int:
        return t.weights_bytes + cache_bytes(t.cache, n) + draft_weights + (d.per_token * n if d else 0) + extra

    context = t.context or tokens
    max_tokens = None
    if backend.budget is not None:
        lo, hi = 0, context
        if total(0) > backend.budget:
            max_tokens = 0
        else:
            while lo < hi:  # the longest context whose total fits
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if total(mid) <= backend.budget else (lo, mid - 1)
            max_tokens = lo
    return Memory(tokens, t.weights_bytes, cache_bytes(t.cache, tokens), draft_weights,
                  d.per_token * tokens if d else 0, extra, total(tokens), context, total(context),
                  backend.budget, max_tokens)


def diagnose(model: str, draft: Optional[str] = None, tokens: Optional[int] = None,
             draft_reason: str = "given with --draft") -> Diagnosis:
    """`draft_reason`: why an explicitly named draft is the one (it comes from the registry otherwise)."""
    backend = backend_facts()
    target_loc = locate(model)
    choice = choose_draft(model)
    draft_name = draft or choice.draft
    reason = draft_reason if draft else choice.reason + (f"; {choice.note}" if choice.note else "")
    draft_loc = locate(draft_name) if draft_name else None
    diag = Diagnosis(model, target_loc, draft_name, reason, draft_loc, [], backend)
    checks = diag.checks

    checks.append(_where(target_loc, "target"))
    t = d = None
    if target_loc.present:
        try:
            support = _mlx_lm_support(target_loc.path)
            checks.append(support)
            if support.ok is not False:
                facts = target_facts(target_loc.path)
                if support.ok:  # (a model of its own code is built by that code)
                    check_vocab_rows(target_loc.path)
                t = facts
        except _UNREADABLE as exc:  # config.json or headers that are not what they claim
            checks.append(Check("target files", False, str(exc)))
    if draft_loc is None:
        checks.append(Check("draft", False, f"{choice.reason}: DFlash is off"))
        diag.wont_work.append("DFlash: the app would run the target alone (its meter says so); pass a draft with --draft")
    else:
        checks.append(_where(draft_loc, "draft"))
        if not choice.exact and not draft and choice.draft:
            diag.wont_work.append("the best acceptance: the draft was trained for another model (see why above); "
                                  "the output stays exact")
        if draft_loc.present:
            try:
                d = draft_facts(draft_loc.path)
                checks.append(Check("draft config", True, f"DFlash draft, {d.config.num_hidden_layers} layers, "
                                                          f"block size {d.config.block_size}"))
            except (UserError, *_UNREADABLE) as exc:
                checks.append(Check("draft config", False, str(exc)))
    if t is not None and d is not None:
        checks.extend(fit_checks(d.config, t.hidden_size, t.vocab_size, t.num_layers))
    elif draft_loc is not None:
        absent = [what for what, loc in (("target", target_loc), ("draft", draft_loc))
                  if loc.where in ("not downloaded", "hub cache") and not loc.present]
        if absent:  # (a side that failed has its own failed check)
            checks.append(Check("fit", None, f"not checked until the {' and '.join(absent)} files are downloaded"))
    diag.target_facts, diag.draft_facts = t, d
    if t is not None:
        diag.memory = m = memory_needed(t, d, tokens, backend)
        if m.budget is None:
            checks.append(Check("memory", None, "this backend does not report its memory"))
        else:
            checks.append(Check("memory", m.total <= m.budget, f"{human_bytes(m.total)} needed at {m.tokens} tokens, "
                                                               f"{human_bytes(m.budget)} available ({backend.budget_source})"))
            if m.max_tokens is not None and m.max_tokens < m.context:
                diag.wont_work.append(f"contexts beyond about {m.max_tokens} tokens (the model allows {m.context}): "
                                      "they do not fit in memory")
        if d is not None and d.config.max_position_embeddings < t.context:
            diag.wont_work.append(f"past {d.config.max_position_embeddings} tokens the draft runs beyond the positions "
                                  "it was trained for: acceptance may drop (the output stays exact)")
    return diag
