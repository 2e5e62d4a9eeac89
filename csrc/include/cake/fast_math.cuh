// Device math shared by the kernel families: element conversions, SiLU's sigmoid in as few
// instructions as the hardware allows, and 16-bit packing two values per instruction.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cake {

// One element to fp32 and back (round to nearest even).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// 2^x and 1/x as one MUFU instruction each. The .ftz forms are used because the plain PTX forms
// expand to extra instructions that rescale denormal inputs and results. Here only the sigmoid
// of z < -87.3 differs: its fp32 value is a denormal, which flushes to 0 (so SiLU gives -0
// instead of a value below 1e-36), as with the __fdividef form used before. The same
// instructions run on every call, so results are reproducible bit for bit.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / (1 + e^-z): a multiply, two MUFU operations and an add (0 for z < -87.3, see above).
__device__ __forceinline__ float sigmoid(float z) {
  constexpr float kMinusLog2e = -1.4426950408889634f;
  return rcp_ftz(1.0f + exp2_ftz(z * kMinusLog2e));
}

// Two floats rounded to nearest-even into one 32-bit word of two 16-bit values (lo = a): one
// conversion instruction for the pair.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  uint32_t word;
  memcpy(&word, &v, sizeof(word));
  return word;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  uint32_t word;
  memcpy(&word, &v, sizeof(word));
  return word;
}

}  // namespace cake
