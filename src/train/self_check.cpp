#include "medfast/train/self_check.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#if MEDFAST_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>

#include "medfast/core/log.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/nn/direct_conv.hpp"
#include "medfast/nn/swin_unetr.hpp"
#include "medfast/os/process.hpp"
#include "medfast/train/amp.hpp"

namespace medfast::train {

namespace {

constexpr double kFloatRoundoff = 5.9604644775390625e-8;  // 2^-24
constexpr double kTf32Roundoff = 4.8828125e-4;            // 2^-11: TF32 keeps float16's 10 mantissa bits
constexpr double kSafety = 4;                              // right kernels stay far inside the bound
constexpr double kNormwiseSlack = 0.1;                     // fast algorithms (Winograd, FFT) err normwise

double unit_roundoff(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kFloatRoundoff;
    case at::kBFloat16: return 0.00390625;    // 2^-8
    case at::kHalf: return kTf32Roundoff;     // 2^-11
    case at::kDouble: return 1.1102230246251565e-16;
    default: throw ValueError(str("self-check: dtype ", c10::toString(t), " is not a training dtype (float32, bfloat16, float16)"));
  }
}

bool mkldnn_on() { return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn(); }
bool cudnn_on() { return at::globalContext().hasCuDNN() && at::globalContext().userEnabledCuDNN(); }

constexpr const char* kOneDnn = "oneDNN (mkldnn)";
constexpr const char* kDirect = "medfast direct convolution";
constexpr const char* kCuDnn = "cuDNN";

std::string blas_name() {
  const std::string lib = os::library_of_symbol("sgemm_");
  const auto slash = lib.rfind('/');
  return str("BLAS (", lib.empty() ? std::string("libtorch's") : lib.substr(slash == std::string::npos ? 0 : slash + 1),
             ")");
}

/// What one probe computes: the op in the run's dtype and in float64 on the same inputs,
/// and the magnitudes its error is bounded by.
struct Result {
  at::Tensor out, ref;
  /// The op on the inputs' magnitudes, computed only where |ref| (a lower bound of it) does
  /// not already show the error within bounds.
  std::function<at::Tensor()> magnitude;
  double reduction = 1;          ///< K: products summed per output element
  double internal_roundoff = 0;  ///< inputs rounded inside the op (autocast's dtype, TF32)
};

struct Probe {
  std::string op, backend;
  std::function<Result()> run;
};

class Probes {
 public:
  Probes(c10::Device device, at::ScalarType dtype)
      : device_(device), dtype_(dtype),
        precision_(dtype == at::kBFloat16 ? Precision::bf16 : dtype == at::kHalf ? Precision::fp16 : Precision::fp32) {}

  /// Values in [lo, hi), the same on every device and run: float32 for the op, which runs
  /// under the run's autocast as the network's forward does (autocast rounds them to its
  /// dtype where it computes in it), and the same values in float64 for the reference.
  std::pair<at::Tensor, at::Tensor> input(at::IntArrayRef shape, std::uint64_t seed, double lo = -1, double hi = 1) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const at::Tensor x = at::rand(shape, gen, at::TensorOptions().dtype(at::kDouble)) * (hi - lo) + lo;
    const at::Tensor f = x.to(at::kFloat).to(device_);
    return {f, f.to(at::kDouble)};
  }

