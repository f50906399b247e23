#include "detail.hpp"

#include <set>

#include <torch/version.h>

#if MEDFAST_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)  // std::optional in its API
#include <torch/csrc/cuda/memory_snapshot.h>
#define MEDFAST_MEMORY_HISTORY 1
#endif
#endif

#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <cstdio>
#include <deque>

#include "medfast/io/tensor_io.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/train/metrics.hpp"

namespace medfast::train::detail {

// The caching allocator's statistics have no device-generic API in libtorch 1.13-2.6:
// c10::cuda's, compiled where this libtorch has CUDA (CMake: MEDFAST_TORCH_CUDA).
std::optional<std::pair<std::uint64_t, std::uint64_t>> cuda_memory_peaks(c10::Device device) {
#if MEDFAST_TORCH_CUDA
  if (device.is_cuda()) {
    const auto b = io::cuda_allocator_bytes(device.has_index() ? device.index() : c10::DeviceIndex{0});
    if (!b) return std::nullopt;
    return std::make_pair(static_cast<std::uint64_t>(b->allocated_peak), static_cast<std::uint64_t>(b->reserved_peak));
  }
#endif
  (void)device;
  return std::nullopt;
}

std::string cuda_pci_bus_id(c10::Device device) {
#if MEDFAST_TORCH_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    char id[32];
    std::snprintf(id, sizeof id, "%08X:%02X:%02X.0", static_cast<unsigned>(p->pciDomainID),
                  static_cast<unsigned>(p->pciBusID), static_cast<unsigned>(p->pciDeviceID));
    return id;
  }
#endif
  (void)device;
  return "";
}

void reset_cuda_memory_peaks(c10::Device device) {
#if MEDFAST_TORCH_CUDA
  if (device.is_cuda()) {
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
    } catch (const c10::Error&) {
      // libtorch 2.11: no statistics before the allocator's first allocation, so no peaks to reset
    }
  }
#endif
  (void)device;
}

bool record_cuda_memory_history(bool on, std::string& why) {
#if MEDFAST_MEMORY_HISTORY
  (void)why;
  // Every allocation and free with its stack ("python": a C++ process has no Python frames,
  // and C++ frames would be symbolised at dump time, which can take minutes).
  if (on) {
    torch::cuda::_record_memory_history(std::string("all"), std::string("all"), "python", 100000);
  } else {
    torch::cuda::_record_memory_history(std::nullopt, std::nullopt, "python", 0);
  }
  return true;
#else
  (void)on;
#if MEDFAST_TORCH_CUDA
  why = str("libtorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
            ": medfast records the allocator's history through the C++ API of libtorch >= 2.4");
#else
  why = "this libtorch was built without CUDA";
#endif
  return false;
#endif
}

std::string cuda_memory_snapshot_pickled() {
#if MEDFAST_MEMORY_HISTORY
  return torch::cuda::_memory_snapshot_pickled();
#else
  return "";
#endif
}

// A step's boundaries: the stage each one ends (nullptr: the step's start) and when.
struct StageClock::Impl {
  using Clock = std::chrono::steady_clock;
  struct Boundary {
    double StageTimes::*stage = nullptr;
    Clock::time_point host;
#if MEDFAST_TORCH_CUDA
    std::shared_ptr<at::cuda::CUDAEvent> event;
#endif
  };
  c10::Device device;
  bool events = false;  ///< CUDA timing events (else the host clock)
  std::deque<std::vector<Boundary>> steps;  ///< recorded, not yet added; the back one is the current step

  void add(const std::vector<Boundary>& step, StageTimes& times) const {
    for (std::size_t i = 1; i < step.size(); ++i) {
      double seconds = std::chrono::duration<double>(step[i].host - step[i - 1].host).count();
#if MEDFAST_TORCH_CUDA
      if (events) seconds = step[i - 1].event->elapsed_time(*step[i].event) / 1e3;
#endif
      times.*(step[i].stage) += seconds;
    }
  }
  bool passed(const std::vector<Boundary>& step) const {
#if MEDFAST_TORCH_CUDA
    if (events) return step.back().event->query();
#endif
    (void)step;
    return true;
  }
};

StageClock::StageClock(c10::Device device) : impl_(std::make_unique<Impl>(Impl{device, false, {}})) {
#if MEDFAST_TORCH_CUDA
  impl_->events = device.is_cuda();
#endif
}
StageClock::~StageClock() = default;

void StageClock::start() {
  impl_->steps.emplace_back();
  lap(nullptr);
}

void StageClock::lap(double StageTimes::*stage) {
  MEDFAST_CHECK(!impl_->steps.empty(), "StageClock::lap before start");
  Impl::Boundary b;
  b.stage = stage;
#if MEDFAST_TORCH_CUDA
  if (impl_->events) {
    b.event = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // timing on
    b.event->record(at::cuda::getCurrentCUDAStream(impl_->device.index()));
  }
#endif
  if (!impl_->events && impl_->device.type() != c10::DeviceType::CPU) {
    // A device this build has no events for: the host clock after the stream's work.
    c10::impl::VirtualGuardImpl(impl_->device.type()).getStream(impl_->device).synchronize();
  }
  b.host = Impl::Clock::now();
  impl_->steps.back().push_back(std::move(b));
}

