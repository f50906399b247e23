#include "medfast/shim/nvml.hpp"

#include <cstdlib>

#include "medfast/core/error.hpp"
#include "medfast/os/process.hpp"

// NVML's C API, declared here (the driver ships the library; nvml.h is in the CUDA
// toolkit only sometimes). Where nvml.h is there, the declarations are checked
// against it.
namespace medfast::shim {
namespace {
using nvmlReturn = int;
using nvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr nvmlReturn kSuccess = 0;
constexpr nvmlReturn kNotSupported = 3;
constexpr int kTemperatureGpu = 0;
}  // namespace
}  // namespace medfast::shim

#if defined(__has_include)
#if __has_include(<nvml.h>)
#include <nvml.h>
static_assert(sizeof(medfast::shim::NvmlUtilization) == sizeof(nvmlUtilization_t), "nvmlUtilization_t");
static_assert(sizeof(medfast::shim::NvmlMemory) == sizeof(nvmlMemory_t), "nvmlMemory_t");
static_assert(offsetof(medfast::shim::NvmlMemory, used) == offsetof(nvmlMemory_t, used), "nvmlMemory_t.used");
static_assert(NVML_SUCCESS == medfast::shim::kSuccess, "NVML_SUCCESS");
static_assert(NVML_ERROR_NOT_SUPPORTED == medfast::shim::kNotSupported, "NVML_ERROR_NOT_SUPPORTED");
static_assert(NVML_TEMPERATURE_GPU == medfast::shim::kTemperatureGpu, "NVML_TEMPERATURE_GPU");
#endif
#endif

namespace medfast::shim {

struct Nvml::Api {
  nvmlReturn (*init)();
  nvmlReturn (*shutdown)();
  const char* (*error_string)(nvmlReturn);
  nvmlReturn (*by_index)(unsigned, nvmlDevice*);
  nvmlReturn (*by_pci)(const char*, nvmlDevice*);
  nvmlReturn (*utilization)(nvmlDevice, NvmlUtilization*);
  nvmlReturn (*memory)(nvmlDevice, NvmlMemory*);
  nvmlReturn (*power)(nvmlDevice, unsigned*);
  nvmlReturn (*temperature)(nvmlDevice, int, unsigned*);
  std::string error(nvmlReturn r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return str("NVML error ", r, s ? str(" (", s, ")") : std::string());
  }
};

std::shared_ptr<Nvml> Nvml::open(std::string& why) {
  const char* custom = std::getenv("MEDFAST_NVML_LIBRARY");
  const std::string name = custom && *custom ? custom : "libnvidia-ml.so.1";
  std::string error;
  void* lib = os::open_library(name, &error);
  if (!lib) {
    why = str(name, " could not be loaded (", error.empty() ? "no NVIDIA driver here" : error, ")");
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  const auto bind = [](void* lib, const char* name, auto& out, std::string& why) {
    return os::bind_symbol(lib, name, out, why, "libnvidia-ml");
  };
  if (!bind(lib, "nvmlInit_v2", api->init, why) || !bind(lib, "nvmlShutdown", api->shutdown, why) ||
      !bind(lib, "nvmlDeviceGetHandleByIndex_v2", api->by_index, why) ||
      !bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", api->by_pci, why) ||
      !bind(lib, "nvmlDeviceGetUtilizationRates", api->utilization, why) ||
      !bind(lib, "nvmlDeviceGetMemoryInfo", api->memory, why) ||
      !bind(lib, "nvmlDeviceGetPowerUsage", api->power, why) ||
      !bind(lib, "nvmlDeviceGetTemperature", api->temperature, why)) {
    os::close_library(lib);
    return nullptr;
  }
  api->error_string = reinterpret_cast<const char* (*)(nvmlReturn)>(os::library_symbol(lib, "nvmlErrorString"));
  const nvmlReturn r = api->init();
  if (r != kSuccess) {
    why = str("nvmlInit failed: ", api->error(r));
    os::close_library(lib);
    return nullptr;
  }
  std::shared_ptr<Nvml> n(new Nvml);
  n->api_ = std::move(api);
  n->lib_ = lib;
  return n;
}

Nvml::~Nvml() {
  if (api_) api_->shutdown();
  os::close_library(lib_);
}

void* Nvml::device(const std::string& pci_bus_id, unsigned index, std::string& why) const {
  nvmlDevice d = nullptr;
  const nvmlReturn r = pci_bus_id.empty() ? api_->by_index(index, &d) : api_->by_pci(pci_bus_id.c_str(), &d);
  if (r != kSuccess) {
    why = str("NVML has no device ", pci_bus_id.empty() ? str("index ", index) : "at PCI bus id " + pci_bus_id, ": ",
              api_->error(r));
    return nullptr;
  }
  return d;
}

bool Nvml::read(void* device, GpuReading& out, std::string& why) const {
  NvmlUtilization u{};
  nvmlReturn r = api_->utilization(device, &u);
  if (r != kSuccess) {
    why = str("nvmlDeviceGetUtilizationRates: ", api_->error(r));
    return false;
  }
  out.util_percent = u.gpu;
  NvmlMemory m{};
  r = api_->memory(device, &m);
  if (r != kSuccess) {
    why = str("nvmlDeviceGetMemoryInfo: ", api_->error(r));
    return false;
  }
  out.memory_used = m.used;
  out.memory_total = m.total;
  unsigned v = 0;
  r = api_->power(device, &v);  // milliwatts; not every GPU reports it
  if (r == kSuccess) out.power_watts = v / 1000.0;
  else if (r != kNotSupported) {
    why = str("nvmlDeviceGetPowerUsage: ", api_->error(r));
    return false;
  }
  r = api_->temperature(device, kTemperatureGpu, &v);
  if (r == kSuccess) out.temperature_c = v;
  else if (r != kNotSupported) {
    why = str("nvmlDeviceGetTemperature: ", api_->error(r));
    return false;
  }
  return true;
}

}  // namespace medfast::shim
