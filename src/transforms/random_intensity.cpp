// The random intensity transforms: RandIntensity (draw, then apply or fold into an index
// plan) and RandScaleIntensity and RandShiftIntensity (one class), RandGaussianNoise,
// RandAdjustContrast, RandGaussianSmooth, each on its options as read, with their entries in
// the random table (random_registry.cpp).
#include "medfast/transforms/random.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "medfast/core/error.hpp"
#include "random_families.hpp"

namespace medfast::transforms {

namespace {

// The arguments as written (MONAI's names and defaults), declared once.
/// RandScaleIntensity's and RandShiftIntensity's (each reads the range of its kind).
struct RandIntensityRangeOptions {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::array<double, 2> factors{-0.1, 0.1}, offsets{-0.1, 0.1};
  static constexpr auto fields() {
    using O = RandIntensityRangeOptions;
    return std::make_tuple(
        field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
        field("prob", &O::prob, "probability of applying it to a sample"),
        field("factors", &O::factors, "x * (1 + f), f drawn from [lo, hi]; one number v: [-v, v]").symmetric().in("RandScaleIntensity"),
        field("offsets", &O::offsets, "x + o, o drawn from [lo, hi]; one number v: [-v, v]").symmetric().in("RandShiftIntensity"));
  }
};
struct RandGaussianNoiseOptions {
  std::vector<std::string> keys;
  double prob = 0.1, mean = 0.0, std_max = 0.1;
  static constexpr auto fields() {
    using O = RandGaussianNoiseOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"), field("mean", &O::mean, "mean of the noise"),
                           field("std", &O::std_max, "the noise's std is drawn from [0, std]"));
  }
};
struct RandGaussianSmoothOptions {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::array<double, 2> sigma_x{0.25, 1.5}, sigma_y{0.25, 1.5}, sigma_z{0.25, 1.5};
  static constexpr auto fields() {
    using O = RandGaussianSmoothOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"), field("sigma_x", &O::sigma_x, "sigma range along x (voxels)").repeats(2),
                           field("sigma_y", &O::sigma_y, "sigma range along y (voxels)").repeats(2),
                           field("sigma_z", &O::sigma_z, "sigma range along z (voxels)").repeats(2));
  }
};
struct RandAdjustContrastOptions {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::array<double, 2> gamma{0.5, 4.5};
  static constexpr auto fields() {
    using O = RandAdjustContrastOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"), field("gamma", &O::gamma, "the exponent's range").repeats(2));
  }
};

using detail::require;

// Intensity transforms share the draw-then-apply shape.
template <typename Options>
class RandIntensity : public RandomWith<Options> {
 public:
  using RandomWith<Options>::RandomWith;
  void apply(Sample& s, Rng& rng) const override {
    if (!(rng.uniform() < this->o_.prob)) return;
    const auto params = draw(rng);
    for (const auto& key : this->o_.keys) {
      Volume& v = s.volume(key);
      at::Tensor x = at::isFloatingType(v.data.scalar_type()) ? v.data : v.data.to(at::kFloat);
      // A tensor that alone owns its dense storage (a flipped or rotated copy)
      // is changed in place; a view of the cached sample never is.
      const bool owned = x.storage().use_count() == 1 && x.is_non_overlapping_and_dense() &&
                         static_cast<std::size_t>(x.numel()) * x.element_size() == x.storage().nbytes();
      v.data = transform(x, params, rng, owned);
    }
  }
  bool index_step() const override {
    bool multiply = false;
    return affine_op(&multiply);
  }
  bool compose_index(IndexPlan& plan, const Sample& s, Rng& rng) const override {
    bool multiply = false;
    if (!affine_op(&multiply)) return false;
    for (const auto& key : this->o_.keys) (void)s.volume(key);
    if (!(rng.uniform() < this->o_.prob)) return true;
    const auto params = draw(rng);
    for (const auto& key : this->o_.keys) plan.op(key, multiply, multiply ? 1.0 + params[0] : params[0]);
    return true;
  }

 protected:
  /// Steps that are x * v (multiply) or x + v: foldable into an index plan.
  virtual bool affine_op(bool* multiply) const {
    (void)multiply;
    return false;
  }
  virtual std::vector<double> draw(Rng& rng) const = 0;
  virtual at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng& rng, bool in_place) const = 0;
};

// RandScaleIntensity (x * (1 + f)) and RandShiftIntensity (x + o): the same draw and fold.
class RandScaleShift final : public RandIntensity<RandIntensityRangeOptions> {
 public:
  RandScaleShift(std::string name, RandIntensityRangeOptions o)
      : RandIntensity(std::move(name), std::move(o)),
        multiply_(name_ == "RandScaleIntensity"),
        range_(multiply_ ? o_.factors : o_.offsets) {}

 protected:
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(range_[0], range_[1])}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng&, bool in_place) const override {
    if (multiply_) return in_place ? x.mul_(1.0 + p[0]) : x * (1.0 + p[0]);
    return in_place ? x.add_(p[0]) : x + p[0];
  }
  bool affine_op(bool* multiply) const override {
    *multiply = multiply_;
    return true;
  }

 private:
  bool multiply_;
  std::array<double, 2> range_;
};

