#include "medfast/train/placement.hpp"

#include "device.hpp"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#if MEDFAST_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "medfast/core/error.hpp"
#include "medfast/core/rank_env.hpp"

namespace medfast::train {

namespace {

std::string libtorch_version() {
  return str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

#if MEDFAST_TORCH_CUDA
/// 12040 -> "12.4" (CUDART: major * 1000 + minor * 10); cuDNN 90100 -> "9.1.0" (major * 10000
/// + minor * 100 + patch), 8907 -> "8.9.7" (major * 1000 + minor * 100 + patch).
std::string cudart_text(long v) { return str(v / 1000, ".", (v % 1000) / 10); }
std::string cudnn_text(long v) {
  if (v >= 90000) return str(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  return str(v / 1000, ".", (v % 1000) / 100, ".", v % 100);
}
#endif

}  // namespace

bool cuda_build() {
#if MEDFAST_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

DeviceChoice choose_device(const std::string& setting, const std::string& what, std::optional<int> local_rank) {
  DeviceChoice c;
  if (setting == "auto") {
    if (!cuda_build()) {
      c.text = str("cpu: this build has no CUDA (libtorch ", libtorch_version(), " for the CPU)");
      return c;
    }
    const int visible = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
    if (visible == 0) {
      c.text = "cpu: no GPU visible (the driver sees none, or CUDA_VISIBLE_DEVICES hides them)";
      return c;
    }
    c.device = detail::usable_device(local_rank ? str("cuda:", local_cuda_index(*local_rank, visible)) : "cuda", what);
  } else {
    c.device = detail::usable_device(setting, what);
    if (c.device.is_cpu()) {
      c.text = str("cpu (", what, " ", setting, ")");
      return c;
    }
  }
  c.text = c.device.str();
#if MEDFAST_TORCH_CUDA
  if (c.device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(c.device.index());
    c.text = str(c.device.str(), " (", p->name, ", sm_", p->major, p->minor, ")");
    c.bf16 = p->major >= 8;
  }
#endif
  return c;
}

nlohmann::json runtime_info(c10::Device device) {
  nlohmann::json j{{"libtorch", libtorch_version()}, {"cuda", nullptr}, {"cudnn", nullptr}};
#if MEDFAST_TORCH_CUDA
  const auto& hooks = at::detail::getCUDAHooks();
  try {
    j["cuda"] = cudart_text(hooks.versionCUDART());
    if (hooks.hasCuDNN()) j["cudnn"] = cudnn_text(hooks.versionCuDNN());
  } catch (const c10::Error&) {  // a CUDA build on a machine without its runtime: nothing to say
  }
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    j["gpu"] = {{"name", p->name},
                {"capability", str(p->major, ".", p->minor)},
                {"memory_bytes", static_cast<std::uint64_t>(p->totalGlobalMem)}};
  }
#else
  (void)device;
#endif
  return j;
}

std::string runtime_text(const nlohmann::json& info) {
  std::string t = str("libtorch ", info.value("libtorch", std::string("?")));
  if (info.contains("cuda") && info["cuda"].is_string()) {
    t += str(", CUDA ", info["cuda"].get<std::string>());
    if (info.contains("cudnn") && info["cudnn"].is_string()) t += str(", cuDNN ", info["cudnn"].get<std::string>());
  } else {
    t += ", no CUDA";
  }
  return t;
}

}  // namespace medfast::train
