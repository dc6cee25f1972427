"""A verify whose every row is computed as the decode step at its position (batch invariance).

A decode step runs one row through the target; a verify runs up to 16. On MLX CUDA the two
take different kernels (gemv against gemm, qmv against qmm, the single-query attention
kernel against a multi-query one), which round differently, so a near-tie can flip and the
output would differ from the target alone. During a verify's forward (`verifying()`), the
target's linear layers and attention compute each row in the one-row kernel's order:

- `nn.Linear` without a bias: `cuda_rowwise.rowwise_matmul` (gemv's order), the linears that
  read one input (q, k, v; gate, up) in one launch; with a bias (`addmm`, which MLX sends to
  cuBLAS): one MLX call per row, as the step makes it;
- `nn.QuantizedLinear` (affine): `cuda_rowwise_quant` (qmv's order), the ones that read one
  input in one launch as above; where that kernel does not replay the one-row call, MLX's own
  call on at most 7 rows at a time (MLX CUDA computes up to 7 rows with the one-row kernel, one
  grid row each);
- attention: `cuda_step_attention.step_attention`; the tied head (`Embedding.as_linear`) as
  the first bullets;
- a causal `nn.Conv1d` (the Gated DeltaNet's, fed its K-1 cached rows and the new ones): each
  output from its own K-row window, one MLX call each, the call a decode step makes; the
  recurrence itself runs mlx-lm's per-step ops (gdn_tape.py) instead of the engine's kernel.

Norms, rotary embeddings, activations and the embedding lookup are per row already. Only
instances of exactly these classes change (a subclass may compute differently), only where
MLX runs on CUDA and the kernels are on (`DFLASH_TUI_KERNELS`); prefill chunks, decode steps
and everything outside the engine's verify run mlx-lm's own code.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.engine.cuda_kernels import kernels_wanted, on_cuda
from dflash_tui.engine.cuda_rowwise import MAX_ROWS, rowwise_matmul, rowwise_matmuls
from dflash_tui.engine.cuda_rowwise_quant import rowwise_quantized_matmul, rowwise_quantized_matmuls

QMV_ROWS = 7  # MLX CUDA's quantized matmul uses its one-row kernel (qmv) below 8 rows
_state = threading.local()


def wanted() -> bool:
    """Where a verify's rows differ from decode steps unless computed so: MLX CUDA."""
    return on_cuda() and kernels_wanted()


def in_verify() -> bool:
    """Whether this thread is building a verify's forward (not a prefill chunk or a step)."""
    return getattr(_state, "verify", False)


def active() -> bool:
    """Whether this thread is building a verify whose rows are computed as decode steps."""
    return getattr(_state, "steps", False)


@contextmanager
def verifying(verify: bool = True, as_steps: bool = True) -> Iterator[None]:
    """Within (this thread only): a verify's forward, if `verify`; with `as_steps` the swapped
    modules compute its rows as decode steps."""
    before = in_verify(), active()
    _state.verify, _state.steps = verify, verify and as_steps
    _state.pending = {}
    try:
        yield
    finally:
        _state.verify, _state.steps = before
        _state.pending = {}


def _rows(x: mx.array) -> int:
    return x.size // x.shape[-1] if x.ndim > 1 else 1


def _by_chunks(x: mx.array, size: int, fn) -> mx.array:
    """fn over at most `size` rows of x [1, L, K] at a time, concatenated."""
    n = x.shape[-2]
    if n <= size:
        return fn(x)  # one piece: no concatenation (a copy) in the graph
    return mx.concatenate([fn(x[..., i : i + size, :]) for i in range(0, n, size)], axis=-2)


def matmul_rows(x: mx.array, w: mx.array) -> mx.array:
    """`x @ w.T` with every row as MLX's one-row product computes it."""
    return _by_chunks(x, MAX_ROWS, lambda part: rowwise_matmul(part, w))


def matmuls_rows(x: mx.array, ws: list[mx.array]) -> list[mx.array]:
    """`[x @ w.T for w in ws]` as `matmul_rows` computes each, in one launch where x has at most 16 rows."""
    if x.shape[-2] > MAX_ROWS:
        return [matmul_rows(x, w) for w in ws]
    return rowwise_matmuls(x, ws)


def addmm_rows(bias: mx.array, x: mx.array, w: mx.array) -> mx.array:
    """`addmm(bias, x, w.T)` one row at a time (MLX's one-row addmm is cuBLAS's: its order is closed)."""
    return _by_chunks(x, 1, lambda row: mx.addmm(bias, row, w.T))


def quantized_rows(x: mx.array, w: mx.array, scales: mx.array, biases, group_size: int, bits: int,
                   mode: str = "affine") -> mx.array:
    """`quantized_matmul(x, w, ..., transpose=True)` with every row as the one-row call computes it."""

    def mlx_call(part: mx.array) -> mx.array:
        return mx.quantized_matmul(part, w, scales, biases, transpose=True, group_size=group_size, bits=bits,
                                   mode=mode)

    def chunk(part: mx.array) -> mx.array:
        out = None
        if mode == "affine":
            out = rowwise_quantized_matmul(part, w, scales, biases, group_size=group_size, bits=bits)
        return out if out is not None else _by_chunks(part, QMV_ROWS, mlx_call)

    return _by_chunks(x, MAX_ROWS, chunk)


