/* A stand-in libnvidia-ml for the GPU sampler's tests (no driver is needed):
 * two GPUs, index 0 (also at PCI bus id 00000000:3B:00.0) and index 1 (which
 * reports no power: NVML_ERROR_NOT_SUPPORTED). Utilisation alternates 50, 60;
 * memory used is 1 GiB of 16; power 150 W; temperature 65 C. FAKE_NVML_INIT_FAIL
 * makes nvmlInit_v2 fail; FAKE_NVML_READ_FAIL makes utilisation reads fail. */
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned long long total, free, used;
} Memory;

#define EXPORT __attribute__((visibility("default")))
static int calls;

EXPORT nvmlReturn_t nvmlInit_v2(void) { return getenv("FAKE_NVML_INIT_FAIL") ? 999 : 0; }
EXPORT nvmlReturn_t nvmlShutdown(void) { return 0; }
EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  return r == 999 ? "FAKE init failure" : r == 6 ? "Not Found" : r == 3 ? "Not Supported" : "Unknown Error";
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index > 1) return 6;
  *device = (void*)(size_t)(index + 1);
  return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* id, void** device) {
  if (strcmp(id, "00000000:3B:00.0") != 0) return 6;
  *device = (void*)(size_t)1;
  return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  (void)device;
  if (getenv("FAKE_NVML_READ_FAIL")) return 999;
  u->gpu = (__sync_fetch_and_add(&calls, 1) % 2) ? 60 : 50;
  u->memory = 10;
  return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  (void)device;
  m->total = 16ull << 30;
  m->used = 1ull << 30;
  m->free = m->total - m->used;
  return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(void* device, unsigned int* mw) {
  if ((size_t)device == 2) return 3;
  *mw = 150000;
  return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* c) {
  (void)device;
  (void)sensor;
  *c = 65;
  return 0;
}
