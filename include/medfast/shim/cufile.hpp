#pragma once
/// \file
/// libcufile (GPUDirect Storage), loaded at run time with dlopen, never
/// linked: medfast runs where GDS is missing and says so in one log line.
/// Only the subset of the cuFile C API that medfast calls is declared here,
/// with the ABI of NVIDIA's cufile.h (CUfileError_t = {int err; int cu_err},
/// CUfileDescr_t = {int type; union {int fd; void*}; const void* fs_ops},
/// CUfileDrvProps_t's leading nvfs block); where the real cufile.h is installed
/// the build checks these against it (src/shim/cufile.cpp).
///
/// The library is loaded and the driver opened on the first call of cufile(),
/// which the tensor file engine makes only when a CUDA tensor is first read or
/// written: CPU-only runs and ranks that never move device tensors to or from
/// files never touch it. The driver is closed at exit (kvikio notes that
/// leaving it open can crash at process teardown).

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace medfast::shim {

struct CUfileError {
  int err;     ///< CU_FILE_SUCCESS (0) or a cuFile error code
  int cu_err;  ///< CUresult, when err is a CUDA driver error
};
using CUfileHandle = void*;
struct CUfileDescr {
  int type;  ///< CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
inline constexpr int kCuFileHandleTypeOpaqueFd = 1;
/// The head of CUfileDrvProps_t: the nvidia-fs kernel driver's version (0.0 when
/// it is not loaded: cuFile then runs in compatibility mode, through host memory),
/// then fields medfast does not read (kept as padding of the right size).
struct CUfileDrvProps {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};

/// The loaded library's entry points (null members if not loaded).
struct CuFileApi {
  CUfileError (*driver_open)() = nullptr;
  CUfileError (*driver_close)() = nullptr;
  CUfileError (*handle_register)(CUfileHandle*, CUfileDescr*) = nullptr;
  void (*handle_deregister)(CUfileHandle) = nullptr;
  ssize_t (*read)(CUfileHandle, void*, std::size_t, off_t, off_t) = nullptr;
  ssize_t (*write)(CUfileHandle, const void*, std::size_t, off_t, off_t) = nullptr;
  CUfileError (*buf_register)(const void*, std::size_t, int) = nullptr;
  CUfileError (*buf_deregister)(const void*) = nullptr;
  CUfileError (*driver_get_properties)(CUfileDrvProps*) = nullptr;
  /// The nvidia-fs driver is not loaded: cuFile works, but copies through host
  /// memory itself (no GPUDirect).
  bool compat_mode = false;
};

/// Loads libcufile and opens the driver, once per process. Returns null and
/// fills `why` if it is not usable (library missing, driver refused...).
const CuFileApi* cufile(std::string* why = nullptr);

/// One line for logs and `medfast io`: "cuFile (GPUDirect Storage)", "cuFile in
/// compatibility mode (...)" or why cuFile is not used.
std::string cufile_description();

}  // namespace medfast::shim
