"""`dflash-tui doctor`: which draft a model would get and why, whether the pair fits, on what backend,
in how much memory, and what would not work. Reads config.json files and safetensors headers only:
nothing is loaded or downloaded.

Exit status: 0 everything checked fits; 1 a check failed; 3 nothing failed but some checks could
not be made (a hub model not downloaded yet).
"""

from __future__ import annotations

import argparse
import json
import unicodedata
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Optional

from dflash_tui.errors import UserError

if TYPE_CHECKING:
    from dflash_tui.engine.diagnose import Diagnosis
    from dflash_tui.engine.facts import Location

NOT_CHECKED = 3
USAGE = 2  # as argparse's own errors
_MARK = {True: "ok", False: "FAIL", None: "?"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Reads config files and weight-file headers only; downloads nothing. Exit status: 0 everything "
                     "fits, 1 a check failed, 2 a usage error, 3 some checks need files not downloaded yet.")
    parser.add_argument("--model", "-m", metavar="M", help="target: a local mlx-lm model directory or a hub repo id")
    parser.add_argument("--draft", "-d", metavar="D", help="DFlash draft (default: the registry's for --model)")
    parser.add_argument("--demo", action="store_true", help="check the bundled demo pair (the default without --model)")
    parser.add_argument("--tokens", type=int, default=None, metavar="N",
                        help="context length the memory figures are for, at most the model's context (default 8192, "
                             "or the model's context if shorter; a longer one is a usage error)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    from dflash_tui.commands.common import add_distributed_arguments

    add_distributed_arguments(parser)


def clean(text: Any) -> str:
    """Control and format characters (escapes, bidi overrides) written out as escapes:
    a model name or config value must not drive the terminal."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def run(args: argparse.Namespace) -> int:
    from dflash_tui.commands.common import resolve_pair
    from dflash_tui.engine.diagnose import diagnose

    tokens = args.tokens
    try:  # a usage error exits 2 here: doctor's 1 means a check failed
        if tokens is not None and tokens < 1:
            raise UserError("--tokens must be at least 1")
        if getattr(args, "pipeline", False) and not getattr(args, "distributed", False):
            raise UserError("--pipeline needs --distributed (under mlx.launch)")
        model, draft = resolve_pair(args)
    except UserError as exc:
        raise UserError(str(exc), exit_code=USAGE) from None
    demo = args.demo or not args.model
    diag = diagnose(model, draft, tokens, draft_reason="the bundled demo pair" if demo else "given with --draft")
    t = diag.target_facts
    if tokens is not None and t is not None and t.context and tokens > t.context:
        # the app refuses a prompt that long: figures for it would describe nothing that can run
        raise UserError(f"--tokens {tokens} is beyond the model's context ({t.context} tokens)", exit_code=USAGE)
    if t is not None and not t.context:  # config.json states none: the figures are for --tokens alone
        diag.wont_work = [w.split(" (the model allows")[0] + ": they do not fit in memory"
                          if w.startswith("contexts beyond") else w for w in diag.wont_work]
    if getattr(args, "distributed", False) and not _add_ranks(args, diag):
        return 1 if diag.failed else NOT_CHECKED if diag.unchecked else 0  # another rank than 0: rank 0 reports
    if args.json:
        print(json.dumps(as_json(diag), indent=2))  # ensure_ascii: control characters come out escaped
    else:
        for line in report_lines(diag):
            print(clean(line))
    if diag.failed:
        return 1
    return NOT_CHECKED if diag.unchecked else 0


def _add_ranks(args: argparse.Namespace, diag: "Diagnosis") -> bool:
    """Under mlx.launch: the ranks' figures and whether mlx-lm can shard the target; True on rank 0."""
    from dflash_tui.commands.common import ranks_from_args
    from dflash_tui.engine.rank_diagnose import rank_facts, ranked_memory_check, shard_check

    ranks = ranks_from_args(args)
    if diag.target_location.present and diag.target_facts is not None:
        diag.checks.append(shard_check(diag.target_location.path, ranks.kind))
    m = diag.memory
    if m is not None and m.budget is not None:  # its figures are one machine's holding the whole pair
        diag.checks = [ranked_memory_check(c, m.total, m.budget, ranks.size, ranks.kind) if c.name == "memory" else c
                       for c in diag.checks]
        diag.wont_work = [w for w in diag.wont_work if not w.startswith("contexts beyond")]
    diag.distributed = rank_facts(ranks, diag.target_facts)
    return ranks.is_leader


def rank_lines(r) -> list[str]:
    from dflash_tui.engine.rank_diagnose import rounds_text

    lines = [f"ranks    {r.ranks} ({r.parallel} parallel: mlx-lm's sharding splits the target, every rank holds the whole draft)",
             f"         sync {r.sync_ms:.3f} ms per cycle: the agreement check, one all_sum of 4 integers (median of 20)"]
    if r.forward_comm_ms is not None:
        lines.append(f"         one token's hidden state all-reduced: {r.hidden_all_reduce_ms:.3f} ms; a target forward makes "
                     f"about {r.rounds_per_forward} network rounds ({rounds_text(r.parallel)}): ~{r.forward_comm_ms:.1f} ms "
                     "per forward (an estimate), once per DFlash cycle, once per token without a draft")
    return lines


# -- the report --------------------------------------------------------------------------------
def report_lines(diag: "Diagnosis") -> list[str]:
    from dflash_tui.engine.facts import human_bytes as hb

    t, d, b, m = diag.target_facts, diag.draft_facts, diag.backend, diag.memory
    lines = [f"target   {diag.target}"]
    if t is not None:
        kinds = ", ".join(f"{n} {k}" for k, n in t.kinds.items())
        lines.append(f"         {t.model_type}: {t.num_layers} layers ({kinds}), hidden {t.hidden_size}, "
                     f"vocab {t.vocab_size}, " + (f"context {t.context}" if t.context
                                                  else "context not stated in config.json"))
        lines.append(f"         quantization: {t.quantization}; computes and caches in {t.activation_dtype}")
        lines.append("         hybrid: " + ("yes: Gated DeltaNet layers roll back from a per-cycle record"
                                            if t.hybrid else "no"))
    lines.append(f"draft    {diag.draft or 'none: the target would run alone'}")
    lines.append(f"         why: {diag.draft_reason}")
    if d is not None:
        c = d.config
        lines.append(f"         {c.num_hidden_layers} layers, block size {c.block_size}, "
                     f"reads target layers {c.target_layer_ids}, {d.params} parameters")
        lines.append("         loaded in bfloat16; --draft-quant 4|8 (draft_quant in config.toml) quantizes its "
                     "linear layers at load")
    lines.append(f"backend  {b.backend}" + (f" ({b.device})" if b.device else "")
                 + f"; attention: {b.attention}; kernels: {b.kernels}")
    if diag.distributed is not None:
        lines += rank_lines(diag.distributed)
    lines.append("checks")
    width = max(len(c.name) for c in diag.checks)
    lines += [f"  {_MARK[c.ok]:<4}  {c.name:<{width}}  {c.detail}" for c in diag.checks]
    if m is not None:
        lines.append(f"memory at {m.tokens} tokens")
        # (what, bytes, bytes per token of context)
        rows = [("target weights", m.target_weights, 0), ("target cache", m.target_cache, t.per_token if t else 0),
                ("draft weights", m.draft_weights, 0), ("draft cache", m.draft_cache, d.per_token if d else 0)]
        if m.hybrid_extra:
            rows.append(("hybrid state copies", m.hybrid_extra, 0))
        rows.append(("total", m.total, 0))
        lines += [f"  {what:<20} {hb(n)}" + (f" ({hb(per)} per token)" if per else "") for what, n, per in rows]
        known = t is not None and t.context > 0  # else m.context is just m.tokens
        if known:
            lines.append(f"  at the model's context ({m.context} tokens): {hb(m.total_at_context)}")
        if m.budget is not None:
            if m.max_tokens == m.context:
                fits = "the whole context fits" if known else f"{m.tokens} tokens of context fit"
            else:
                fits = f"fits up to about {m.max_tokens} tokens of context"
            lines.append(f"  available: {hb(m.budget)} ({b.budget_source}); {fits}")
        if diag.distributed is not None:
            lines.append(f"  (the whole pair on one machine; each of the {diag.distributed.ranks} ranks holds a share)")
    if diag.wont_work:
        lines.append("would not work")
        lines += [f"  - {w}" for w in diag.wont_work]
    lines.append(verdict(diag))
    return lines


def verdict(diag: "Diagnosis") -> str:
    if diag.failed:
        return "verdict: does not work: " + ", ".join(c.name for c in diag.failed)
    if diag.unchecked:
        return "verdict: nothing failed, not everything could be checked: " + ", ".join(c.name for c in diag.unchecked)
    return "verdict: everything fits"


def as_json(diag: "Diagnosis") -> dict[str, Any]:
    t, d = diag.target_facts, diag.draft_facts
    out: dict[str, Any] = {
        "target": diag.target,
        "target_location": _location(diag.target_location),
        "draft": diag.draft,
        "draft_reason": diag.draft_reason,
        "draft_location": _location(diag.draft_location),
        "hybrid": diag.hybrid,
        "checks": [asdict(c) for c in diag.checks],
        "backend": asdict(diag.backend),
        "memory": asdict(diag.memory) if diag.memory else None,
        "would_not_work": diag.wont_work,
        "ok": not diag.failed and not diag.unchecked,
    }
    if diag.distributed is not None:
        r = diag.distributed
        out["distributed"] = {**asdict(r), "forward_comm_ms_estimate": r.forward_comm_ms}
    if t is not None:
        out["target_facts"] = {k: v for k, v in asdict(t).items() if k != "cache"}
        out["target_facts"].update(kv_bytes_per_token=t.per_token, fixed_state_bytes=t.fixed_state)
    if d is not None:
        out["draft_facts"] = {"config": d.config.to_dict(), "params": d.params, "weights_bytes": d.weights_bytes,
                              "kv_bytes_per_token": d.per_token}
    return out


def _location(loc: "Optional[Location]") -> Optional[dict[str, Any]]:
    if loc is None:
        return None
    return {"where": loc.where, "path": str(loc.path) if loc.path else None, "missing": loc.missing}
