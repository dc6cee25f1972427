"""An engine kernel's CUDA source run on the CPU, for its indexing and order where no GPU is.

The kernel's text is compiled by the host's C++ compiler inside a small runtime: every thread of
a block is a fiber (ucontext), `__syncthreads` and the warp shuffles are rendezvous of the
block's or the warp's fibers, `__shared__` arrays are one copy per block (blocks run one after
another), and the 16-bit float operations round once from the exact result, as the hardware's
do. What a GPU computes is still the GPU tests' word; this catches a thread that reads the wrong
column, a tail that writes what it should not, or a reduction in the wrong order, on small shapes.

Kernels with tensor cores or fast-math intrinsics cannot run here. PTX helpers with a plain
meaning have host twins (`cp.async`: a copy at once, whose waits then have nothing to wait
for), and a kernel's dynamic shared memory is a buffer of the launch's size.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler (g++)")

_RUNTIME = r"""
#include <ucontext.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
using std::max;
using std::min;

#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __grid_constant__
#define __shared__ static
#define __align__(n) alignas(n)

struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }

// bfloat16: v rounded to nearest, ties to even, from a double (exact for every value used here)
static inline uint16_t dfe_bf16_bits(double v) {
  int e;
  const double m = std::frexp(v, &e);  // v = m 2^e, 0.5 <= |m| < 1: 8 significant bits kept
  const float f = static_cast<float>(std::ldexp(std::nearbyint(m * 256.0), e - 8));
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float v) : bits(dfe_bf16_bits(v)) {}
  __nv_bfloat16(double v) : bits(dfe_bf16_bits(v)) {}
};
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline double dfe_d(__nv_bfloat16 h) { return __bfloat162float(h); }
static inline __nv_bfloat162 dfe_pair(double a, double b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
static inline __nv_bfloat162 __float2bfloat162_rn(float v) { return dfe_pair(v, v); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return dfe_pair(a, b); }
static inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return dfe_pair(dfe_d(a.x) - dfe_d(b.x), dfe_d(a.y) - dfe_d(b.y));
}
static inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return dfe_pair(std::fma(dfe_d(a.x), dfe_d(b.x), dfe_d(c.x)), std::fma(dfe_d(a.y), dfe_d(b.y), dfe_d(c.y)));
}
static inline float __low2float(__nv_bfloat162 p) { return __bfloat162float(p.x); }
static inline float __high2float(__nv_bfloat162 p) { return __bfloat162float(p.y); }

// half floats: declared so that the sources compile; this runtime computes bf16 kernels only
struct __half { uint16_t bits; __half() = default; __half(float) { std::abort(); } };
struct __half2 { __half x, y; };
static inline float __half2float(__half) { std::abort(); }
static inline __half2 __float2half2_rn(float) { std::abort(); }
static inline __half2 __floats2half2_rn(float, float) { std::abort(); }
static inline __half2 __hsub2(__half2, __half2) { std::abort(); }
static inline __half2 __hfma2(__half2, __half2, __half2) { std::abort(); }
static inline float __low2float(__half2) { std::abort(); }
static inline float __high2float(__half2) { std::abort(); }