  std::vector<Probe> all() {
    std::vector<Probe> p;
    const bool cpu = device_.is_cpu();
    const std::string conv = cpu ? (mkldnn_on() ? kOneDnn : "ATen (im2col + " + blas_name() + ")")
                                 : (cudnn_on() ? kCuDnn : "ATen CUDA (im2col + cuBLAS)");
    const std::string gemm = cpu ? (dtype_ == at::kFloat ? blas_name() : (mkldnn_on() ? kOneDnn : "ATen"))
                                 : "cuBLAS";
    const std::string attention =
        nn::detail::has_fused_attention() ? str("scaled_dot_product_attention (", cpu ? "ATen" : "flash/mem-efficient", ")")
                              : "matmul + softmax (" + gemm + ")";
    // Batch 2 and 8 channels, as a small UNet's first levels: libtorch's CPU heuristics send
    // these to oneDNN where it is on.
    for (const int k : {3, 1}) {
      for (const int s : {1, 2}) {
        p.push_back({str("conv3d ", k, "x", k, "x", k, " stride ", s), conv, [this, k, s] { return conv3d(k, s); }});
      }
    }
    // A first layer (one input channel) and a wide one (channels in blocks of 16 floats, as
    // AVX-512 kernels lay them out): other kernels than the 8-channel probes take.
    p.push_back({"conv3d 3x3x3 1->8 channels", conv, [this] { return conv3d(3, 1, 1, 8, 10); }});
    p.push_back({"conv3d 3x3x3 32->32 channels", conv, [this] { return conv3d(3, 1, 32, 32, 4); }});
    p.push_back({"conv3d 3x3x3 backward (input)", conv, [this] { return conv3d_backward(true); }});
    p.push_back({"conv3d 3x3x3 backward (weight)", conv, [this] { return conv3d_backward(false); }});
    p.push_back({"conv_transpose3d 3x3x3 stride 2", conv, [this] { return conv_transpose3d(3); }});
    p.push_back({"conv_transpose3d 2x2x2 stride 2", conv, [this] { return conv_transpose3d(2); }});
    // medfast's own kernel for few channels (nn/direct_conv.hpp), where the networks use it: a
    // width that ends in a partial row chunk, and blocks of output channels.
    // Checked whatever the conv_forward setting says now: a later run may turn it on.
    if (cpu && dtype_ == at::kFloat && !nn::direct_conv_faulty() && nn::direct_conv_isa() != "generic") {
      const std::string direct = str(kDirect, " (", nn::direct_conv_isa(), ")");
      p.push_back({"conv3d 3x3x3 2->2 channels", direct, [this] { return direct_conv3d(2, 2, {2, 2, 6, 7, 21}); }});
      p.push_back({"conv3d 3x3x3 12->3 channels", direct, [this] { return direct_conv3d(12, 3, {1, 12, 5, 5, 16}); }});
    }
    p.push_back({"linear (matmul)", gemm, [this] { return linear(); }});
    p.push_back({"window attention", attention, [this] { return window_attention_probe(); }});
    return p;
  }

 private:
  /// How much the op rounds its inputs: to the autocast dtype, or to TF32 where cuDNN or
  /// cuBLAS may use it for float32.
  double input_roundoff(bool tf32_allowed) const {
    if (dtype_ != at::kFloat) return unit_roundoff(dtype_);
    return device_.is_cuda() && tf32_allowed ? kTf32Roundoff : 0;
  }
  /// The op as the network runs it: under the run's autocast.
  template <typename F>
  at::Tensor autocast(F&& f) const {
    AutocastGuard guard(device_.type(), precision_);
    return f();
  }

  Result conv3d(int k, int s, std::int64_t cin = 8, std::int64_t cout = 16, std::int64_t size = 8) {
    const auto [x, x64] = input({2, cin, size, size, size}, 11 + static_cast<std::uint64_t>(cin));
    const auto [w, w64] = input({cout, cin, k, k, k}, 12 + static_cast<std::uint64_t>(k + cout));
    const auto [b, b64] = input({cout}, 13);
    const int pad = k / 2;
    Result r;
    r.out = autocast([&] { return at::conv3d(x, w, b, s, pad); });
    r.ref = at::conv3d(x64, w64, b64, s, pad);
    r.magnitude = [xa = x64.abs(), wa = w64.abs(), ba = b64.abs(), s, pad] { return at::conv3d(xa, wa, ba, s, pad); };
    r.reduction = static_cast<double>(cin) * k * k * k + 1;
    r.internal_roundoff = input_roundoff(at::globalContext().allowTF32CuDNN());
    return r;
  }

