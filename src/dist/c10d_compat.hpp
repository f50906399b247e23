#pragma once
/// \file
/// c10d across libtorch versions: the one place in dist/ that knows them.
///
/// - libtorch 2.0 split c10d::ProcessGroup into a per-device-type front and the
///   backends behind it (c10d::Backend: ProcessGroupGloo, ProcessGroupNCCL). medfast
///   talks to a backend directly, which is c10d::ProcessGroup in 1.13.
/// - libtorch 2.4 made TCPStore's server use libuv by default; a libtorch built
///   without libuv (Debian's) refuses that, so the store falls back to the classic
///   server when libuv is missing.
/// - ProcessGroupNCCL exists when libtorch was built with NCCL; CMake checks that
///   it links (MEDFAST_HAVE_C10D_NCCL) and defines USE_C10D_NCCL for its header. Its
///   abort() and shutdown(), called without arguments, are there from 2.4 (MEDFAST_NCCL_ABORT_AND_SHUTDOWN).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#ifndef MEDFAST_HAVE_C10D_NCCL
#define MEDFAST_HAVE_C10D_NCCL 0
#endif
#if MEDFAST_HAVE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

/// ProcessGroupNCCL::abort() and shutdown() as medfast calls them (without arguments): 2.4 on.
#if MEDFAST_HAVE_C10D_NCCL && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
#define MEDFAST_NCCL_ABORT_AND_SHUTDOWN 1
#else
#define MEDFAST_NCCL_ABORT_AND_SHUTDOWN 0
#endif

#include <string>

namespace medfast::dist::detail {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

inline constexpr bool kHaveNccl = MEDFAST_HAVE_C10D_NCCL != 0;

/// A TCPStore at host:port with `options`; on libtorch >= 2.4 without libuv, the
/// classic server instead of failing.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host, c10d::TCPStoreOptions options) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    if (!options.useLibUV || std::string(e.what()).find("libuv") == std::string::npos) throw;
    options.useLibUV = false;
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

}  // namespace medfast::dist::detail