// threads as fibers
struct dim3 { unsigned x = 0, y = 0, z = 0; };
static dim3 threadIdx, blockIdx, blockDim, gridDim;
struct DfeFiber { ucontext_t ctx; std::vector<char> stack; unsigned tid; bool done; };
static ucontext_t dfe_main;
static DfeFiber* dfe_cur;
static void (*dfe_body)();
static void dfe_yield() { swapcontext(&dfe_cur->ctx, &dfe_main); }
static void dfe_entry() { dfe_body(); dfe_cur->done = true; swapcontext(&dfe_cur->ctx, &dfe_main); }
struct DfeRendezvous { int count = 0; long generation = 0; };
static DfeRendezvous dfe_block_meet, dfe_warp_meet[32];
static void dfe_meet(DfeRendezvous& r, int size) {
  const long g = r.generation;
  if (++r.count == size) { r.count = 0; r.generation++; return; }
  while (r.generation == g) dfe_yield();
}
static void __syncthreads() { dfe_meet(dfe_block_meet, static_cast<int>(blockDim.x)); }
static float dfe_lanes[1024];
static float __shfl_xor_sync(unsigned, float v, int offset) {
  const unsigned t = threadIdx.x, w = t >> 5;
  dfe_lanes[t] = v;
  dfe_meet(dfe_warp_meet[w], 32);
  const float got = dfe_lanes[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned>(offset))];
  dfe_meet(dfe_warp_meet[w], 32);
  return got;
}
static void dfe_launch(void (*body)(), dim3 grid, dim3 block) {
  static std::vector<DfeFiber> fibers(1024);
  dfe_body = body;
  gridDim = grid;
  blockDim = block;
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      blockIdx = {bx, by, 0};
      for (unsigned t = 0; t < block.x; t++) {
        DfeFiber& f = fibers[t];
        f.stack.resize(1 << 16);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, dfe_entry, 0);
        f.tid = t;
        f.done = false;
      }
      for (bool running = true; running;) {
        running = false;
        for (unsigned t = 0; t < block.x; t++) {
          DfeFiber& f = fibers[t];
          if (f.done) continue;
          running = true;
          threadIdx = {t, 0, 0};
          dfe_cur = &f;
          swapcontext(&dfe_main, &f.ctx);
        }
      }
    }
}
namespace mlx { namespace core { namespace cu {
using Shape = std::array<int32_t, 10>;
using Strides = std::array<int64_t, 10>;
}}}
"""

# the engine's shared device header has PTX (tensor cores); these of its helpers are plain C++
_HOST_HELPERS = ("dflash_f", "dflash_warp_sum")
# PTX helpers and their meaning on the host: a cp.async copy lands at once, so its waits are empty
_HOST_TWINS = {
    "dflash_cp_async16": "static inline void dflash_cp_async16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }\n",
    "dflash_cp_async_commit": "static inline void dflash_cp_async_commit() {}\n",
    "dflash_cp_async_wait_pending": "template <int N>\nstatic inline void dflash_cp_async_wait_pending() {}\n",
}


def _definitions(header: str, names) -> list[tuple[int, int, str]]:
    """(first line, line past the end, name) of each device function named in `names` (a
    `template <...>` line before one belongs to it), its end found by balancing braces."""
    lines = header.splitlines(keepends=True)
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        name = next((n for n in names if line.startswith("__device__") and f" {n}(" in line), None)
        if name is None:
            i += 1
            continue
        start = i - 1 if i and lines[i - 1].startswith("template <") else i
        depth, j = 0, i
        while True:
            depth += lines[j].count("{") - lines[j].count("}")
            j += 1
            if depth == 0 and "{" in "".join(lines[i:j]):
                break
        found.append((start, j, name))
        i = j
    return found


def host_helpers(header: str) -> str:
    """The functions of the engine's shared header that run on the host, as written there."""
    lines = header.splitlines(keepends=True)
    return "".join("".join(lines[a:b]) for a, b, _ in _definitions(header, _HOST_HELPERS))


def host_header(header: str) -> str:
    """A kernel's header for the host: the engine's shared header (where it begins with it) cut to
    its host helpers, the kernel's own PTX helpers swapped for their host twins."""
    from dflash_tui.engine.cuda_base import _HEADER

    if header.startswith(_HEADER):
        header = host_helpers(_HEADER) + header[len(_HEADER):]
    lines = header.splitlines(keepends=True)
    out, at = [], 0
    for a, b, name in _definitions(header, _HOST_TWINS):
        out += lines[at:a] + [_HOST_TWINS[name]]
        at = b
    return "".join(out + lines[at:])


def _static_shared(body: str, shared_bytes: int) -> str:
    """The kernel's dynamic shared memory as a buffer of the launch's size (one per block)."""
    return re.sub(r"extern __shared__ __align__\((\d+)\) float (\w+)\[\];",
                  lambda m: f"alignas({m.group(1)}) static float {m.group(2)}[{max(1, shared_bytes // 4)}];", body)


