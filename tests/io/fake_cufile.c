/* A stand-in libcufile for tests/io/test_cufile_shim.cpp: the entry points medfast's shim
 * binds, each recording its call in the file FAKE_CUFILE_LOG names. Built twice: with
 * cuFileDriverClose_v2 (CUDA 12.x's ref-counted close) and without (older libcufile).
 *
 * By default the driver reports no properties, as cuFile in compatibility mode may, and
 * refuses every file. The environment makes it a working one, "device" memory being host
 * memory (the cufile backend tested without a GPU):
 *   FAKE_CUFILE_IO=1        files register; cuFileRead/cuFileWrite are pread/pwrite
 *   FAKE_CUFILE_GDS=1       the properties name an nvidia-fs driver (GPUDirect, not compat)
 *   FAKE_CUFILE_MAX_IO=N    at most N bytes per call (short transfers)
 *   FAKE_CUFILE_FAIL_AT=N   calls at file offsets >= N fail with -5 (EIO) */
#define _GNU_SOURCE /* O_DIRECT */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

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
static long long env_number(const char* name, long long otherwise) {
  const char* v = getenv(name);
  return v && *v ? atoll(v) : otherwise;
}

/* The head of CUfileDrvProps_t: the nvfs driver's version first. */
CUfileError cuFileDriverGetProperties(void* props) {
  if (!env_number("FAKE_CUFILE_GDS", 0)) return unsupported();
  unsigned int* version = (unsigned int*)props;
  version[0] = 2; /* major */
  version[1] = 17;
  return ok();
}

/* CUfileDescr_t: int type; then a union whose first member is the descriptor. */
typedef struct {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
} Descr;

CUfileError cuFileHandleRegister(void** handle, Descr* descr) {
  if (!env_number("FAKE_CUFILE_IO", 0)) return unsupported();
  note("register");
  /* Real cuFile moves an O_DIRECT descriptor's bytes through aligned buffers of its own;
   * the stand-in reads into any memory, so it takes O_DIRECT off. */
  const int flags = fcntl(descr->handle.fd, F_GETFL);
  if (flags != -1) fcntl(descr->handle.fd, F_SETFL, flags & ~O_DIRECT);
  *handle = (void*)(intptr_t)(descr->handle.fd + 1);
  return ok();
}
void cuFileHandleDeregister(void* handle) {
  (void)handle;
  note("deregister");
}

static ssize_t transfer(void* h, char* buf, size_t n, off_t off, int write) {
  const long long fail_at = env_number("FAKE_CUFILE_FAIL_AT", -1);
  const long long max_io = env_number("FAKE_CUFILE_MAX_IO", 0);
  if (fail_at >= 0 && off >= fail_at) {
    note(write ? "write failed" : "read failed");
    return -5;
  }
  if (max_io > 0 && n > (size_t)max_io) n = (size_t)max_io;
  note(write ? "write" : "read");
  const int fd = (int)((intptr_t)h - 1);
  return write ? pwrite(fd, buf, n, off) : pread(fd, buf, n, off);
}
ssize_t cuFileRead(void* h, void* buf, size_t n, off_t off, off_t buf_off) {
  return transfer(h, (char*)buf + buf_off, n, off, 0);
}
ssize_t cuFileWrite(void* h, const void* buf, size_t n, off_t off, off_t buf_off) {
  return transfer(h, (char*)buf + buf_off, n, off, 1);
}
CUfileError cuFileBufRegister(const void* p, size_t n, int flags) { (void)p; (void)n; (void)flags; return ok(); }
CUfileError cuFileBufDeregister(const void* p) { (void)p; return ok(); }
