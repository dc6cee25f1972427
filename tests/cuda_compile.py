"""The engine's CUDA kernel sources compiled with nvcc as MLX's `mx.fast.cuda_kernel` wraps them:
a plain __global__ function with the generated signature (each input, then its `_shape` /
`_strides` where the body names them; the outputs), the template values as local constants,
the body; every kernel of a test in one translation unit (one nvcc run)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

_STUB = """
#include <cstdint>
#include <cooperative_groups.h>
#include <cuda/std/array>
namespace mlx { namespace core { namespace cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}}}
"""


def kernel(name: str, source: str, inputs: list[tuple[str, str]], outputs: list[tuple[str, str]],
           consts: list[str]) -> str:
    """One kernel body wrapped as MLX's cuda_kernel wraps it."""
    args = []
    for arg, ctype in inputs:
        args.append(f"const {ctype}* {arg}")
        for suffix, kind in (("_shape", "Shape"), ("_strides", "Strides")):
            if re.search(rf"\b{arg}{suffix}\b", source):
                args.append(f"const __grid_constant__ {kind} {arg}{suffix}")
    args += [f"{ctype}* {arg}" for arg, ctype in outputs]
    body = "".join(f"  {c};\n" for c in consts) + source
    return f"__global__ void {name}({', '.join(args)}) {{\n{body}\n}}\n"


def translation_unit(header: str, kernels: list[str]) -> str:
    """The kernels after MLX's own declarations and the engine's header, in MLX's namespace."""
    return _STUB + header + "namespace mlx { namespace core { namespace cu {\n" + "".join(kernels) + "}}}\n"


def nvcc(tmp_path: Path, source: str, *flags: str) -> subprocess.CompletedProcess:
    """Compile `source` for the H200 (sm_90); the result's returncode and stderr say how it went."""
    path = tmp_path / "k.cu"
    path.write_text(source)
    return subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", *flags, "-c", str(path), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=300)
