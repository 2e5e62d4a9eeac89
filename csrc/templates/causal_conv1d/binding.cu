// C entries of one causal conv1d program (cake/program.h: the ABI; cake/causal_conv1d/entries.h:
// the checks and launches).
// cake:params
#define CAKE_DTYPE_BF16 1
#define CAKE_HAS_BIAS 1
#define CAKE_SILU 1
#define CAKE_VEC 4
#define CAKE_CHANNEL_THREADS 32
#define CAKE_ROW_GROUPS 8
#define CAKE_FORWARD_ROWS 32
#define CAKE_FORWARD_STAGES 4
#define CAKE_FORWARD_CHUNKS 16
#define CAKE_FORWARD_MIN_BLOCKS 4
#define CAKE_TOKEN_THREADS 8
#define CAKE_TOKENS_PER_THREAD 8
#define CAKE_ITERATIONS 8
#define CAKE_BACKWARD_MIN_BLOCKS 2
#define CAKE_BACKWARD_SCALAR_MIN_BLOCKS 1
// cake:end-params
// cake:entries
// cake:end-entries
#define CAKE_LIBRARY_NAME "cake_library"
#include "cake/causal_conv1d/entries.h"
#include "cake/image.h"

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_forward(CAKE_ENTRY_PARAMS) {
  using namespace cake::causal_conv1d;
  return cake::call_entry<ForwardArgs>(forward, "forward", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_backward(CAKE_ENTRY_PARAMS) {
  using namespace cake::causal_conv1d;
  return cake::call_entry<BackwardArgs>(backward, "backward", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_workspace_bytes(CAKE_ENTRY_PARAMS) {
  using namespace cake::causal_conv1d;
  return cake::call_entry<WorkspaceArgs>(query_workspace_bytes, "workspace_bytes", CAKE_ENTRY_ARGS);
}