  Result direct_conv3d(std::int64_t cin, std::int64_t cout, std::vector<std::int64_t> shape) {
    const auto [x, x64] = input(shape, 31 + static_cast<std::uint64_t>(cin));
    const auto [w, w64] = input({cout, cin, 3, 3, 3}, 32 + static_cast<std::uint64_t>(cout));
    const auto [b, b64] = input({cout}, 33);
    Result r;
    r.out = nn::direct_conv3d(x, w, b, {1, 1, 1}, {1, 1, 1});
    r.ref = at::conv3d(x64, w64, b64, 1, 1);
    r.magnitude = [xa = x64.abs(), wa = w64.abs(), ba = b64.abs()] { return at::conv3d(xa, wa, ba, 1, 1); };
    r.reduction = static_cast<double>(cin) * 27 + 1;
    return r;
  }

  /// The gradients of a 3x3x3 conv for a given output gradient, by autograd (whatever
  /// the caller's grad mode), the forward under autocast as in a training step. Both
  /// gradients come from one backward pass, each side computed once for the two probes.
  Result conv3d_backward(bool of_input) {
    if (!backward_) {
      c10::InferenceMode normal(false);
      torch::AutoGradMode grad(true);
      const auto [x, x64] = input({2, 8, 6, 6, 6}, 21);
      const auto [w, w64] = input({16, 8, 3, 3, 3}, 22);
      const auto [g, g64] = input({2, 16, 6, 6, 6}, 23);
      auto grads = [&](const at::Tensor& xi, const at::Tensor& wi, const at::Tensor& gi, bool low) {
        const at::Tensor xr = xi.detach().requires_grad_(), wr = wi.detach().requires_grad_();
        const at::Tensor y = low ? autocast([&] { return at::conv3d(xr, wr, {}, 1, 1); }) : at::conv3d(xr, wr, {}, 1, 1);
        y.backward(gi.to(y.scalar_type()));
        return std::make_pair(xr.grad(), wr.grad());
      };
      backward_ = Backward{grads(x, w, g, true), grads(x64, w64, g64, false), {}, {}};
      backward_->magnitude_of = [grads, xa = x64.abs(), wa = w64.abs(), ga = g64.abs()] {
        c10::InferenceMode normal(false);
        torch::AutoGradMode grad(true);
        return grads(xa, wa, ga, false);
      };
    }
    auto pick = [of_input](const std::pair<at::Tensor, at::Tensor>& p) { return of_input ? p.first : p.second; };
    Result r;
    r.out = pick(backward_->out);
    r.ref = pick(backward_->ref);
    r.magnitude = [this, pick] {
      if (!backward_->magnitude.first.defined()) backward_->magnitude = backward_->magnitude_of();
      return pick(backward_->magnitude);
    };
    r.reduction = of_input ? 16.0 * 27 : 2.0 * 6 * 6 * 6;
    r.internal_roundoff = input_roundoff(at::globalContext().allowTF32CuDNN());
    return r;
  }

  Result conv_transpose3d(int k) {
    const auto [x, x64] = input({2, 16, 4, 4, 4}, 31);
    const auto [w, w64] = input({16, 8, k, k, k}, 32 + k);
    const auto [b, b64] = input({8}, 33);
    const int pad = k == 3 ? 1 : 0, out_pad = k == 3 ? 1 : 0;  // UNet's up-convolution; SwinUNETR's
    Result r;
    r.out = autocast([&] { return at::conv_transpose3d(x, w, b, 2, pad, out_pad); });
    r.ref = at::conv_transpose3d(x64, w64, b64, 2, pad, out_pad);
    r.magnitude = [xa = x64.abs(), wa = w64.abs(), ba = b64.abs(), pad, out_pad] {
      return at::conv_transpose3d(xa, wa, ba, 2, pad, out_pad);
    };
    r.reduction = 16.0 * k * k * k + 1;
    r.internal_roundoff = input_roundoff(at::globalContext().allowTF32CuDNN());
    return r;
  }

