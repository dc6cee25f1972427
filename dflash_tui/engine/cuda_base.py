"""What the CUDA kernels share: the device helpers every source includes, the kernel cache,
the backend check."""

from __future__ import annotations

import struct
import weakref
from typing import Any, Optional, Sequence

import mlx.core as mx

_HEADER = """
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float dflash_f(float x) { return x; }
__device__ __forceinline__ float dflash_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float dflash_f(__half x) { return __half2float(x); }

// PER contiguous elements of a row (lane's share: lane * PER ...), in one 8- or 16-byte load
// where the row is contiguous and the share is 4 or 8 half floats, else one element at a time.
template <int PER, typename T>
__device__ __forceinline__ void dflash_load_share(const T* row, int64_t col, int lane, float (&out)[PER]) {
  if constexpr (sizeof(T) == 2 && (PER == 4 || PER == 8)) {
    if (col == 1) {
      alignas(16) T h[PER];
      if constexpr (PER == 8) *reinterpret_cast<uint4*>(h) = *reinterpret_cast<const uint4*>(row + lane * PER);
      else *reinterpret_cast<uint2*>(h) = *reinterpret_cast<const uint2*>(row + lane * PER);
#pragma unroll
      for (int i = 0; i < PER; i++) out[i] = dflash_f(h[i]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < PER; i++) out[i] = dflash_f(row[(lane * PER + i) * col]);
}

__device__ __forceinline__ float dflash_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 8 half floats (one 16-byte load) as floats
template <typename T>
__device__ __forceinline__ void dflash_unpack8(const uint4& u, float (&f)[8]) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; i++) f[i] = dflash_f(h[i]);
}

// two adjacent half floats (one 4-byte load) as floats
template <typename T>
__device__ __forceinline__ float2 dflash_pair(const T* p) {
  const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
  const T* h = reinterpret_cast<const T*>(&u);
  return make_float2(dflash_f(h[0]), dflash_f(h[1]));
}

// d += a b on the tensor cores: a 16 x 16 (row major), b 16 x 8 (column major), d 16 x 8 in
// float32; fragments as the PTX ISA lays them out for mma.m16n8k16 (the pointer picks the type)
__device__ __forceinline__ void dflash_mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                const __nv_bfloat16*) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void dflash_mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                const __half*) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// two floats rounded to 16 bits, packed (the first in the low half)
__device__ __forceinline__ uint32_t dflash_pack2(float2 v, const __nv_bfloat16*) {
  __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t dflash_pack2(float2 v, const __half*) {
  __half2 h = __floats2half2_rn(v.x, v.y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// 8 strided half floats packed as one 16-byte value; not inlined, so that kernels which
// rarely take this path keep their registers for the contiguous one
template <typename T>
__device__ __noinline__ uint4 dflash_gather8(const T* p, int64_t col) {
  alignas(16) T h[8];
#pragma unroll
  for (int i = 0; i < 8; i++) h[i] = p[i * col];
  return *reinterpret_cast<const uint4*>(h);
}
"""

_kernels: dict[str, object] = {}


def _kernel(name: str, inputs: list[str], outputs: list[str], source: str, contiguous: bool = True):
    if name not in _kernels:
        _kernels[name] = mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs,
                                             source=source, header=_HEADER, ensure_row_contiguous=contiguous)
    return _kernels[name]


def on_cuda() -> bool:
    """True where MLX runs on an NVIDIA GPU (its CUDA backend)."""
    return mx.default_device() == mx.gpu and not mx.metal.is_available()


def _float_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def kept_plan(plans: dict, key: tuple, arrays: Sequence[Any]) -> Optional[tuple]:
    """The entry `keep_plan` stored under key, if those very arrays are still the ones it was for."""
    entry = plans.get(key)
    return entry if entry is not None and all(ref() is a for ref, a in zip(entry[0], arrays)) else None


def keep_plan(plans: dict, key: tuple, arrays: Sequence[Any], plan: Any) -> tuple:
    """Store (weak references to `arrays`, plan) under key, a key naming the arrays by id: the entry
    goes when any of them is freed, since another array may then take its id. None stands for an
    absent array (a quantized weight without biases)."""
    forget = lambda _: plans.pop(key, None)  # noqa: E731
    plans[key] = entry = (tuple((lambda: None) if a is None else weakref.ref(a, forget) for a in arrays), plan)
    return entry

