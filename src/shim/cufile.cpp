#include "medfast/shim/cufile.hpp"

#include <cstddef>
#include <mutex>

#include "medfast/core/error.hpp"
#include "medfast/os/process.hpp"

#include <cstdlib>

#if MEDFAST_HAVE_CUDA_TOOLKIT
#include <cuda.h>
// The declarations in cufile.hpp mirror cufile.h; these are the CUDA types they stand for.
static_assert(sizeof(CUresult) == sizeof(int), "CUfileError_t.cu_err is a CUresult");
static_assert(sizeof(CUdeviceptr) == sizeof(void*), "cuFile takes device pointers as void*");
#if __has_include(<cufile.h>)
// Where NVIDIA's header is installed (libcufile-dev), check the mirror against it.
#include <cufile.h>
#define MEDFAST_CHECKED_AGAINST_CUFILE_H 1
#endif
#endif

namespace medfast::shim {

static_assert(sizeof(CUfileError) == 2 * sizeof(int), "CUfileError_t is {CUfileOpError, CUresult}");
static_assert(offsetof(CUfileDescr, handle) == sizeof(void*), "CUfileDescr_t: the handle union follows the type");
static_assert(sizeof(CUfileDescr) == 3 * sizeof(void*), "CUfileDescr_t is {type, handle union, fs_ops}");
#if MEDFAST_CHECKED_AGAINST_CUFILE_H
static_assert(sizeof(CUfileError) == sizeof(CUfileError_t), "CUfileError_t");
static_assert(sizeof(CUfileDescr) == sizeof(CUfileDescr_t), "CUfileDescr_t");
static_assert(offsetof(CUfileDescr, handle) == offsetof(CUfileDescr_t, handle), "CUfileDescr_t.handle");
static_assert(offsetof(CUfileDescr, fs_ops) == offsetof(CUfileDescr_t, fs_ops), "CUfileDescr_t.fs_ops");
static_assert(sizeof(CUfileDrvProps) == sizeof(CUfileDrvProps_t), "CUfileDrvProps_t");
static_assert(offsetof(CUfileDrvProps, nvfs) == offsetof(CUfileDrvProps_t, nvfs), "CUfileDrvProps_t.nvfs");
static_assert(offsetof(CUfileDrvProps, fflags) == offsetof(CUfileDrvProps_t, fflags), "CUfileDrvProps_t.fflags");
static_assert(CU_FILE_HANDLE_TYPE_OPAQUE_FD == kCuFileHandleTypeOpaqueFd, "CU_FILE_HANDLE_TYPE_OPAQUE_FD");
static_assert(CU_FILE_SUCCESS == 0, "CU_FILE_SUCCESS");
#endif

namespace {

struct Loaded {
  CuFileApi api;
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded l;
  void* lib = nullptr;
  // MEDFAST_CUFILE_LIBRARY: another libcufile (tests load a stand-in that records its calls).
  const char* custom = std::getenv("MEDFAST_CUFILE_LIBRARY");
  if (custom && *custom) {
    lib = os::open_library(custom);
  } else {
    for (const char* name : {"libcufile.so.0", "libcufile.so.1", "libcufile.so"}) {
      lib = os::open_library(name);
      if (lib) break;
    }
  }
  if (!lib) {
    l.why = "libcufile.so not found (GPUDirect Storage is not installed)";
    return l;
  }
  CuFileApi& a = l.api;
  const auto bind = [](void* lib, const char* name, auto& out, std::string& why) {
    return os::bind_symbol(lib, name, out, why, "libcufile");
  };
  // cuFileDriverClose_v2 (CUDA 12.x) counts opens: closing ours leaves the driver open for
  // kvikio or torch's GDS in this process. The legacy close tears it down for everyone.
  std::string no_v2;
  if (!bind(lib, "cuFileDriverClose_v2", a.driver_close, no_v2)) a.driver_close = nullptr;
  if (!bind(lib, "cuFileDriverOpen", a.driver_open, l.why) ||
      (!a.driver_close && !bind(lib, "cuFileDriverClose", a.driver_close, l.why)) ||
      !bind(lib, "cuFileHandleRegister", a.handle_register, l.why) ||
      !bind(lib, "cuFileHandleDeregister", a.handle_deregister, l.why) || !bind(lib, "cuFileRead", a.read, l.why) ||
      !bind(lib, "cuFileWrite", a.write, l.why) || !bind(lib, "cuFileBufRegister", a.buf_register, l.why) ||
      !bind(lib, "cuFileBufDeregister", a.buf_deregister, l.why) ||
      !bind(lib, "cuFileDriverGetProperties", a.driver_get_properties, l.why)) {
    return l;
  }
  const CUfileError e = a.driver_open();
  if (e.err != 0) {
    l.why = str("cuFileDriverOpen failed (cuFile error ", e.err, ", CUDA error ", e.cu_err, ")");
    return l;
  }
  CUfileDrvProps props{};
  const CUfileError pe = a.driver_get_properties(&props);
  // nvidia-fs 0.0: the kernel driver is not loaded and cuFile runs in compatibility mode.
  a.compat_mode = pe.err != 0 || (props.nvfs.major_version == 0 && props.nvfs.minor_version == 0);
  l.ok = true;
  return l;
}

/// The close the exit handler calls: a plain pointer, which no destructor touches. The
/// handler must not read `loaded()`'s static: registered while that static was being built,
/// the handler runs after its destructor (exit runs both in reverse order of registration).
CUfileError (*g_driver_close_at_exit)() = nullptr;

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r = load();
    // Close the driver before the CUDA runtime tears down (atexit handlers run in
    // reverse order, and the runtime registered its own when CUDA started, before this).
    if (r.ok) {
      g_driver_close_at_exit = r.api.driver_close;
      std::atexit([] {
        if (g_driver_close_at_exit) g_driver_close_at_exit();
      });
    }
    return r;
  }();
  return l;
}

}  // namespace

const CuFileApi* cufile(std::string* why) {
  const Loaded& l = loaded();
  if (why) *why = l.why;
  return l.ok ? &l.api : nullptr;
}

std::string cufile_description() {
  std::string why;
  const CuFileApi* api = cufile(&why);
  if (!api) return str("no cuFile: ", why);
  if (api->compat_mode) return "cuFile in compatibility mode (the nvidia-fs driver is not loaded: no GPUDirect)";
  return "cuFile (GPUDirect Storage)";
}

}  // namespace medfast::shim