  Result linear() {
    const auto [x, x64] = input({2, 64, 48}, 41);
    const auto [w, w64] = input({32, 48}, 42);
    const auto [b, b64] = input({32}, 43);
    Result r;
    r.out = autocast([&] { return at::linear(x, w, b); });
    r.ref = at::linear(x64, w64, b64);
    r.magnitude = [xa = x64.abs(), wa = w64.abs(), ba = b64.abs()] { return at::linear(xa, wa, ba); };
    r.reduction = 49;
    r.internal_roundoff = input_roundoff(at::globalContext().allowTF32CuBLAS());
    return r;
  }

  /// SwinUNETR's window attention (64 tokens, 2 heads of 16): softmax(q k^T / 4 + bias) v.
  /// Scores stay within +-1 and v within [0.5, 1.5], so the output is near 1 and an error
  /// (or an all-zero result) stands out even against a bfloat16 bound.
  Result window_attention_probe() {
    const std::int64_t n = 64, d = 16;
    const auto [q, q64] = input({4, 2, n, d}, 51, -0.5, 0.5);
    const auto [k, k64] = input({4, 2, n, d}, 52, -0.5, 0.5);
    const auto [v, v64] = input({4, 2, n, d}, 53, 0.5, 1.5);
    const auto [bias, bias64] = input({1, 2, n, n}, 54, -0.5, 0.5);
    Result r;
    r.out = autocast([&] { return nn::detail::window_attention(q, k, v, bias, 0.0, false); });
    r.ref = nn::detail::window_attention_plain(q64, k64, v64, bias64, 0.0, false);
    // |scores| <= d/4 max|q| max|k| + max|bias| = 1.5; the output's error is bounded by the
    // scores' error times max|v|, plus the weighted sum's own rounding.
    r.magnitude = [ref = r.ref] { return at::full_like(ref, 1.5 * (1 + 1.5)); };
    r.reduction = static_cast<double>(d + n);
    r.internal_roundoff = input_roundoff(at::globalContext().allowTF32CuBLAS());  // scores, weights too
    return r;
  }

  c10::Device device_;
  at::ScalarType dtype_;
  Precision precision_;
  struct Backward {
    std::pair<at::Tensor, at::Tensor> out, ref, magnitude;  // (input, weight) gradients
    std::function<std::pair<at::Tensor, at::Tensor>()> magnitude_of;
  };
  std::optional<Backward> backward_;
};

