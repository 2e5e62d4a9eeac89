// C entries of the context-parallel causal conv1d program (cake/program.h: the ABI;
// cake/causal_conv1d/kcp_entries.h: the checks and launches).
// cake:params
#define CAKE_KCP_THREADS 256
// cake:end-params
// cake:entries
// cake:end-entries
#define CAKE_LIBRARY_NAME "cake_library"
#include "cake/causal_conv1d/kcp_entries.h"
#include "cake/image.h"

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_gather(CAKE_ENTRY_PARAMS) {
  using namespace cake::causal_conv1d_kcp;
  return cake::call_entry<GatherArgs>(gather, "gather", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_scatter(CAKE_ENTRY_PARAMS) {
  using namespace cake::causal_conv1d_kcp;
  return cake::call_entry<ScatterArgs>(scatter, "scatter", CAKE_ENTRY_ARGS);
}
