// Kernels of an RMSNorm program (both families: cake_rmsnorm_det_train with CAKE_GATED 0,
// cake_gated_rmsnorm_det_train with CAKE_GATED 1). The math, the layout and the determinism
// argument are in cake/rmsnorm_common.cuh; this file fixes the element type and the route.
//
// Knobs: CAKE_DTYPE 0 bf16, 1 fp16, 2 fp32 (x, gate, dy, y, dx); CAKE_VECTOR 1 for 16-byte
// loads (D a multiple of 16 / sizeof(T), 16-byte aligned tensors), 0 for element loads (any D).
#include <cstdint>

#include "cake/rmsnorm_common.cuh"

// cake:params
#define CAKE_DTYPE 0
#define CAKE_VECTOR 1
#define CAKE_GATED 0
// cake:end-params

namespace {

#if CAKE_DTYPE == 0
using Elem = __nv_bfloat16;
#elif CAKE_DTYPE == 1
using Elem = __half;
#elif CAKE_DTYPE == 2
using Elem = float;
#else
#error "CAKE_DTYPE must be 0 (bf16), 1 (fp16) or 2 (fp32)"
#endif

constexpr int kVec = CAKE_VECTOR ? 16 / static_cast<int>(sizeof(Elem)) : 1;
constexpr bool kGated = CAKE_GATED != 0;

}  // namespace

template <int kEpt>
__global__ void __launch_bounds__(cake::rmsnorm::kMaxCtaThreads)
kernel_cake_library_forward(const __grid_constant__ cake::rmsnorm::ForwardParams p) {
  cake::rmsnorm::forward<Elem, kVec, kEpt, kGated>(p);
}

template <int kEpt>
__global__ void __launch_bounds__(cake::rmsnorm::kMaxCtaThreads)
kernel_cake_library_backward(const __grid_constant__ cake::rmsnorm::BackwardParams p) {
  cake::rmsnorm::backward<Elem, kVec, kEpt, kGated>(p);
}

__global__ void __launch_bounds__(cake::rmsnorm::kColLanes * cake::rmsnorm::kColSegments)
kernel_cake_library_dweight(const __grid_constant__ cake::rmsnorm::DweightParams p) {
  cake::rmsnorm::reduce_dweight(p);
}

cudaError_t cake_library_launch_forward(const cake::rmsnorm::ForwardParams& p, cudaStream_t stream) {
  using cake::rmsnorm::kNarrowEpt;
  using cake::rmsnorm::kWideEpt;
  return cake::rmsnorm::launch_forward(kernel_cake_library_forward<kNarrowEpt>,
                                       kernel_cake_library_forward<kWideEpt>, p, stream);
}

cudaError_t cake_library_launch_backward(const cake::rmsnorm::BackwardParams& p, int64_t ctas,
                                         cudaStream_t stream) {
  using cake::rmsnorm::kNarrowEpt;
  using cake::rmsnorm::kWideEpt;
  return cake::rmsnorm::launch_backward(kernel_cake_library_backward<kNarrowEpt>,
                                        kernel_cake_library_backward<kWideEpt>, p, ctas, stream);
}

cudaError_t cake_library_launch_dweight(const cake::rmsnorm::DweightParams& p, cudaStream_t stream) {
  return cake::rmsnorm::launch_dweight(kernel_cake_library_dweight, p, stream);
}