OpCheck check_one(const Probe& p, at::ScalarType dtype, const FaultInjector& inject) {
  OpCheck c;
  c.op = p.op;
  c.backend = p.backend;
  const auto t0 = std::chrono::steady_clock::now();
  struct Timer {
    OpCheck& c;
    std::chrono::steady_clock::time_point t0;
    ~Timer() { c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } timer{c, t0};
  try {
    Result r = p.run();
    if (inject) inject(p.op, p.backend, r.out);
    const at::Tensor out = r.out.to(at::kDouble);
    MEDFAST_CHECK(out.sizes() == r.ref.sizes(), "shape ", out.sizes(), " instead of ", r.ref.sizes());
    const at::Tensor diff = (out - r.ref).abs();
    if (!at::isfinite(out).all().item<bool>()) {
      c.max_abs_error = std::nan("");
      c.worst_ratio = std::numeric_limits<double>::infinity();
      return c;
    }
    const at::Tensor ref_abs = r.ref.abs();
    auto worst_ratio = [&](const at::Tensor& m) {
      const at::Tensor bound =
          kSafety * ((r.reduction * kFloatRoundoff + 2 * r.internal_roundoff) * (m + kNormwiseSlack * m.max()) +
                     unit_roundoff(dtype) * ref_abs) +
          std::numeric_limits<double>::min();
      return (diff / bound).max().item<double>();
    };
    c.max_abs_error = diff.max().item<double>();
    // |ref| <= the magnitudes element by element, so the bound made from |ref| is the
    // tighter one: an op within it is within the true bound, and the magnitudes (the op
    // once more, in float64) are computed only for the rest.
    c.worst_ratio = worst_ratio(ref_abs);
    if (c.worst_ratio > 1) c.worst_ratio = worst_ratio(r.magnitude());
    c.passed = c.worst_ratio <= 1;
  } catch (const std::exception& e) {
    c.error = message_of(e);
    c.worst_ratio = std::numeric_limits<double>::infinity();
  }
  return c;
}

std::vector<OpCheck> check_all(c10::Device device, at::ScalarType dtype, const FaultInjector& inject) {
  std::vector<OpCheck> out;
  Probes probes(device, dtype);  // the probes' functions refer to it
  for (const Probe& p : probes.all()) out.push_back(check_one(p, dtype, inject));
  return out;
}

std::string describe(const OpCheck& c) {
  if (!c.error.empty()) return str(c.op, " computed by ", c.backend, " failed: ", c.error);
  if (!std::isfinite(c.max_abs_error)) return str(c.op, " computed by ", c.backend, " returns NaN or infinity");
  return str(c.op, " computed by ", c.backend, " is off by up to ", c.max_abs_error, " (", c.worst_ratio,
             " times its error bound)");
}

std::string hardware_of(c10::Device device) {
#if MEDFAST_TORCH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  if (device.is_cuda()) return "CUDA device";
  return os::machine_info().cpu;
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return c10::toString(t);
  }
}

}  // namespace

nlohmann::json OpCheck::to_json() const {
  nlohmann::json j{{"op", op}, {"backend", backend}, {"passed", passed}, {"seconds", seconds}};
  j["max_abs_error"] = std::isfinite(max_abs_error) ? nlohmann::json(max_abs_error) : nlohmann::json(nullptr);
  j["worst_ratio"] = std::isfinite(worst_ratio) ? nlohmann::json(worst_ratio) : nlohmann::json(nullptr);
  if (!error.empty()) j["error"] = error;
  return j;
}

bool SelfCheckReport::passed() const {
  return std::all_of(ops.begin(), ops.end(), [](const OpCheck& c) { return c.passed; });
}

nlohmann::json SelfCheckReport::to_json() const {
  nlohmann::json o = nlohmann::json::array(), f = nlohmann::json::array();
  for (const auto& c : ops) o.push_back(c.to_json());
  for (const auto& c : failed_first) f.push_back(c.to_json());
  return {{"device", device}, {"hardware", hardware},    {"dtype", dtype},     {"ran", ran},
          {"passed", !ran || passed()}, {"ops", o},      {"failed_first", f}, {"switched_off", switched_off},
          {"seconds", seconds},         {"summary", summary()}};
}

std::string SelfCheckReport::summary() const {
  const std::string where = str(device, " (", hardware, ") ", dtype);
  if (!ran) return str(where, ": not checked (self_check is off)");
  const long ms = std::lround(seconds * 1000);
  if (!passed()) {
    for (const auto& c : ops) {
      if (!c.passed) return str(where, ": ", describe(c));
    }
  }
  if (switched_off.empty()) return str(where, ": ", ops.size(), " ops match float64 (", ms, " ms)");
  std::string off, why;
  for (const auto& s : switched_off) off += (off.empty() ? "" : " and ") + s;
  for (const auto& c : failed_first) why += (why.empty() ? "" : "; ") + describe(c);
  return str(where, ": ", why, ". ", off, " switched off for this process: every op now matches float64 (", ms, " ms)");
}

