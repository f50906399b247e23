// The random transforms by name: random_names() and make_random(name, args), with the
// wrappers that put deterministic transforms into a random chain (DeterministicStep,
// ComposableResize). Each random transform's entry (its arguments read) sits in its
// family's file; a new one is its file (or a family's) and one row in
// MEDFAST_RANDOM_TRANSFORMS.
#include "medfast/transforms/random.hpp"

#include <algorithm>

#include "medfast/transforms/transform.hpp"
#include "random_families.hpp"

// Name, entry (defined in the family's file; its read_options call gives the key table
// too), in random_names() order.
#define MEDFAST_RANDOM_TRANSFORMS(X)                                         \
  X("RandCropByPosNegLabel", rand_crop_by_pos_neg_label) /* random_crop.cpp */ \
  X("RandSpatialCrop", rand_spatial_crop)                /* random_crop.cpp */ \
  X("RandFlip", rand_flip)                               /* random_crop.cpp */ \
  X("RandRotate90", rand_rotate90)                       /* random_crop.cpp */ \
  X("RandRotate", rand_rotate)                           /* random_affine.cpp */ \
  X("RandZoom", rand_zoom)                               /* random_affine.cpp */ \
  X("RandAffine", rand_affine)                           /* random_affine.cpp */ \
  X("RandScaleIntensity", rand_scale_intensity)          /* random_intensity.cpp */ \
  X("RandShiftIntensity", rand_shift_intensity)          /* random_intensity.cpp */ \
  X("RandGaussianNoise", rand_gaussian_noise)            /* random_intensity.cpp */ \
  X("RandGaussianSmooth", rand_gaussian_smooth)          /* random_intensity.cpp */ \
  X("RandAdjustContrast", rand_adjust_contrast)          /* random_intensity.cpp */

namespace medfast::transforms {

namespace {

// A deterministic transform inside a random chain (ResizeWithPadOrCrop...).
class DeterministicStep final : public RandomTransform {
 public:
  explicit DeterministicStep(TransformPtr t) : t_(std::move(t)) {}
  std::string name() const override { return t_->name(); }
  nlohmann::json steps() const override { return t_->config(); }
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
  nlohmann::json steps() const override { return t_->config(); }
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

namespace registry {
#define MEDFAST_RANDOM_ENTRY(name, entry) RandomTransformPtr entry(Args& arguments, const nlohmann::json& json);
MEDFAST_RANDOM_TRANSFORMS(MEDFAST_RANDOM_ENTRY)
#undef MEDFAST_RANDOM_ENTRY
constexpr Registered<RandomTransformPtr (*)(Args&, const nlohmann::json&)> kRandomRows[] = {
    MEDFAST_RANDOM_TRANSFORMS(MEDFAST_REGISTRY_ROW)};
constexpr EntryTable kRandomTransforms{kRandomRows, "random transform"};
}  // namespace registry

std::vector<std::string> random_names() { return registry::kRandomTransforms.names(); }

std::vector<FieldDoc> random_argument_docs(const std::string& name) { return registry::kRandomTransforms.docs(name); }

RandomTransformPtr make_random(const std::string& name, const nlohmann::json& json, nlohmann::json* arguments) {
  const auto* row = registry::kRandomTransforms.find(name);
  if (!row) {
    // A deterministic transform is a step of the random chain too; a name that is neither is
    // named with the random transforms first (what a random chain is for).
    const auto known = names();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw ValueError(str("unknown transform '", name, "' (random: ", registry::kRandomTransforms.known(),
                           "; deterministic ones are taken too: ", join(known), ")"));
    }
    TransformPtr t = make(name, json, arguments);
    if (name == "ResizeWithPadOrCrop") {
      Args r(name, json);
      const auto keys = r.keys();
      const auto size = r.integers("spatial_size", 3);
      return std::make_shared<ComposableResize>(t, keys, Shape3{size[0], size[1], size[2]});
    }
    return std::make_shared<DeterministicStep>(t);
  }
  return registry::kRandomTransforms.make(*row, json, arguments);
}

}  // namespace medfast::transforms

#undef MEDFAST_RANDOM_TRANSFORMS
