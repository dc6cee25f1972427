"""Cycle price against the sharded target's own decode step, on ranks started by mlx.launch.

    mlx.launch --backend ring -n 2 -- python -m dflash_tui.bench.distributed_cost --model M --draft D

Every rank loads the target with mlx-lm's `sharded_load` (tensor parallel, or
pipeline parallel with --pipeline) and times, on the same prompt: the target's
one-token step (what mlx-lm's own sharded decoding pays per token), a DFlash
cycle at each block size (draft forward + one verify forward + the agreement
all_sum), the agreement all_sum alone (one network round), and one token's
hidden state all-reduced: times the rounds of one forward
(`rank_diagnose.rounds_per_forward`), an estimate of the network time inside
every sharded forward (it runs inside the lazily evaluated graph and cannot be
timed apart from its compute). Rank 0 prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import mlx.core as mx

from dflash_tui.bench.arguments import require_at_least
from dflash_tui.engine.rank_diagnose import rounds_per_forward


@dataclass
class DistributedCost:
    ranks: int
    parallel: str
    target_step_ms: float  # one token through the sharded target
    sync_ms: float  # one agreement check: an all_sum of 4 int32 (what a cycle adds to the verify)
    hidden_all_reduce_ms: float  # one token's hidden state all-reduced across the ranks
    forward_comm_ms_estimate: float  # hidden_all_reduce_ms x the rounds of one forward (rank_diagnose.rounds_per_forward)
    cycle_ms: dict[int, float]  # block size -> one DFlash cycle (draft + verify + agreement)
    cycle_over_step: dict[int, float]  # block size -> cycle price in target steps


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append((time.perf_counter() - tic) * 1e3)
    return statistics.median(times)


def measure(model: str, draft: str, blocks: tuple[int, ...], repeats: int, kind: str = "tensor") -> DistributedCost:
    from dflash_tui.engine.conversation import Conversation
    from dflash_tui.engine.distributed import Ranks, init_group
    from dflash_tui.engine.loading import load_pair
    from dflash_tui.engine.speculative import dflash_cycles

    ranks = Ranks(init_group(), kind=kind)
    pair = load_pair(model, draft, ranks=ranks)
    conv = Conversation(pair)
    prompt = conv.prompt_tokens([{"role": "user", "content": "Explain speculative decoding in one paragraph."}])
    state = conv.state
    target = pair.target
    target_step = _target_step(target, prompt, repeats)
    sync = _median_ms(lambda: ranks.all_sum([1, 2, 3, 0]), repeats)
    hidden = mx.zeros((target.hidden_size,), mx.float16)  # small: the round trip, not the bandwidth, is the cost
    reduce = _median_ms(lambda: mx.eval(mx.distributed.all_sum(hidden, group=ranks.group, stream=mx.cpu)), repeats)
    cycles: dict[int, float] = {}
    for b in blocks:
        state.reset()
        logits, _ = state.prefill(prompt, 512, lambda: False)
        first = int(mx.argmax(logits).item())
        gen = ranks.checked(dflash_cycles(state, first, b, lambda: 10**6))
        next(gen)  # warm-up
        times = []
        for _ in range(repeats):
            tic = time.perf_counter()
            next(gen)
            times.append((time.perf_counter() - tic) * 1e3)
        gen.close()
        cycles[b] = statistics.median(times)
    rounds = rounds_per_forward(ranks.kind, target.num_layers, ranks.size)
    return DistributedCost(ranks=ranks.size, parallel=ranks.kind, target_step_ms=target_step, sync_ms=sync,
                           hidden_all_reduce_ms=reduce, forward_comm_ms_estimate=reduce * rounds,
                           cycle_ms=cycles, cycle_over_step={b: c / target_step for b, c in cycles.items()})


def _target_step(target, prompt: list[int], repeats: int) -> float:
    """mlx-lm's sharded model called on one token, as its own decoding does, on a cache that grows
    (a hybrid's recurrent state cannot be undone)."""
    cache = target.make_cache()
    mx.eval(target.model(mx.array([prompt]), cache=cache))
    return _median_ms(lambda: mx.eval(target.model(mx.array([[prompt[-1]]]), cache=cache)), repeats)


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--blocks", default="4,16")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--pipeline", action="store_true", help="pipeline parallel instead of tensor parallel")
    args = p.parse_args(argv)
    require_at_least(p, args, {"repeats": 1})
    try:
        blocks = tuple(int(b) for b in args.blocks.split(","))
    except ValueError:
        p.error("--blocks: block sizes separated by commas, such as 4,16")
    if any(b < 2 for b in blocks):
        p.error("--blocks: each block size must be at least 2")
    cost = measure(args.model, args.draft, blocks, args.repeats,
                   "pipeline" if args.pipeline else "tensor")
    if mx.distributed.init().rank() == 0:
        print(json.dumps(asdict(cost)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