namespace {

/// The check without the verdict: a report whose passed() may be false.
SelfCheckReport check_backends(const SelfCheckOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  (void)unit_roundoff(o.dtype);  // an unknown dtype is the caller's error, not the backend's
  SelfCheckReport r;
  const c10::Device device = io::resolve_device(o.device.str());
  r.device = device.str();
  r.hardware = hardware_of(device);
  r.dtype = dtype_name(o.dtype);
  r.ran = true;
  torch::NoGradGuard no_grad;
  r.ops = check_all(device, o.dtype, o.inject);
  if (!r.passed()) {
    // Switch off what computed a failing op, where it can be switched off, and try again.
    bool onednn = false, cudnn = false, direct = false;
    for (const auto& c : r.ops) {
      if (c.passed) continue;
      onednn = onednn || (device.is_cpu() && c.backend == kOneDnn);
      cudnn = cudnn || (device.is_cuda() && c.backend == kCuDnn);
      direct = direct || (device.is_cpu() && c.backend.rfind(kDirect, 0) == 0);
    }
    if (onednn || cudnn || direct) {
      for (const auto& c : r.ops) {
        if (!c.passed) r.failed_first.push_back(c);
      }
      if (onednn) {
        at::globalContext().setUserEnabledMkldnn(false);
        r.switched_off.push_back(kOneDnn);
      }
      if (cudnn) {
        at::globalContext().setUserEnabledCuDNN(false);
        r.switched_off.push_back(kCuDnn);
      }
      if (direct) {
        nn::set_direct_conv_faulty(true);
        r.switched_off.push_back(kDirect);
      }
      r.ops = check_all(device, o.dtype, o.inject);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string failure_message(const SelfCheckReport& r) {
  std::string off;
  if (!r.switched_off.empty()) off = str(" and stays wrong with ", r.switched_off.front(), " switched off");
  const OpCheck& bad = *std::find_if(r.ops.begin(), r.ops.end(), [](const OpCheck& c) { return !c.passed; });
  return str("self-check of libtorch's math on ", r.device, " (", r.hardware, ") in ", r.dtype, ": ", describe(bad),
             off, ". Training would compute garbage: use another libtorch build",
             r.device == "cpu" ? " or BLAS (update-alternatives --config libblas.so.3-x86_64-linux-gnu)" : " or driver",
             ", or set MEDFAST_SELF_CHECK=off to run anyway");
}

}  // namespace

SelfCheckReport run_self_check(const SelfCheckOptions& o) {
  SelfCheckReport r = check_backends(o);
  if (!r.passed()) throw BackendError(failure_message(r));
  return r;
}

namespace {

struct Checked {
  std::string key;
  SelfCheckReport report;
  std::string error;  // the BackendError's message, when it failed
};

std::mutex& checked_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Checked>& checked() {
  static std::vector<Checked> v;
  return v;
}

}  // namespace

SelfCheckReport ensure_backends_checked(c10::Device device_in, at::ScalarType dtype, bool enabled) {
  if (!enabled) {
    SelfCheckReport r;
    r.device = device_in.str();
    r.dtype = dtype_name(dtype);
    r.hardware = device_in.is_cpu() ? hardware_of(device_in) : "";
    return r;
  }
  const c10::Device device = io::resolve_device(device_in.str());
  const std::string key = device.str() + "/" + dtype_name(dtype);
  std::lock_guard<std::mutex> lock(checked_mutex());
  for (const auto& c : checked()) {
    if (c.key != key) continue;
    if (!c.error.empty()) throw BackendError(c.error);
    return c.report;
  }
  Checked c;
  c.key = key;
  c.report = check_backends({device, dtype, {}});
  if (!c.report.passed()) {
    c.error = failure_message(c.report);
    checked().push_back(c);
    throw BackendError(c.error);
  }
  if (!c.report.switched_off.empty()) {
    log::warn("self-check: ", c.report.summary());
  } else {
    log::debug("self-check: ", c.report.summary());
  }
  checked().push_back(c);
  return c.report;
}

std::vector<SelfCheckReport> backend_reports() {
  std::lock_guard<std::mutex> lock(checked_mutex());
  std::vector<SelfCheckReport> out;
  for (const auto& c : checked()) out.push_back(c.report);
  return out;
}

}  // namespace medfast::train