def run_kernel(tmp_path: Path, header: str, body: str, consts: list[str],
               inputs: list[tuple[str, np.ndarray, str]], outputs: list[tuple[str, tuple[int, ...], str]],
               grid: tuple[int, int], threads: int, shared_bytes: int = 0) -> list[np.ndarray]:
    """Run `body` (a kernel's source as MLX's cuda_kernel takes it, `header` the header it is
    compiled with, its dynamic shared memory `shared_bytes`) over `grid` blocks of `threads`
    threads. Inputs are (name, array, C
    type) and each input's `_shape` is passed; outputs are (name, shape, C type), returned as
    arrays of the inputs' dtype for 16-bit types (uint16 bits for bfloat16)."""
    params, decls, loads, args = [], [], [], []
    for i, (name, array, ctype) in enumerate(inputs):
        data = np.ascontiguousarray(array)
        (tmp_path / f"in{i}.bin").write_bytes(data.tobytes())
        shape = ", ".join(str(d) for d in data.shape)
        params += [f"const {ctype}* {name}", f"const mlx::core::cu::Shape {name}_shape"]
        decls.append(f"static std::vector<char> dfe_in{i} = dfe_read(\"{tmp_path}/in{i}.bin\", {data.nbytes});")
        decls.append(f"static const mlx::core::cu::Shape dfe_shape{i} = {{{shape}}};")
        args += [f"reinterpret_cast<const {ctype}*>(dfe_in{i}.data())", f"dfe_shape{i}"]
    for j, (name, shape, ctype) in enumerate(outputs):
        count = int(np.prod(shape))
        params.append(f"{ctype}* {name}")
        decls.append(f"static std::vector<{ctype}> dfe_out{j}({count});")
        args.append(f"dfe_out{j}.data()")
        loads.append(f"dfe_write(\"{tmp_path}/out{j}.bin\", dfe_out{j}.data(), {count} * sizeof({ctype}));")
    kernel = (f"static void dfe_kernel({', '.join(params)}) {{\n"
              + "".join(f"  {c};\n" for c in consts) + _static_shared(body, shared_bytes) + "\n}\n")
    main = (
        "static std::vector<char> dfe_read(const char* path, size_t n) {\n"
        "  std::vector<char> b(n); FILE* f = std::fopen(path, \"rb\");\n"
        "  if (!f || std::fread(b.data(), 1, n, f) != n) std::abort(); std::fclose(f); return b; }\n"
        "static void dfe_write(const char* path, const void* p, size_t n) {\n"
        "  FILE* f = std::fopen(path, \"wb\"); std::fwrite(p, 1, n, f); std::fclose(f); }\n"
        + "\n".join(decls) + "\n"
        f"static void dfe_run() {{ mlx::core::cu::dfe_kernel({', '.join(args)}); }}\n"
        f"int main() {{ dfe_launch(dfe_run, dim3{{{grid[0]}, {grid[1]}, 1}}, dim3{{{threads}, 1, 1}});\n"
        + "".join(f"  {line}\n" for line in loads) + "  return 0; }\n")
    source = (_RUNTIME + host_header(header) + "namespace mlx { namespace core { namespace cu {\n" + kernel + "}}}\n" + main)
    (tmp_path / "emulated.cpp").write_text(source)
    exe = tmp_path / "emulated"
    build = subprocess.run(["g++", "-std=c++17", "-O1", "-w", str(tmp_path / "emulated.cpp"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    results = []
    for j, (name, shape, ctype) in enumerate(outputs):
        dtype = np.uint16 if ctype in ("__nv_bfloat16", "__half") else np.float32
        results.append(np.frombuffer((tmp_path / f"out{j}.bin").read_bytes(), dtype=dtype).reshape(shape))
    return results


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float64 values that are bf16 values, as their 16-bit patterns."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
