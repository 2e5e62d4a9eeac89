// C entries of one RMSNorm program (both families; cake/program.h: the ABI;
// cake/rmsnorm/entries.h: the checks and launches).
// cake:params
#define CAKE_DTYPE 0
#define CAKE_VECTOR 1
#define CAKE_GATED 0
#define CAKE_FORWARD_STAGES 3
#define CAKE_BACKWARD_STAGES 2
#define CAKE_FORWARD_MIN_ELEMS_PER_THREAD 16
#define CAKE_BACKWARD_MIN_ELEMS_PER_THREAD 16
#define CAKE_FORWARD_MAX_ROW_THREADS 512
#define CAKE_BACKWARD_MAX_ROW_THREADS 512
#define CAKE_FORWARD_COMMON_WIDTHS 1
#define CAKE_BACKWARD_COMMON_WIDTHS 0
#define CAKE_COLS_MIN 1
#define CAKE_COLS_MAX 16384
#define CAKE_FORWARD_CTA_THREADS 256
#define CAKE_BACKWARD_CTA_THREADS 256
#define CAKE_L2_PREFETCH 0
#define CAKE_FORWARD_WEIGHTS 0
#define CAKE_BACKWARD_WEIGHTS 2
#define CAKE_FORWARD_CTA_ROWS 0
#define CAKE_BACKWARD_BANDS 1024
#define CAKE_BACKWARD_OVERLAP_STAGING 0
#define CAKE_BACKWARD_INTERLEAVE 0
#define CAKE_BACKWARD_GUIDED 0
#define CAKE_FORWARD_MIN_BLOCKS 3
#define CAKE_BACKWARD_MIN_BLOCKS 2
// cake:end-params
// cake:entries
// cake:end-entries
#define CAKE_LIBRARY_NAME "cake_library"
#include "cake/image.h"
#include "cake/rmsnorm/entries.h"

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_forward(CAKE_ENTRY_PARAMS) {
  using namespace cake::rmsnorm::program;
  return cake::call_entry<ForwardArgs>(forward, "forward", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_backward(CAKE_ENTRY_PARAMS) {
  using namespace cake::rmsnorm::program;
  return cake::call_entry<BackwardArgs>(backward, "backward", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_workspace_bytes(CAKE_ENTRY_PARAMS) {
  using namespace cake::rmsnorm::program;
  return cake::call_entry<WorkspaceArgs>(query_workspace_bytes, "workspace_bytes", CAKE_ENTRY_ARGS);
}
