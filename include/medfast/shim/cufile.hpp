#pragma once
/// \file
/// libcufile (GPUDirect Storage), loaded at run time with dlopen, never
/// linked: medfast runs where GDS is missing and says so in one log line.
/// Only the subset of the cuFile C API that medfast calls is declared here,
/// with the ABI of NVIDIA's cufile.h (CUfileError_t = {int err; int cu_err},
/// CUfileDescr_t = {int type; union {int fd; void*}; const void* fs_ops}).

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
};

/// Loads libcufile and opens the driver, once per process. Returns null and
/// fills `why` if it is not usable (library missing, driver refused...).
const CuFileApi* cufile(std::string* why = nullptr);

}  // namespace medfast::shim
