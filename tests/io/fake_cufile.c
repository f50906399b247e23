/* A stand-in libcufile for tests/io/test_cufile_shim.cpp: the entry points medfast's shim
 * binds, each recording its call in the file FAKE_CUFILE_LOG names. Built twice: with
 * cuFileDriverClose_v2 (CUDA 12.x's ref-counted close) and without (older libcufile). The
 * driver reports no properties, as cuFile in compatibility mode may. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

typedef struct {
  int err;
  int cu_err;
} CUfileError;

static void note(const char* what) {
  const char* path = getenv("FAKE_CUFILE_LOG");
  if (!path) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%s\n", what);
  fclose(f);
}

static CUfileError ok(void) {
  CUfileError e = {0, 0};
  return e;
}
static CUfileError unsupported(void) {
  CUfileError e = {5030, 0};
  return e;
}

CUfileError cuFileDriverOpen(void) { note("open"); return ok(); }
CUfileError cuFileDriverClose(void) { note("close"); return ok(); }
#ifdef FAKE_CUFILE_V2
CUfileError cuFileDriverClose_v2(void) { note("close_v2"); return ok(); }
#endif
CUfileError cuFileDriverGetProperties(void* props) { (void)props; return unsupported(); }
CUfileError cuFileHandleRegister(void* handle, void* descr) { (void)handle; (void)descr; return unsupported(); }
void cuFileHandleDeregister(void* handle) { (void)handle; }
ssize_t cuFileRead(void* h, void* buf, size_t n, off_t off, off_t buf_off) {
  (void)h; (void)buf; (void)n; (void)off; (void)buf_off;
  return -1;
}
ssize_t cuFileWrite(void* h, const void* buf, size_t n, off_t off, off_t buf_off) {
  (void)h; (void)buf; (void)n; (void)off; (void)buf_off;
  return -1;
}
CUfileError cuFileBufRegister(const void* p, size_t n, int flags) { (void)p; (void)n; (void)flags; return ok(); }
CUfileError cuFileBufDeregister(const void* p) { (void)p; return ok(); }
