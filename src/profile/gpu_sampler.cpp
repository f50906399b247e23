#include "medfast/profile/gpu_sampler.hpp"

#include <algorithm>

#include "medfast/core/error.hpp"
#include "medfast/core/trace.hpp"
#include "medfast/shim/nvml.hpp"

namespace medfast::profile {

nlohmann::json GpuEpochStats::to_json() const {
  return {{"samples", samples},           {"util_mean", util_mean},
          {"util_max", util_max},         {"memory_used_max_bytes", memory_used_max_bytes},
          {"power_mean_w", power_mean_w}, {"temperature_max_c", temperature_max_c}};
}

std::unique_ptr<GpuSampler> GpuSampler::start(const std::vector<Target>& gpus, std::chrono::milliseconds interval,
                                              std::string& why) {
  if (gpus.empty()) {
    why = "no GPU to sample";
    return nullptr;
  }
  std::shared_ptr<shim::Nvml> nvml = shim::Nvml::open(why);
  if (!nvml) return nullptr;
  std::unique_ptr<GpuSampler> s(new GpuSampler);
  s->nvml_ = nvml;
  s->interval_ = interval;
  for (const auto& g : gpus) {
    void* d = nvml->device(g.pci_bus_id, g.index, why);
    if (!d) return nullptr;
    s->devices_.push_back(d);
  }
  s->sample();  // one reading now: a GPU NVML cannot read is reported here, not later
  if (!s->error_.empty()) {
    why = s->error_;
    return nullptr;
  }
  s->thread_ = std::thread([p = s.get()] {
    trace::set_thread_name("gpu sampler");
    p->loop();
  });
  return s;
}

GpuSampler::~GpuSampler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GpuSampler::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_ && error_.empty()) {
    if (cv_.wait_for(lock, interval_, [&] { return stopping_; })) break;
    lock.unlock();
    sample();
    lock.lock();
  }
}

void GpuSampler::sample() {
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    shim::GpuReading r;
    std::string why;
    if (!nvml_->read(devices_[i], r, why)) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = why;
      return;
    }
    if (trace::enabled()) {
      const std::string gpu = "gpu" + std::to_string(i);
      trace::counter((gpu + " util %").c_str(), r.util_percent);
      trace::counter((gpu + " memory GiB").c_str(), static_cast<double>(r.memory_used) / (1u << 30));
      trace::counter((gpu + " power W").c_str(), r.power_watts);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    GpuEpochStats& c = current_;
    ++c.samples;
    util_sum_ += r.util_percent;
    power_sum_ += r.power_watts;
    c.util_max = std::max(c.util_max, r.util_percent);
    c.memory_used_max_bytes = std::max(c.memory_used_max_bytes, r.memory_used);
    c.temperature_max_c = std::max(c.temperature_max_c, r.temperature_c);
  }
}

GpuEpochStats GpuSampler::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  GpuEpochStats out = current_;
  if (out.samples > 0) {
    out.util_mean = util_sum_ / static_cast<double>(out.samples);
    out.power_mean_w = power_sum_ / static_cast<double>(out.samples);
  }
  current_ = {};
  util_sum_ = power_sum_ = 0;
  return out;
}

std::string GpuSampler::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

}  // namespace medfast::profile
