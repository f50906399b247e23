#pragma once
/// \file
/// GPU sampling during training: a thread reads utilisation, memory used, power and
/// temperature of the GPUs in use (NVML, shim/nvml.hpp) every interval, and the
/// trainer takes each epoch's mean and max into metrics.jsonl ("gpu"); while tracing,
/// each reading is also a counter track in the trace.
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace medfast::shim {
class Nvml;
}

namespace medfast::profile {

struct GpuEpochStats {
  std::size_t samples = 0;  ///< readings (of all GPUs) in the epoch
  double util_mean = 0, util_max = 0, power_mean_w = 0, temperature_max_c = 0;
  std::uint64_t memory_used_max_bytes = 0;
  nlohmann::json to_json() const;
};

class GpuSampler {
 public:
  struct Target {
    std::string pci_bus_id;  ///< as CUDA reports it; empty: NVML's `index`
    unsigned index = 0;
  };
  /// Starts sampling; null with `why` set where NVML or a GPU cannot be had.
  static std::unique_ptr<GpuSampler> start(const std::vector<Target>& gpus, std::chrono::milliseconds interval,
                                           std::string& why);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  /// The readings since the last take() (an epoch), over every GPU sampled.
  GpuEpochStats take();
  /// Why sampling stopped early (a reading failed), or empty.
  std::string error() const;

 private:
  GpuSampler() = default;
  void loop();
  void sample();

  std::shared_ptr<shim::Nvml> nvml_;
  std::vector<void*> devices_;
  std::chrono::milliseconds interval_{1000};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string error_;
  double util_sum_ = 0, power_sum_ = 0;
  GpuEpochStats current_;
  std::thread thread_;
};

}  // namespace medfast::profile
