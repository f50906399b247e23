#pragma once
/// \file
/// libnvidia-ml (NVML), loaded at run time: GPU utilisation, memory used, power and
/// temperature, for the trainer's GPU sampler. Nothing links against NVML; where it
/// cannot be loaded (no NVIDIA driver) Nvml::open says why and the caller logs one
/// line. MEDFAST_NVML_LIBRARY names another library to load (tests use a fake).
#include <cstdint>
#include <memory>
#include <string>

namespace medfast::shim {

struct GpuReading {
  double util_percent = 0;       ///< kernels running, % of the last sample period
  std::uint64_t memory_used = 0;  ///< bytes
  std::uint64_t memory_total = 0;
  double power_watts = 0;
  double temperature_c = 0;
};

class Nvml {
 public:
  /// The library, initialised (nvmlInit_v2), or null with `why` set.
  static std::shared_ptr<Nvml> open(std::string& why);
  ~Nvml();  ///< nvmlShutdown
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// A device by PCI bus id ("00000000:3B:00.0", as CUDA reports it), or by NVML
  /// index when `pci_bus_id` is empty. Null with `why` set where NVML has no such device.
  void* device(const std::string& pci_bus_id, unsigned index, std::string& why) const;
  /// One reading; false with `why` set where NVML fails (a value NVML does not
  /// support on this GPU, such as power, is left 0 and is not a failure).
  bool read(void* device, GpuReading& out, std::string& why) const;

  struct Api;

 private:
  Nvml() = default;
  std::unique_ptr<Api> api_;
  void* lib_ = nullptr;
};

}  // namespace medfast::shim
