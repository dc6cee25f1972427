"""One rank of the 2-rank tests, started by `mlx.launch --backend ring -n 2 -- python tests/distributed_rank.py ...`.

Loads the pair with the target sharded by mlx-lm (`sharded_load`), computes the
reference with mlx-lm's own `stream_generate` on that same sharded model, then
runs the engine (real draft and an oracle draft for partial accepts, at each
block size, the adaptive size, and one seeded sampling turn) and writes one
JSON file per rank (`rank{N}.json` in `--dir`), with the captured features and
logits compared to one process's whole target. A file, not a line on stdout:
mlx.launch passes each rank's output on in the chunks it reads, so two ranks'
long lines can interleave.
`--fault` plants a failure on rank 1: `disagree` (its draft proposes other
tokens, so it accepts another count), `kill` (SIGKILL itself mid-turn), `hang`
(SIGSTOP itself mid-turn). An Error event: rank 0 prints one line, every rank exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import oracle_proposer, reference_tokens  # noqa: E402


def main() -> int:
    from dflash_tui.errors import UserError

    try:
        return run()
    except UserError as exc:  # the launcher's SIGTERM after another rank died, a failed load
        if os.environ.get("MLX_RANK", "0") == "0":
            print(f"dflash-tui: {exc}", file=sys.stderr, flush=True)
        return 1


def run() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--kind", default="tensor")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--blocks", default="4,16")
    p.add_argument("--fault", choices=("none", "disagree", "kill", "hang"), default="none")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--dir", required=True, help="this rank's pid and results go here (the test ends what is left)")
    p.add_argument("--reference-rounds", type=int, default=0,
                   help="only this many rounds of mlx-lm's generation then one sharded forward, and stop")
    args = p.parse_args()
    rank_file = Path(args.dir, f"rank{os.environ.get('MLX_RANK', '0')}")
    rank_file.with_suffix(".pid").write_text(str(os.getpid()))

    from dflash_tui.engine.conversation import Conversation, GenerationSettings
    from dflash_tui.engine.distributed import Ranks, init_group
    from dflash_tui.engine.events import Block, Done, Error
    from dflash_tui.engine.loading import load_pair
    from dflash_tui.engine.speculative import draft_logits

    ranks = Ranks(init_group(), kind=args.kind, timeout_s=args.timeout)
    ranks.start_watchdog()
    ranks.stop_on_sigterm()
    ranks.beat(grace=60)
    pair = load_pair(args.target, args.draft, ranks=ranks)
    conv = Conversation(pair)
    conv.ranks = ranks
    prompt = conv.prompt_tokens([{"role": "user", "content": "hello there"}])
    if args.reference_rounds:
        write_result(rank_file, {"rank": ranks.rank, "mixed": mixed_rounds(pair, ranks, prompt, args.reference_rounds)})
        return 0
    reference = reference_tokens(pair, prompt, args.max_tokens)  # mlx-lm's sharded greedy generation
    features = compare_features(pair.target, args.target, prompt)

    def turn(propose, settings) -> dict:
        conv.propose = propose
        conv.state.reset()
        blocks = []
        for event in conv.generate_tokens(prompt, settings):
            if isinstance(event, Error):
                ranks.failed = True
                if ranks.is_leader:
                    print(f"dflash-tui: {event.message}", file=sys.stderr, flush=True)
                os._exit(1)
            if isinstance(event, Block) and event.index > 0:  # a cycle (the last may draft nothing)
                blocks.append([len(event.drafted), event.accepted])
            if isinstance(event, Done):
                return {"tokens": event.tokens, "blocks": blocks, "sync_ms": event.stats["sync_ms"],
                        "checks": event.stats["agreement_checks"], "ranks": event.stats["ranks"]}
        raise AssertionError("no Done event")

    def faulty(propose):
        calls = [0]

        def wrapped(state, token, b):
            calls[0] += 1
            if ranks.rank == 1 and calls[0] == 3:
                if args.fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.fault == "hang":
                    os.kill(os.getpid(), signal.SIGSTOP)
            return propose(state, token, b)

        return wrapped

    out: dict = {"rank": ranks.rank, "reference": reference, "features": features, "runs": {}}
    sequence = prompt + reference
    for b in [int(x) for x in args.blocks.split(",")]:
        greedy = GenerationSettings(max_tokens=args.max_tokens, block_size=b)
        if b == 4 or args.fault != "none":
            out["runs"][f"draft{b}"] = turn(faulty(draft_logits), greedy)
        seed = b + (1 if args.fault == "disagree" and ranks.rank == 1 else 0)
        out["runs"][f"oracle{b}"] = turn(oracle_proposer(sequence, error_rate=0.3, seed=seed), greedy)
    if args.fault == "none":  # the adaptive size: its costs are timed per rank, the choice must be rank 0's
        auto = GenerationSettings(max_tokens=args.max_tokens, block_size="auto")
        out["runs"]["auto"] = turn(oracle_proposer(sequence, error_rate=0.3, seed=5), auto)
    sampled = GenerationSettings(max_tokens=args.max_tokens, temperature=1.0, seed=7)
    out["runs"]["sampled"] = turn(oracle_proposer(sequence, error_rate=0.3, seed=1), sampled)
    write_result(rank_file, out)
    return 0


def write_result(rank_file: Path, result: dict) -> None:
    """rank{N}.json, whole or not at all (the test reads it once the launcher has ended)."""
    part = rank_file.with_suffix(".part")
    part.write_text(json.dumps(result))
    part.replace(rank_file.with_suffix(".json"))


def mixed_rounds(pair, ranks, prompt: list[int], rounds: int) -> int:
    """Rounds in which a sharded forward right after mlx-lm's generation gave the ranks different
    features: the step `stream_generate` leaves in flight must be finished first, or its all-reduces
    pair up with the forward's."""
    import mlx.core as mx

    target, mixed = pair.target, 0
    for _ in range(rounds):
        reference_tokens(pair, prompt, 4)
        _, feats = target.forward(mx.array([prompt]), target.make_cache())
        mine = feats.sum()
        both = mx.distributed.all_sum(mine, group=ranks.group, stream=mx.cpu)
        mixed += int(abs(both.item() - 2 * mine.item()) > 1e-3 * abs(mine.item()))
    return mixed


def compare_features(sharded, path: str, prompt: list[int]) -> dict:
    """The sharded target's captured features and logits against one process's whole target (loaded
    here too, unsharded): their largest differences, and a digest to compare across the ranks."""
    import mlx.core as mx

    from dflash_tui.engine.loading import load_target

    whole = load_target(path)
    whole.set_capture(sharded.capture_ids)
    (logits_s, feats_s), (logits_w, feats_w) = (t.forward(mx.array([prompt]), t.make_cache()) for t in (sharded, whole))
    mx.eval(logits_s, feats_s, logits_w, feats_w)
    return {"feature_diff": mx.abs(feats_s - feats_w).max().item(), "logit_diff": mx.abs(logits_s - logits_w).max().item(),
            "feature_scale": mx.abs(feats_w).max().item(), "digest": [feats_s.sum().item(), logits_s.sum().item()],
            "shape": list(feats_s.shape)}


if __name__ == "__main__":
    sys.exit(main())