void StageClock::collect(StageTimes& times) {
  // Every step but the current one, oldest first, as far as their events have passed.
  while (impl_->steps.size() > 1 && impl_->passed(impl_->steps.front())) {
    impl_->add(impl_->steps.front(), times);
    impl_->steps.pop_front();
  }
}

void StageClock::flush(StageTimes& times) {
#if MEDFAST_TORCH_CUDA
  if (impl_->events && !impl_->steps.empty() && !impl_->steps.back().empty()) impl_->steps.back().back().event->synchronize();
#endif
  for (const auto& step : impl_->steps) impl_->add(step, times);
  impl_->steps.clear();
}

Predictor inference_predictor(const nlohmann::json& model, const torch::nn::AnyModule& trained,
                              const Settings& settings, const std::string& where, c10::Device device,
                              Precision precision, Tta tta, at::MemoryFormat memory_format) {
  nn::set_memory_format(*trained.ptr(), memory_format);
  torch::nn::AnyModule run = settings.get_bool("fold_batch_norm")
                                 ? nn::inference_network(nn::parse_network(without_pretrained(model), where), trained)
                                 : trained;
  nn::set_memory_format(*run.ptr(), memory_format);  // a folded network is a new one
  return with_tta(
      [run, type = device.type(), precision, memory_format](const at::Tensor& x) mutable {
        AutocastGuard autocast(type, precision);
        return run.forward<at::Tensor>(nn::to_memory_format(x, memory_format));
      },
      tta);
}

c10::Device parse_device(const std::string& name, const std::string& what) {
  try {
    return c10::Device(name);
  } catch (const c10::Error&) {
    throw ValueError(str(what, ": '", name, "' is not a device (cpu, cuda, cuda:N)"));
  }
}

c10::Device usable_device(const std::string& name, const std::string& what) {
  const c10::Device device = parse_device(name, what);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw ValueError(str(what, " ", name, ": libtorch has no usable CUDA device here"));
  }
  if (device.is_cuda() && device.has_index()) {
    const auto count = static_cast<int>(torch::cuda::device_count());
    if (device.index() >= count) {
      throw ValueError(str(what, " ", name, ": this process sees ", count, " CUDA device", count == 1 ? "" : "s",
                           " (cuda:0..cuda:", count - 1, ")"));
    }
    c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);
  }
  return io::resolve_device(device.str());  // "cuda": the current GPU, by its index
}

CaseScores score_case(const Sample& s, const RunConfig& c, const Predictor& predict, c10::Device device, bool hd95,
                      const std::string& where) {
  const Volume& img = s.volume(c.train.image_key);
  const Volume& lab = s.volume(c.train.label_key);
  const at::Tensor x = img.data.unsqueeze(0).to(device, at::kFloat);
  // Labels slab by slab (sliding_window_labels): the whole logits, C float32 volumes, are
  // never held; the scores are those of the whole output's argmax (or masks).
  const SlidingWindowLabels p =
      with_context(where, [&] { return sliding_window_labels(x, predict, c.sliding_window, c.loss.sigmoid); });
  // The label's own values are checked here (classes): its file is named.
  const std::string label_where = lab.meta.source.empty() ? where : str(where, " (label ", lab.meta.source, ")");
  const MetricInputs m = with_context(label_where, [&] {
    return metric_inputs_from_labels(p.labels, lab.data.unsqueeze(0).to(p.labels.device()), p.classes, c.loss.sigmoid);
  });
  CaseScores r;
  r.dice = dice_per_class(m.pred, m.target, m.include_background);
  if (hd95) {
    const auto sp = lab.spacing();
    r.hd95 = hausdorff95_per_class(m.pred, m.target, m.include_background, {sp[0], sp[1], sp[2]});
  }
  r.nonfinite_logits = p.nonfinite > 0;
  if (r.nonfinite_logits) {
    r.dice = at::full_like(r.dice, std::nan(""), r.dice.options().dtype(at::kDouble));
    if (hd95) r.hd95 = at::full_like(r.hd95, std::nan(""), r.hd95.options().dtype(at::kDouble));
  }
  return r;
}

nlohmann::json image_only_chain(const nlohmann::json& chain, const std::string& image_key) {
  static const std::set<std::string> per_key{"mode", "padding_mode", "dtype", "align_corners"};
  nlohmann::json out = nlohmann::json::array();
  for (nlohmann::json t : chain) {
    if (!t.is_object() || !t.contains("keys")) continue;
    nlohmann::json keys = t["keys"];
    if (keys.is_string()) keys = nlohmann::json::array({keys});
    std::size_t at = keys.size();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == image_key) at = i;
    }
    if (at == keys.size()) continue;
    const std::string name = t.value("name", "");
    if (name == "FgBgToIndices") continue;
    for (auto& [k, v] : t.items()) {
      if (per_key.count(k) && v.is_array() && v.size() == keys.size()) v = v[at];
    }
    t["keys"] = nlohmann::json::array({image_key});
    out.push_back(t);
  }
  return out;
}

}  // namespace medfast::train::detail
