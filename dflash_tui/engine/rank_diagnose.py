"""What `doctor --distributed` measures across the ranks mlx.launch started: whether mlx-lm can
shard the target, what one agreement check costs, and what the sharded target's own network
rounds are likely to cost per forward. Loads no model: the collectives run on small arrays.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import mlx.core as mx

from dflash_tui.engine.fit import Check

if TYPE_CHECKING:
    from dflash_tui.engine.distributed import Ranks
    from dflash_tui.engine.facts import TargetFacts

REPS = 20
ALL_REDUCES_PER_LAYER = 2  # mlx-lm's shard(): the attention (or linear-attention) output and the MLP's


def rounds_per_forward(kind: str, layers: int, ranks: int) -> int:
    """Network rounds in one sharded target forward, whatever its length (an estimate): tensor
    parallel all-reduces twice per layer; a pipeline hands the hidden state from stage to stage,
    all_gathers the last stage's, and all_sums the captured features."""
    return ALL_REDUCES_PER_LAYER * layers if kind == "tensor" else (ranks - 1) + 2


def rounds_text(kind: str) -> str:
    return "2 per layer" if kind == "tensor" else "a hand-off per stage, the last stage's all_gather, the features' all_sum"


@dataclass
class RankFacts:
    ranks: int
    parallel: str
    sync_ms: float  # one agreement check: an all_sum of 4 int32 (median of REPS); paid once per cycle
    hidden_all_reduce_ms: Optional[float] = None  # an all_sum of one token's hidden state (median of REPS)
    rounds_per_forward: Optional[int] = None  # network rounds of one target forward (an estimate)

    @property
    def forward_comm_ms(self) -> Optional[float]:
        """Estimated network rounds of one target forward (one token or a whole block alike)."""
        if self.hidden_all_reduce_ms is None or self.rounds_per_forward is None:
            return None
        return self.hidden_all_reduce_ms * self.rounds_per_forward


def _median_ms(ranks: "Ranks", arr: mx.array) -> float:
    times = []
    for _ in range(REPS + 2):
        tic = time.perf_counter()
        mx.eval(mx.distributed.all_sum(arr, group=ranks.group, stream=mx.cpu))
        times.append((time.perf_counter() - tic) * 1e3)
    return statistics.median(times[2:])  # the first rounds set up the connections


def rank_facts(ranks: "Ranks", target: "Optional[TargetFacts]") -> RankFacts:
    """The same collectives on every rank; every rank gets its own timings (rank 0 reports its own)."""
    from dflash_tui.engine.distributed import rank_lost

    try:
        sync = _median_ms(ranks, mx.zeros((4,), mx.int32))
        facts = RankFacts(ranks.size, ranks.kind, sync)
        if target is not None:
            dtype = {"BF16": mx.bfloat16, "F16": mx.float16, "F32": mx.float32}.get(target.activation_dtype, mx.float16)
            facts.hidden_all_reduce_ms = _median_ms(ranks, mx.zeros((target.hidden_size,), dtype))
            facts.rounds_per_forward = rounds_per_forward(ranks.kind, target.num_layers, ranks.size)
    except RuntimeError as exc:  # a rank died: one line
        raise rank_lost(exc) from None
    return facts


def ranked_memory_check(check: Check, total: int, budget: Optional[int], ranks: int, kind: str) -> Check:
    """The memory check under `ranks` ranks. Its figure is the whole pair's, as one machine would
    hold it; mlx-lm's sharding gives each rank a share of the target (about 1/N of its layers and
    KV cache; what stays whole, the embedding say, depends on the model) and every rank a whole
    draft. What fits one machine fits each rank; what does not is not failed on that figure."""
    from dflash_tui.engine.facts import human_bytes

    share = f"under {ranks} ranks ({kind} parallel) each holds a share of the target and a whole draft"
    if check.ok is not False:
        return Check(check.name, check.ok, f"{check.detail}; {share}")
    return Check(check.name, None, f"{human_bytes(total)} for the whole pair, more than this machine's "
                                   f"{human_bytes(budget or 0)}; {share}: not checked per rank")


def shard_check(folder, kind: str) -> Check:
    """Does the installed mlx-lm's model class for this target have the sharding `kind` needs?"""
    from mlx_lm.utils import _get_classes  # the lookup mlx_lm.load itself uses

    from dflash_tui.engine.facts import read_config

    cfg = read_config(folder)
    try:
        model_class, _ = _get_classes(config=cfg)
    except Exception as exc:
        return Check(f"{kind} parallel", False, f"mlx-lm cannot build it: {exc}")
    name = cfg.get("model_type")
    if kind == "pipeline":  # sharded_load pipelines `Model.model`: some class of the module has pipeline()
        module = sys.modules[model_class.__module__]
        if any(isinstance(c, type) and "pipeline" in vars(c) for c in vars(module).values()):
            return Check("pipeline parallel", True, f"mlx-lm's {name} model has pipeline()")
        return Check("pipeline parallel", False, f"mlx-lm's {name} model has no pipeline(): use tensor parallel")
    if hasattr(model_class, "shard"):
        return Check("tensor parallel", True, f"mlx-lm's {name} model has shard()")
    return Check("tensor parallel", False, f"mlx-lm's {name} model has no shard(): it cannot be split over ranks")