def quantized_several_rows(x: mx.array, parts: list[tuple], group_size: int, bits: int) -> list[mx.array]:
    """`[quantized_rows(x, *part, group_size, bits) for part in parts]` (affine), in one launch where
    x has at most 16 rows and the kernel replays every part's one-row call."""
    if x.shape[-2] <= MAX_ROWS:
        outs = rowwise_quantized_matmuls(x, parts, group_size=group_size, bits=bits)
        if outs is not None:
            return outs
    return [quantized_rows(x, *part, group_size, bits) for part in parts]


def _grouped(module: nn.Module, x: mx.array, alone, together) -> mx.array:
    """The module's product for x: taken from the first linear of its group where that one computed
    it from this very input, else `together(group)` for a first with siblings, else `alone()`."""
    pending = _state.pending  # set by verifying(), which active() implies
    done = pending.pop(id(module), None)
    if done is not None and done[0] is x:  # computed with the first of its group, from this input
        return done[1]
    siblings = module.__dict__.get("_rows_siblings")
    if siblings is None:
        return alone()
    outs = together((module, *siblings))
    for sibling, out in zip(siblings, outs[1:]):
        pending[id(sibling)] = (x, out)
    return outs[0]


# Linears that read the same input, in the order a layer calls them (mlx-lm's attention and MLP).
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class StepRowsLinear(nn.Linear):
    def __call__(self, x: mx.array) -> mx.array:
        if not active() or _rows(x) < 2:
            return nn.Linear.__call__(self, x)
        if "bias" in self:
            return addmm_rows(self["bias"], x, self["weight"])
        return _grouped(self, x, lambda: matmul_rows(x, self["weight"]),
                        lambda group: matmuls_rows(x, [m["weight"] for m in group]))


class StepRowsQuantizedLinear(nn.QuantizedLinear):
    def __call__(self, x: mx.array) -> mx.array:
        if not active() or _rows(x) < 2:
            return nn.QuantizedLinear.__call__(self, x)
        out = _grouped(self, x, lambda: quantized_rows(x, self["weight"], self["scales"], self.get("biases"),
                                                       self.group_size, self.bits, getattr(self, "mode", "affine")),
                       lambda group: quantized_several_rows(x, [(m["weight"], m["scales"], m.get("biases")) for m in group],
                                                            self.group_size, self.bits))
        return out + self["bias"] if "bias" in self else out


class StepRowsConv1d(nn.Conv1d):
    def __call__(self, x: mx.array) -> mx.array:
        k = self["weight"].shape[1]
        if not active() or (self.stride, self.padding, self.dilation) != (1, 0, 1) or x.shape[1] <= k:
            return nn.Conv1d.__call__(self, x)
        return mx.concatenate([nn.Conv1d.__call__(self, x[:, t : t + k]) for t in range(x.shape[1] - k + 1)], axis=1)


_SWAPS = {nn.Linear: StepRowsLinear, nn.QuantizedLinear: StepRowsQuantizedLinear, nn.Conv1d: StepRowsConv1d}


def install(model: nn.Module) -> int:
    """Swap the class of every plain Linear / QuantizedLinear / Conv1d instance in `model` for its
    step-rows subclass (which behaves as the original outside `verifying()`); returns how many
    are swapped (those of an earlier call included)."""
    n = 0
    for _, module in model.named_modules():
        swap = _SWAPS.get(type(module))
        if swap is not None:
            module.__class__ = swap
        n += swap is not None or type(module) in _SWAPS.values()
    for _, module in model.named_modules():
        _link_siblings(module)
    return n


def _link_siblings(module: nn.Module) -> None:
    """Give the first linear of each group that reads one input (q, k, v; gate, up) the others:
    a verify then computes the group in one launch, each product's rows as they would be alone."""
    for names in SIBLINGS:
        group = [module.get(name) for name in names]
        plain = (all(type(m) is StepRowsLinear and "bias" not in m for m in group)
                 and len({(m["weight"].shape[1], m["weight"].dtype) for m in group}) == 1)
        # quantized: one width, group size and input size, affine (a bias is added by each after)
        quantized = (all(type(m) is StepRowsQuantizedLinear and getattr(m, "mode", "affine") == "affine"
                         for m in group)
                     and len({(m.bits, m.group_size, m["weight"].shape[1], m["scales"].dtype) for m in group}) == 1)
        if plain or quantized:
            # in the instance's __dict__, past nn.Module's __setattr__: not a child module or parameter
            object.__setattr__(group[0], "_rows_siblings", tuple(group[1:]))


def as_linear(embedding: nn.Module, x: mx.array) -> mx.array:
    """A tied head (`embedding.as_linear(x)`) with every row as a decode step computes it."""
    if not active() or _rows(x) < 2:
        return embedding.as_linear(x)
    if type(embedding) is nn.Embedding:
        return matmul_rows(x, embedding["weight"])
    if type(embedding) is nn.QuantizedEmbedding:
        return quantized_rows(x, embedding["weight"], embedding["scales"], embedding.get("biases"),
                              embedding.group_size, embedding.bits, getattr(embedding, "mode", "affine"))
    return embedding.as_linear(x)
