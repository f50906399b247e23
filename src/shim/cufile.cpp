#include "medfast/shim/cufile.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <mutex>

#include "medfast/core/error.hpp"

#if MEDFAST_HAVE_CUDA_TOOLKIT
#include <cuda.h>
// The declarations in cufile.hpp mirror cufile.h; these are the CUDA types they stand for.
static_assert(sizeof(CUresult) == sizeof(int), "CUfileError_t.cu_err is a CUresult");
static_assert(sizeof(CUdeviceptr) == sizeof(void*), "cuFile takes device pointers as void*");
#endif

namespace medfast::shim {

static_assert(sizeof(CUfileError) == 2 * sizeof(int), "CUfileError_t is {CUfileOpError, CUresult}");
static_assert(offsetof(CUfileDescr, handle) == sizeof(void*), "CUfileDescr_t: the handle union follows the type");
static_assert(sizeof(CUfileDescr) == 3 * sizeof(void*), "CUfileDescr_t is {type, handle union, fs_ops}");

namespace {

struct Loaded {
  CuFileApi api;
  bool ok = false;
  std::string why;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn& out, std::string& why) {
  out = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (!out) why = str("libcufile has no symbol ", name);
  return out != nullptr;
}

Loaded load() {
  Loaded l;
  void* lib = nullptr;
  for (const char* name : {"libcufile.so.0", "libcufile.so.1", "libcufile.so"}) {
    lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
  }
  if (!lib) {
    l.why = "libcufile.so not found (GPUDirect Storage is not installed)";
    return l;
  }
  CuFileApi& a = l.api;
  if (!bind(lib, "cuFileDriverOpen", a.driver_open, l.why) || !bind(lib, "cuFileDriverClose", a.driver_close, l.why) ||
      !bind(lib, "cuFileHandleRegister", a.handle_register, l.why) ||
      !bind(lib, "cuFileHandleDeregister", a.handle_deregister, l.why) || !bind(lib, "cuFileRead", a.read, l.why) ||
      !bind(lib, "cuFileWrite", a.write, l.why) || !bind(lib, "cuFileBufRegister", a.buf_register, l.why) ||
      !bind(lib, "cuFileBufDeregister", a.buf_deregister, l.why)) {
    return l;
  }
  const CUfileError e = a.driver_open();
  if (e.err != 0) {
    l.why = str("cuFileDriverOpen failed (cuFile error ", e.err, ", CUDA error ", e.cu_err, ")");
    return l;
  }
  l.ok = true;
  return l;
}

}  // namespace

const CuFileApi* cufile(std::string* why) {
  static const Loaded loaded = load();
  if (why) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace medfast::shim
