// medfast info --backends: the start-up self-check of libtorch's math (nn/self_check.hpp)
// on the CPU and every GPU, in each dtype training can run in, with what computes each op.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/nn/direct_conv.hpp"
#include "medfast/os/process.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/train/self_check.hpp"

namespace medfast::cli {

namespace {

std::string number(double v) {
  if (!std::isfinite(v)) return "nan";
  char b[32];
  std::snprintf(b, sizeof b, "%.2g", v);
  return b;
}

nlohmann::json libtorch_json() {
  return {{"libtorch", str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH)},
          {"threads", at::get_num_threads()},
          {"onednn_built", at::hasMKLDNN()},
          {"onednn_enabled", at::globalContext().userEnabledMkldnn()},
          {"blas", os::library_of_symbol("sgemm_")},
          {"cuda_devices", torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0},
          {"cudnn_built", at::globalContext().hasCuDNN()},
          {"cudnn_enabled", at::globalContext().userEnabledCuDNN()},
          {"direct_conv_isa", nn::direct_conv_isa()},
          {"direct_conv_enabled", nn::direct_conv_enabled()}};
}

}  // namespace

int check_backends(Context& ctx, bool json) {
  const bool enabled = ctx.settings.get_bool("self_check");
  train::apply_conv_forward(ctx.settings);
  std::vector<std::pair<c10::Device, at::ScalarType>> runs{{c10::Device(c10::kCPU), at::kFloat},
                                                           {c10::Device(c10::kCPU), at::kBFloat16}};
  if (torch::cuda::is_available()) {
    for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
      for (const auto t : {at::kFloat, at::kHalf, at::kBFloat16}) {
        runs.emplace_back(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)), t);
      }
    }
  }
  std::vector<train::SelfCheckReport> reports;
  std::string first_failure;
  for (const auto& [device, dtype] : runs) {
    try {
      reports.push_back(train::ensure_backends_checked(device, dtype, enabled));
    } catch (const train::BackendError& e) {
      if (first_failure.empty()) first_failure = e.message();
      reports.push_back(train::backend_reports().back());
    }
  }
  const nlohmann::json lib = libtorch_json();  // after the checks: what they left switched on
  if (json) {
    nlohmann::json out = lib;
    out["checks"] = nlohmann::json::array();
    for (const auto& r : reports) out["checks"].push_back(r.to_json());
    if (!first_failure.empty()) out["error"] = first_failure;
    print_json(out.dump(2));
  } else {
    auto state = [&](const char* built, const char* enabled, const char* absent) {
      return !lib[built].get<bool>() ? absent : lib[enabled].get<bool>() ? "on" : "off";
    };
    const std::string blas = lib["blas"];
    std::printf(
        "libtorch %s, %d threads; oneDNN %s; BLAS %s; CUDA devices %d; cuDNN %s; medfast's direct "
        "convolution %s (%s)\n",
        lib["libtorch"].get<std::string>().c_str(), lib["threads"].get<int>(),
        state("onednn_built", "onednn_enabled", "not built in"), blas.empty() ? "(libtorch's own)" : blas.c_str(),
        lib["cuda_devices"].get<int>(), state("cudnn_built", "cudnn_enabled", "not available"),
        lib["direct_conv_enabled"].get<bool>() ? "on" : "off", lib["direct_conv_isa"].get<std::string>().c_str());
    for (const auto& r : reports) {
      std::printf("%s\n", r.summary().c_str());
      for (const auto& op : r.ops) {
        std::printf("  %-34s %-36s max |error| %-8s %s\n", op.op.c_str(), op.backend.c_str(),
                    number(op.max_abs_error).c_str(),
                    op.passed ? str(number(op.worst_ratio), " of its bound").c_str()
                              : (op.error.empty() ? "WRONG" : str("FAILED: ", op.error).c_str()));
      }
    }
  }
  if (!first_failure.empty()) throw train::BackendError(first_failure);
  return 0;
}

}  // namespace medfast::cli
