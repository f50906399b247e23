#pragma once
/// \file
/// Device names as the run config and `eval`/`infer` give them (private to src/train/;
/// defined in detail.cpp). Apart from detail.hpp so that run_config.cpp, which only checks
/// the name, does not include what includes run_config.hpp.
#include <c10/core/Device.h>

#include <string>

namespace medfast::train::detail {

/// A device name (cpu, cuda, cuda:N); ValueError naming `what` otherwise.
c10::Device parse_device(const std::string& name, const std::string& what);
/// The same, and CUDA must be usable here. A CUDA device with an index becomes this
/// thread's current device, so that what is allocated without naming one (libtorch's
/// workspaces, cuDNN's handles, a CUDA context) lands on it and not on GPU 0; "cuda"
/// comes back as the current device with its index (io::resolve_device), so that the
/// caches and loader threads given it do not take their own GPU 0.
c10::Device usable_device(const std::string& name, const std::string& what);

}  // namespace medfast::train::detail
