/* A stand-in for an NVTX tool (what Nsight Systems injects through
 * NVTX_INJECTION64_PATH): it receives the core module's RangePushA/RangePop
 * callbacks through NVTX3's export table and logs them to $FAKE_NVTX_LOG, so the
 * tests can see medfast's ranges arrive as NVTX ranges without a GPU profiler. */
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>

static FILE* out;

static int fake_push(const char* message) {
  if (out) {
    fprintf(out, "push %s\n", message);
    fflush(out);
  }
  return 0;
}

static int fake_pop(void) {
  if (out) {
    fprintf(out, "pop\n");
    fflush(out);
  }
  return 0;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const NvtxExportTableCallbacks* callbacks = (const NvtxExportTableCallbacks*)get_table(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = 0;
  unsigned int size = 0;
  if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size)) return 0;
  if (size <= NVTX_CBID_CORE_RangePop) return 0;
  *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)fake_push;
  *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)fake_pop;
  const char* path = getenv("FAKE_NVTX_LOG");
  out = path ? fopen(path, "w") : 0;
  return 1;
}
