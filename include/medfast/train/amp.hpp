#pragma once
/// \file
/// Mixed precision: the `amp:` setting, a scoped autocast, and a gradient scaler.
///
/// A training step with fp16 on CUDA reads
///
///   { AutocastGuard autocast(c10::kCUDA, Precision::fp16); loss = loss_fn(net(x), y); }
///   scaler.scale(loss).backward();
///   scaler.unscale(opt);          // optional: only to look at (or clip) true gradients
///   scaler.step(opt);             // skipped when a gradient is inf/nan
///   scaler.update();              // once per iteration, after every optimizer stepped
///
/// bf16 has fp32's exponent range, so bf16 runs need no scaler (construct it
/// with enabled = false and the same code passes through).
///
/// Autocast state is thread-local in libtorch: a guard covers the thread that
/// made it.

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

namespace medfast::train {

enum class Precision { fp32, fp16, bf16 };

/// `amp:` value true|false|"fp16"|"bf16"|"fp32": true means fp16 on CUDA and
/// bf16 on CPU. ValueError names `where`, also for fp16 without CUDA (libtorch
/// 1.13's CPU autocast supports bf16 only).
Precision parse_precision(const nlohmann::json& value, bool cuda, const std::string& where = "amp");

/// "fp32", "fp16" or "bf16".
std::string precision_name(Precision p);

/// The tensor dtype a precision computes in (kFloat, kHalf, kBFloat16).
at::ScalarType precision_dtype(Precision p);

/// Whether autocast is on for a device type (CPU or CUDA), and its dtype: one
/// spelling for every libtorch version (2.4 renamed the per-device functions).
bool autocast_enabled(c10::DeviceType device);
at::ScalarType autocast_dtype(c10::DeviceType device);

/// Scoped autocast for a device type (CPU: bf16 only, as libtorch 1.13
/// supports; fp16 on CPU is a ValueError); a no-op for fp32. Restores the
/// previous autocast state on destruction, as torch.autocast's __exit__ does:
/// nesting-safe, and the cast cache is cleared when the outermost guard ends.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

/// torch.cuda.amp.GradScaler's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
};

/// torch.cuda.amp.GradScaler semantics: scale(loss) multiplies by the scale;
/// unscale(opt) at most once per step divides the optimizer's gradients by the
/// scale and notes whether any was inf/nan; step(opt) unscales if not done yet
/// and skips opt.step() (parameters and optimizer state untouched) when a
/// gradient was non-finite, returning whether it stepped; update() multiplies
/// the scale by backoff_factor after a skipped step and by growth_factor after
/// growth_interval clean steps in a row (a growth to inf is not taken).
///
/// The scale lives on the device of the first loss it scales. On CUDA the
/// check and the update are torch's fused kernels (no host sync until step()
/// reads the flag); elsewhere they are generic tensor ops. Disabled, every
/// call passes through (scale() returns the loss, step() steps, scale_value() is 1).
class GradScaler {
 public:
  /// Throws ValueError for init_scale <= 0, growth_factor <= 1,
  /// backoff_factor outside (0, 1) or growth_interval < 1.
  explicit GradScaler(GradScalerOptions o = {});

  at::Tensor scale(const at::Tensor& loss);
  /// Throws Error when called twice for one optimizer before update(), or after step().
  void unscale(torch::optim::Optimizer& opt);
  /// Throws Error when called twice for one optimizer before update().
  bool step(torch::optim::Optimizer& opt);
  /// The same, where the caller has already read found_inf(opt) in its own host read
  /// (the trainer reads it with the loss): `clean` is whether it was 0. Throws Error
  /// unless unscale(opt) came first.
  bool step(torch::optim::Optimizer& opt, bool clean);
  /// The caller's update took opt's step itself, skipping itself on the device where
  /// found_inf(opt) is not 0 (update.hpp's ParameterUpdate): no host read. Throws Error
  /// unless unscale(opt) came first.
  void stepped(const torch::optim::Optimizer& opt);
  /// After unscale(opt): float32 [1] on the scale's device, > 0 when a gradient was
  /// inf/nan (no host read). Throws Error before unscale(opt).
  at::Tensor found_inf(const torch::optim::Optimizer& opt);
  /// Throws Error when no optimizer was unscaled or stepped since the last update().
  void update();
  double scale_value() const;
  /// Consecutive clean steps since the scale last changed.
  std::int64_t growth_tracker() const;

  /// {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
  /// as torch's GradScaler.state_dict(); {} when disabled.
  nlohmann::json state() const;
  /// Restores state(); a no-op when disabled. ValueError for an empty state
  /// (saved while disabled) or a missing or mistyped key.
  void load_state(const nlohmann::json& s);
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    at::Tensor found_inf;  ///< float32 [1] on the scale's device: > 0 when a gradient was inf/nan
  };

  void lazy_init(const at::Device& device);
  PerOptimizer& per_optimizer(const torch::optim::Optimizer& opt);

  GradScalerOptions options_;
  double init_scale_;
  std::int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;           ///< float32 [1]
  at::Tensor growth_tracker_;  ///< int32 [1]
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace medfast::train
