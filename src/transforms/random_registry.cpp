// The random transforms by name: random_names() and make_random(name, args), with the
// wrappers that put deterministic transforms into a random chain (DeterministicStep,
// ComposableResize). The random transforms come from random_families.hpp's factories.
#include "medfast/transforms/random.hpp"

#include <algorithm>

#include "medfast/transforms/transform.hpp"
#include "random_families.hpp"

namespace medfast::transforms {

namespace {

// A deterministic transform inside a random chain (ResizeWithPadOrCrop...).
class DeterministicStep final : public RandomTransform {
 public:
  explicit DeterministicStep(TransformPtr t) : t_(std::move(t)) {}
  std::string name() const override { return t_->name(); }
  nlohmann::json config() const override { return t_->config(); }
  void apply(Sample& s, Rng&) const override { t_->apply(s); }

 private:
  TransformPtr t_;
};

// ResizeWithPadOrCrop after composable transforms: a shift of the output grid.
class ComposableResize final : public RandomTransform {
 public:
  ComposableResize(TransformPtr t, std::vector<std::string> keys, Shape3 size)
      : t_(std::move(t)), keys_(std::move(keys)), size_(size) {}
  std::string name() const override { return t_->name(); }
  nlohmann::json config() const override { return t_->config(); }
  void apply(Sample& s, Rng&) const override { t_->apply(s); }
  bool compose(SpatialPlan& plan, const Sample&, Rng&) const override {
    if (!plan.active) return false;
    for (const auto& k : keys_) {
      if (!plan.mode.count(k)) return false;
    }
    Affine shift;  // new output index o -> plan output index o + start
    for (int a = 0; a < 3; ++a) {
      const std::int64_t n = plan.shape[a], t = size_[a];
      const std::int64_t start = n < t ? -((t - n) / 2) : n / 2 - t / 2;
      shift(a, 3) = static_cast<double>(start);
      // Voxels outside the previous grid are the resize's constant padding.
      plan.box_lo[a] = std::max<std::int64_t>(0, plan.box_lo[a] - start);
      plan.box_hi[a] = std::min<std::int64_t>(t, plan.box_hi[a] - start);
    }
    plan.out_to_in = plan.out_to_in * shift;
    plan.shape = size_;
    return true;
  }

 private:
  TransformPtr t_;
  std::vector<std::string> keys_;
  Shape3 size_;
};

}  // namespace

std::vector<std::string> random_names() {
  return {"RandCropByPosNegLabel", "RandSpatialCrop", "RandFlip", "RandRotate90", "RandRotate", "RandZoom",
          "RandAffine", "RandScaleIntensity", "RandShiftIntensity", "RandGaussianNoise", "RandGaussianSmooth",
          "RandAdjustContrast"};
}

RandomTransformPtr make_random(const std::string& name, const nlohmann::json& json) {
  const auto known = random_names();
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    TransformPtr t = make(name, json);  // throws for unknown names
    if (name == "ResizeWithPadOrCrop") {
      Args r(name, json);
      const auto keys = r.keys();
      const auto size = r.integers("spatial_size", 3);
      return std::make_shared<ComposableResize>(t, keys, Shape3{size[0], size[1], size[2]});
    }
    return std::make_shared<DeterministicStep>(t);
  }
  Args a(name, json);
  RandomTransformPtr t;
  const auto three = [](const std::vector<std::int64_t>& v) { return Shape3{v[0], v[1], v[2]}; };
  // A single number x for factors/offsets means (-x, x), as in MONAI.
  const auto symmetric = [&](const std::string& key, double fallback) -> std::array<double, 2> {
    if (a.has(key) && json[key].is_number()) {
      const double x = a.number(key, fallback);
      return {-x, x};
    }
    const auto v = a.numbers(key, 2, {-fallback, fallback});
    return {v[0], v[1]};
  };
  if (name == "RandCropByPosNegLabel") {
    detail::CropSpec c;
    c.keys = a.keys();
    c.label_key = a.text("label_key", "label");
    c.spatial_size = three(a.integers("spatial_size", 3));
    c.pos = a.number("pos", 1);
    c.neg = a.number("neg", 1);
    c.num_samples = static_cast<std::size_t>(a.integer("num_samples", 1));
    c.fg_indices_key = a.text("fg_indices_key", "");
    c.bg_indices_key = a.text("bg_indices_key", "");
    c.allow_smaller = a.flag("allow_smaller", false);
    a.text("image_key", "");
    a.number("image_threshold", 0);
    t = detail::make_rand_crop_by_pos_neg_label(c);
  } else if (name == "RandSpatialCrop") {
    const auto keys = a.keys();
    t = detail::make_rand_spatial_crop(keys, three(a.integers("roi_size", 3)));
  } else if (name == "RandFlip") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    // One axis, a list of them, or (absent, MONAI's None) all spatial axes.
    const auto& given = json.contains("spatial_axis") ? json["spatial_axis"] : nlohmann::json();
    const auto list = a.integers("spatial_axis", given.is_array() ? given.size() : 1, {0, 1, 2});
    const std::vector<int> axes(list.begin(), list.end());
    t = detail::make_rand_flip(keys, prob, axes);
  } else if (name == "RandRotate90") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const int max_k = static_cast<int>(a.integer("max_k", 3));
    const auto v = a.integers("spatial_axes", 2, {0, 1});
    const std::array<int, 2> axes{static_cast<int>(v[0]), static_cast<int>(v[1])};
    t = detail::make_rand_rotate90(keys, prob, max_k, axes);
  } else if (name == "RandRotate" || name == "RandZoom" || name == "RandAffine") {
    t = detail::make_rand_affine_family(name, a, json);
  } else if (name == "RandScaleIntensity") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const auto f = symmetric("factors", 0.1);
    t = detail::make_rand_scale_intensity(keys, prob, f[0], f[1]);
  } else if (name == "RandShiftIntensity") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const auto o = symmetric("offsets", 0.1);
    t = detail::make_rand_shift_intensity(keys, prob, o[0], o[1]);
  } else if (name == "RandGaussianNoise") {
    const auto keys = a.keys();
    t = detail::make_rand_gaussian_noise(keys, a.number("prob", 0.1), a.number("mean", 0), a.number("std", 0.1));
  } else if (name == "RandGaussianSmooth") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    std::array<std::array<double, 2>, 3> sigma{};
    const char* names[3] = {"sigma_x", "sigma_y", "sigma_z"};
    for (int i = 0; i < 3; ++i) {
      const auto v = a.numbers(names[i], 2, {0.25, 1.5});  // MONAI's default range
      sigma[i] = {v[0], v[1]};
    }
    t = detail::make_rand_gaussian_smooth(keys, prob, sigma);
  } else if (name == "RandAdjustContrast") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const auto g = a.numbers("gamma", 2, {0.5, 4.5});
    t = detail::make_rand_adjust_contrast(keys, prob, g[0], g[1]);
  }
  a.finish();
  return t;
}

}  // namespace medfast::transforms
