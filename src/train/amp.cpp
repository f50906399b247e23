#include "medfast/train/amp.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <cctype>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "medfast/core/error.hpp"

namespace medfast::train {

Precision parse_precision(const nlohmann::json& value, bool cuda, const std::string& where) {
  Precision p;
  if (value.is_boolean()) {
    p = !value.get<bool>() ? Precision::fp32 : cuda ? Precision::fp16 : Precision::bf16;
  } else if (value.is_string()) {
    const std::string s = lowercase(value.get<std::string>());
    if (s == "fp16") p = Precision::fp16;
    else if (s == "bf16") p = Precision::bf16;
    else if (s == "fp32") p = Precision::fp32;
    else throw ValueError(str(where, ": unknown precision '", value.get<std::string>(), "' (expected true, false, fp16, bf16 or fp32)"));
  } else {
    throw ValueError(str(where, ": expected true, false, fp16, bf16 or fp32, got ", value.dump()));
  }
  if (p == Precision::fp16 && !cuda) {
    throw ValueError(str(where, ": fp16 needs CUDA (autocast on the CPU runs bf16 only in libtorch 1.13); use bf16"));
  }
  return p;
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
    case Precision::fp32: break;
  }
  return "fp32";
}

at::ScalarType precision_dtype(Precision p) {
  switch (p) {
    case Precision::fp16: return at::kHalf;
    case Precision::bf16: return at::kBFloat16;
    case Precision::fp32: break;
  }
  return at::kFloat;
}

// ---------------------------------------------------------------------------
// AutocastGuard: torch.autocast's __enter__/__exit__ for one device type.

// The autocast state of one device type. libtorch 2.4 replaced the per-device
// functions (set_cpu_enabled, set_autocast_gpu_dtype, ...) by ones that take the
// device type and deprecated the old ones; 1.13 has only the old ones. This is
// the one place that knows.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
at::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
namespace {
void set_autocast(c10::DeviceType d, bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(d, enabled);
  at::autocast::set_autocast_dtype(d, dtype);
}
}  // namespace
#else
bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
at::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
namespace {
void set_autocast(c10::DeviceType d, bool enabled, at::ScalarType dtype) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}
}  // namespace
#endif

AutocastGuard::AutocastGuard(c10::DeviceType device, Precision precision) : device_(device) {
  if (precision == Precision::fp32) return;
  if (device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) {
    throw ValueError(str("autocast: device type ", c10::DeviceTypeName(device), " is not supported (CPU or CUDA)"));
  }
  if (device == c10::DeviceType::CPU && precision != Precision::bf16) {
    throw ValueError(str("autocast: CPU autocast supports bf16 only in libtorch 1.13 (got ", precision_name(precision), ")"));
  }
  previous_enabled_ = autocast_enabled(device);
  previous_dtype_ = autocast_dtype(device);
  set_autocast(device, true, precision_dtype(precision));
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The cast cache holds lower-precision copies of weights; it lives as long as the outermost region.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast(device_, previous_enabled_, previous_dtype_);
}

// ---------------------------------------------------------------------------
// GradScaler

GradScaler::GradScaler(GradScalerOptions o) : options_(o), init_scale_(o.init_scale) {
  if (!options_.enabled) return;
  MEDFAST_CHECK_T(ValueError, o.init_scale > 0 && std::isfinite(o.init_scale),
                  "GradScaler: init_scale must be a positive number (got ", o.init_scale, ")");
  MEDFAST_CHECK_T(ValueError, o.growth_factor > 1, "GradScaler: growth_factor must be > 1 (got ", o.growth_factor, ")");
  MEDFAST_CHECK_T(ValueError, o.backoff_factor > 0 && o.backoff_factor < 1,
                  "GradScaler: backoff_factor must be in (0, 1) (got ", o.backoff_factor, ")");
  MEDFAST_CHECK_T(ValueError, o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1 (got ",
                  o.growth_interval, ")");
}

void GradScaler::lazy_init(const at::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({1}, init_scale_, f32);
  growth_tracker_ = at::full({1}, init_growth_tracker_, f32.dtype(at::kInt));
}

GradScaler::PerOptimizer& GradScaler::per_optimizer(const torch::optim::Optimizer& opt) { return per_optimizer_[&opt]; }

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  if (!scale_.defined()) lazy_init(loss.device());
  const at::Tensor s = scale_.to(loss.device(), /*non_blocking=*/true);
  // torch multiplies by the [1]-shaped scale; a 0-dim loss stays 0-dim here so .item() and friends keep working.
  return loss * (loss.dim() == 0 ? s.reshape({}) : s);
}

