"""Benchmark (not a test): what one MLX operation costs the host, by kind.

A cycle on a GPU is bound by the host where it launches more operations than the
device can be kept busy with (docs/gpu-cycle.md). For each kind of operation a
forward is made of, N independent ones on small inputs are built (`build_us`: the
Python call that adds one to the lazy graph) and then evaluated together
(`eval_us`: MLX launching them, plus the device's time, which is small here), each
per operation, median of the repeats. On MLX CUDA the custom kernels of this
project are timed beside MLX's own operations: a kernel's source text is joined
and hashed on every call, so a long source costs the host more.

    python -m dflash_tui.bench.host_cost
    python -m dflash_tui.bench.host_cost --ops 50 --repeat 2     # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import mlx.core as mx

from dflash_tui.engine.cuda_base import _HEADER, on_cuda
from dflash_tui.engine.cuda_rowwise import rowwise_matmuls

WIDTH = 256


def kinds() -> dict[str, Callable[[mx.array], mx.array]]:
    """Operation kinds, each a function of one [16, WIDTH] input."""
    w = mx.ones((WIDTH, WIDTH), mx.bfloat16)
    mx.eval(w)
    found: dict[str, Callable[[mx.array], mx.array]] = {
        "add": lambda a: a + 1,
        "reshape": lambda a: a.reshape(WIDTH, 16),
        "matmul, 1 row": lambda a: a[:1] @ w.T,
        "matmul, 16 rows": lambda a: a @ w.T,
        "rms_norm": lambda a: mx.fast.rms_norm(a, w[0], 1e-6),
    }
    if on_cuda():
        def custom(header: str) -> Callable[[mx.array], mx.array]:
            kernel = mx.fast.cuda_kernel(name=f"dflash_host_cost_{len(header)}", input_names=["a"], output_names=["b"],
                                         source="b[threadIdx.x] = a[threadIdx.x];", header=header)
            return lambda a: kernel(inputs=[a], grid=(WIDTH, 1, 1), threadgroup=(WIDTH, 1, 1),
                                    output_shapes=[a.shape], output_dtypes=[a.dtype])[0]
        found["custom kernel, short source"] = custom("")
        found["custom kernel, the engine's header"] = custom(_HEADER)
        found["custom kernel, 20 KB more source"] = custom(_HEADER + "// " + "x" * 20_000 + "\n")
        found["row-wise matmul (16 rows)"] = lambda a: rowwise_matmuls(a, [w])[0]
    return found


def measure(ops: int, repeat: int) -> list[dict[str, Any]]:
    x = mx.ones((16, WIDTH), mx.bfloat16)
    mx.eval(x)
    rows = []
    for name, op in kinds().items():
        builds, evals = [], []
        for i in range(repeat + 1):
            mx.synchronize()
            tic = time.perf_counter()
            outs = [op(x) for _ in range(ops)]
            built = time.perf_counter()
            mx.eval(outs)
            done = time.perf_counter()
            if i:  # the first warms up (kernel builds, the allocator)
                builds.append((built - tic) / ops * 1e6)
                evals.append((done - built) / ops * 1e6)
        rows.append({"op": name, "build_us": statistics.median(builds), "eval_us": statistics.median(evals)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=200, help="operations of each kind per measurement")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    if args.ops < 1 or args.repeat < 1:
        p.error("--ops and --repeat must be at least 1")
    print(json.dumps({"device": str(mx.default_device()), "mlx": mx.__version__,
                      "rows": measure(args.ops, args.repeat)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
