#pragma once
/// \file
/// Where a run computes, chosen once per process: train.device, eval's and infer's --device
/// and the built-in default recipe all go through choose_device.
///
///   auto     CUDA where this build has it and a GPU is visible (under a launcher, this rank's
///            GPU: LOCAL_RANK's through the visible devices, as train.device cuda), else the
///            CPU; the choice says why ("cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", "cpu: this
///            build has no CUDA", "cpu: no GPU visible")
///   cpu, cuda, cuda:N   as named (CUDA must be usable here)
///
/// The rule itself (auto: a GPU where one is usable) is io::resolve_device's, which the
/// loader and the caches below train/ apply to the same names.
#include <c10/core/Device.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace medfast::train {

struct DeviceChoice {
  c10::Device device{c10::kCPU};
  /// The device and why: "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", "cpu: this build has no
  /// CUDA (libtorch 1.13.1)", "cpu: no GPU visible (...)", "cpu (train.device cpu)".
  std::string text;
  /// CUDA: the GPU computes bfloat16 in its tensor cores (compute capability 8.0 and later).
  bool bf16 = false;
};

/// The device `setting` names (auto | cpu | cuda | cuda:N); `what` names the setting in
/// messages; `local_rank`: this process's LOCAL_RANK under a launcher. A CUDA device becomes
/// this thread's current device. ValueError naming `what` for a name that is not a device or
/// a CUDA device this process cannot use.
DeviceChoice choose_device(const std::string& setting, const std::string& what,
                           std::optional<int> local_rank = std::nullopt);

/// Whether this build's libtorch has CUDA (what auto needs besides a visible GPU).
bool cuda_build();

/// This build and `device`, for the run's first lines and machine.json: {"libtorch": "2.6.0",
/// "cuda": "12.4" (null without CUDA), "cudnn": "9.1.0" (null), "gpu": {"name", "capability",
/// "memory_bytes"} (on CUDA only)}.
nlohmann::json runtime_info(c10::Device device);

/// "libtorch 2.6.0, CUDA 12.4, cuDNN 9.1.0" (or "libtorch 1.13.1, no CUDA"): runtime_info in words.
std::string runtime_text(const nlohmann::json& info);

}  // namespace medfast::train