void GradScaler::unscale(torch::optim::Optimizer& opt) {
  if (!options_.enabled) return;
  MEDFAST_CHECK(scale_.defined(), "GradScaler: unscale() before any scale(loss) in this iteration");
  PerOptimizer& st = per_optimizer(opt);
  MEDFAST_CHECK(st.stage != Stage::unscaled, "GradScaler: unscale() has already been called on this optimizer since the last update()");
  MEDFAST_CHECK(st.stage != Stage::stepped, "GradScaler: unscale() is being called after step()");

  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found_inf = at::zeros({1}, scale_.options());

  // As torch: grads grouped by device and dtype, one fused check-and-unscale per group where the device has it.
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> groups;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor g = p.grad();
      if (!g.defined()) continue;
      MEDFAST_CHECK_T(ValueError, g.scalar_type() != at::kHalf,
                      "GradScaler: attempting to unscale fp16 gradients (keep the parameters in fp32; autocast casts them)");
      MEDFAST_CHECK_T(ValueError, !g.is_sparse(), "GradScaler: sparse gradients are not supported");
      groups[{g.device().str(), g.scalar_type()}].push_back(g);
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [key, grads] : groups) {
    const at::Device device = grads.front().device();
    if (device.is_cuda()) {
      at::Tensor local_found = found_inf.to(device);
      at::_amp_foreach_non_finite_check_and_unscale_(grads, local_found, inv_scale.to(device));
      if (!local_found.is_same(found_inf)) found_inf.add_(local_found.to(found_inf.device()));
      else found_inf = local_found;
    } else {
      const at::Tensor inv = inv_scale.to(device);
      for (auto& g : grads) {
        found_inf.add_(at::logical_not(at::isfinite(g)).any().to(found_inf.options()));
        g.mul_(inv);
      }
    }
  }
  st.found_inf = found_inf;
  st.stage = Stage::unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  PerOptimizer& current = per_optimizer(opt);
  MEDFAST_CHECK(current.stage != Stage::stepped, "GradScaler: step() has already been called since the last update()");
  if (current.stage == Stage::ready) unscale(opt);
  PerOptimizer& st = per_optimizer(opt);
  // The one host sync of an iteration: whether to step at all.
  const bool clean = st.found_inf.item<float>() == 0.0f;
  if (clean) opt.step();
  st.stage = Stage::stepped;
  return clean;
}

bool GradScaler::step(torch::optim::Optimizer& opt, bool clean) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  PerOptimizer& st = per_optimizer(opt);
  MEDFAST_CHECK(st.stage == Stage::unscaled, "GradScaler: step(opt, clean) needs unscale(opt) first, once");
  if (clean) opt.step();
  st.stage = Stage::stepped;
  return clean;
}

void GradScaler::stepped(const torch::optim::Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& st = per_optimizer(opt);
  MEDFAST_CHECK(st.stage == Stage::unscaled, "GradScaler: stepped(opt) needs unscale(opt) first, once");
  st.stage = Stage::stepped;
}

at::Tensor GradScaler::found_inf(const torch::optim::Optimizer& opt) {
  PerOptimizer& st = per_optimizer(opt);
  MEDFAST_CHECK(options_.enabled && st.stage != Stage::ready && st.found_inf.defined(),
                "GradScaler: found_inf(opt) needs unscale(opt) first");
  return st.found_inf;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  MEDFAST_CHECK(scale_.defined(), "GradScaler: update() before any scale(loss)");
  std::vector<at::Tensor> found;
  for (auto& [opt, st] : per_optimizer_) {
    if (st.found_inf.defined()) found.push_back(st.found_inf);
  }
  MEDFAST_CHECK(!found.empty(), "GradScaler: no inf checks were recorded prior to update() (call step(opt) first)");
  at::Tensor combined = found.front().clone();
  for (std::size_t i = 1; i < found.size(); ++i) combined.add_(found[i]);

  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  } else {
    // torch's _amp_update_scale_ kernel, on the host.
    float s = scale_.item<float>();
    std::int64_t tracker = growth_tracker_.item<int>();
    if (combined.item<float>() != 0.0f) {
      s = static_cast<float>(static_cast<double>(s) * options_.backoff_factor);
      tracker = 0;
    } else if (tracker + 1 == options_.growth_interval) {
      const auto grown = static_cast<float>(static_cast<double>(s) * options_.growth_factor);
      if (std::isfinite(grown)) s = grown;
      tracker = 0;
    } else {
      tracker += 1;
    }
    scale_.fill_(s);
    growth_tracker_.fill_(tracker);
  }
  per_optimizer_.clear();
}

double GradScaler::scale_value() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<float>() : init_scale_;
}

std::int64_t GradScaler::growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int>() : init_growth_tracker_;
}

nlohmann::json GradScaler::state() const {
  if (!options_.enabled) return nlohmann::json::object();
  return {{"scale", scale_value()},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", options_.growth_interval},
          {"_growth_tracker", growth_tracker()}};
}

void GradScaler::load_state(const nlohmann::json& s) {
  if (!options_.enabled) return;
  MEDFAST_CHECK_T(ValueError, s.is_object(), "GradScaler state: expected a mapping, got ", s.dump());
  MEDFAST_CHECK_T(ValueError, !s.empty(),
                  "GradScaler state: empty, possibly because it was saved from a disabled GradScaler");
  auto number = [&](const char* key) {
    MEDFAST_CHECK_T(ValueError, s.contains(key) && s[key].is_number(), "GradScaler state: '", key,
                    "' missing or not a number (got ", s.value(key, nlohmann::json()).dump(), ")");
    return s[key].get<double>();
  };
  auto integer = [&](const char* key) {
    MEDFAST_CHECK_T(ValueError, s.contains(key) && s[key].is_number_integer(), "GradScaler state: '", key,
                    "' missing or not a whole number (got ", s.value(key, nlohmann::json()).dump(), ")");
    return s[key].get<std::int64_t>();
  };
  GradScalerOptions o = options_;
  const double scale = number("scale");
  o.growth_factor = number("growth_factor");
  o.backoff_factor = number("backoff_factor");
  o.growth_interval = integer("growth_interval");
  const std::int64_t tracker = integer("_growth_tracker");
  o.init_scale = scale;
  GradScaler check(o);  // validates the loaded factors
  options_.growth_factor = o.growth_factor;
  options_.backoff_factor = o.backoff_factor;
  options_.growth_interval = o.growth_interval;
  init_scale_ = scale;
  init_growth_tracker_ = tracker;
  if (scale_.defined()) scale_.fill_(scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(tracker);
}

}  // namespace medfast::train