class RandGaussianNoise final : public RandIntensity<RandGaussianNoiseOptions> {
 public:
  explicit RandGaussianNoise(RandGaussianNoiseOptions o) : RandIntensity("RandGaussianNoise", std::move(o)) {
    require(o_.std_max >= 0, "RandGaussianNoise: argument std must be non-negative");
  }

 protected:
  // MONAI 1.3 (sample_std=True): the noise's std is drawn from U(0, std).
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(0, o_.std_max)}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng& rng, bool) const override {
    at::Tensor noise = at::empty(x.sizes(), x.options().device(at::kCPU).dtype(at::kFloat));
    float* q = noise.data_ptr<float>();
    for (std::int64_t i = 0; i < noise.numel(); ++i) q[i] = static_cast<float>(o_.mean + p[0] * rng.normal());
    return x + noise.to(x.device()).to(x.scalar_type());
  }
};

class RandAdjustContrast final : public RandIntensity<RandAdjustContrastOptions> {
 public:
  explicit RandAdjustContrast(RandAdjustContrastOptions o) : RandIntensity("RandAdjustContrast", std::move(o)) {
    require(o_.gamma[0] > 0 && o_.gamma[1] >= o_.gamma[0], "RandAdjustContrast: argument gamma must be a positive range");
  }

 protected:
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(o_.gamma[0], o_.gamma[1])}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng&, bool) const override {
    const double eps = 1e-7;
    const double mn = x.min().item<double>(), range = x.max().item<double>() - mn;
    return ((x - mn) / (range + eps)).pow(p[0]) * range + mn;
  }
};

// Separable Gaussian smoothing: per axis, a kernel of erf-integrated
// Gaussian weights over [-4 sigma, 4 sigma] (normalised), zero padding.
class RandGaussianSmooth final : public RandIntensity<RandGaussianSmoothOptions> {
 public:
  explicit RandGaussianSmooth(RandGaussianSmoothOptions o)
      : RandIntensity("RandGaussianSmooth", std::move(o)), sigma_{o_.sigma_x, o_.sigma_y, o_.sigma_z} {
    for (const auto& r : sigma_) {
      require(r[0] >= 0 && r[1] >= r[0], "RandGaussianSmooth: arguments sigma_x/y/z must be non-negative ranges");
    }
  }
  static at::Tensor kernel(double sigma) {
    const auto radius = static_cast<std::int64_t>(std::ceil(4.0 * sigma));
    std::vector<double> w(static_cast<std::size_t>(2 * radius + 1));
    double sum = 0;
    for (std::int64_t i = -radius; i <= radius; ++i) {
      const double a = (static_cast<double>(i) - 0.5) / (std::sqrt(2.0) * sigma);
      const double b = (static_cast<double>(i) + 0.5) / (std::sqrt(2.0) * sigma);
      w[static_cast<std::size_t>(i + radius)] = 0.5 * (std::erf(b) - std::erf(a));
      sum += w[static_cast<std::size_t>(i + radius)];
    }
    for (auto& v : w) v /= sum;
    return at::tensor(w, at::kDouble);
  }

 protected:
  std::vector<double> draw(Rng& rng) const override {
    return {rng.uniform(sigma_[0][0], sigma_[0][1]), rng.uniform(sigma_[1][0], sigma_[1][1]),
            rng.uniform(sigma_[2][0], sigma_[2][1])};
  }
  at::Tensor transform(at::Tensor x, const std::vector<double>& sigma, Rng&, bool) const override {
    at::Tensor y = x.unsqueeze(0);  // (1, C, X, Y, Z): channels filtered independently
    const auto channels = x.size(0);
    for (int a = 0; a < 3; ++a) {
      if (sigma[a] <= 0) continue;
      const at::Tensor k = kernel(sigma[a]).to(x.scalar_type()).to(x.device());
      std::vector<std::int64_t> shape{1, 1, 1, 1, 1}, pad{0, 0, 0};
      shape[a + 2] = k.size(0);
      pad[a] = (k.size(0) - 1) / 2;
      const at::Tensor weight = k.view(shape).expand({channels, 1, shape[2], shape[3], shape[4]}).contiguous();
      y = at::conv3d(y, weight, {}, {1, 1, 1}, pad, {1, 1, 1}, channels);
    }
    return y.squeeze(0);
  }

 private:
  std::array<std::array<double, 2>, 3> sigma_;  // per axis
};

}  // namespace

// Entries of the random transform table (random_registry.cpp).
namespace registry {

RandomTransformPtr rand_scale_intensity(Args& a, const nlohmann::json&) { return made<RandScaleShift>(a, std::string("RandScaleIntensity")); }
RandomTransformPtr rand_shift_intensity(Args& a, const nlohmann::json&) { return made<RandScaleShift>(a, std::string("RandShiftIntensity")); }
RandomTransformPtr rand_gaussian_noise(Args& a, const nlohmann::json&) { return made<RandGaussianNoise>(a); }
RandomTransformPtr rand_gaussian_smooth(Args& a, const nlohmann::json&) { return made<RandGaussianSmooth>(a); }
RandomTransformPtr rand_adjust_contrast(Args& a, const nlohmann::json&) { return made<RandAdjustContrast>(a); }

}  // namespace registry

}  // namespace medfast::transforms
