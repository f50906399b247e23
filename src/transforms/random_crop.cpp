// The index-space random transforms: RandCropByPosNegLabel, RandSpatialCrop, RandFlip and
// RandRotate90, with their entries in the random table (random_registry.cpp).
#include "medfast/transforms/random.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "medfast/core/error.hpp"
#include "medfast/transforms/indices.hpp"
#include "random_families.hpp"

namespace medfast::transforms {

namespace {

// The arguments as written (MONAI's names and defaults), declared once: the entries read
// them, the docs list them (random_argument_docs).
struct RandCropByPosNegLabelOptions {
  std::vector<std::string> keys;
  std::string label_key = "label";
  Shape3 spatial_size{};
  double pos = 1, neg = 1;
  std::int64_t num_samples = 1;
  std::string fg_indices_key, bg_indices_key;
  bool allow_smaller = false;
  std::string image_key;       // MONAI's: background above image_threshold (use FgBgToIndices' image_key)
  double image_threshold = 0;  // accepted, as MONAI's, for configs written for it
  static constexpr auto fields() {
    using O = RandCropByPosNegLabelOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("label_key", &O::label_key, "the label the foreground is read from"),
                           field("spatial_size", &O::spatial_size, "crop size: one whole number or three").repeats(3).must(),
                           field("pos", &O::pos, "weight of crops centred on foreground"),
                           field("neg", &O::neg, "weight of crops centred on background"),
                           field("num_samples", &O::num_samples, "crops per item"),
                           field("fg_indices_key", &O::fg_indices_key, "FgBgToIndices' foreground output (empty: computed)"),
                           field("bg_indices_key", &O::bg_indices_key, "FgBgToIndices' background output (empty: computed)"),
                           field("allow_smaller", &O::allow_smaller, "a crop larger than the image is cut to it"),
                           field("image_key", &O::image_key, "accepted for MONAI configs; FgBgToIndices' image_key applies"),
                           field("image_threshold", &O::image_threshold, "accepted for MONAI configs (see image_key)"));
  }
};
struct RandSpatialCropOptions {
  std::vector<std::string> keys;
  Shape3 roi_size{};
  std::vector<std::int64_t> max_roi_size;  // empty: MONAI's None (the image's size)
  bool random_center = true;
  bool random_size = false;  // MONAI 1.3's default (it was true before MONAI 1.1)
  static constexpr auto fields() {
    using O = RandSpatialCropOptions;
    return std::make_tuple(
        field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
        field("roi_size", &O::roi_size,
              "crop size (with random_size: the smallest), one whole number or three; <= 0: the image's size")
            .repeats(3)
            .must(),
        field("max_roi_size", &O::max_roi_size,
              "with random_size: the largest crop size, one whole number or three; absent or <= 0: the image's size")
            .repeats(3)
            .written_when_set(),
        field("random_center", &O::random_center, "crop at a random position (false: at the image's centre)"),
        field("random_size", &O::random_size, "draw each axis' size from roi_size..max_roi_size"));
  }
};
struct RandFlipOptions {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::vector<std::int64_t> spatial_axis{0, 1, 2};
  static constexpr auto fields() {
    using O = RandFlipOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"),
                           field("spatial_axis", &O::spatial_axis, "the axes flipped together: one or a list (absent: all)").repeats(1));
  }
};
struct RandRotate90Options {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::int64_t max_k = 3;
  std::array<std::int64_t, 2> spatial_axes{0, 1};
  static constexpr auto fields() {
    using O = RandRotate90Options;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"), field("max_k", &O::max_k, "quarter turns drawn from 1..max_k"),
                           field("spatial_axes", &O::spatial_axes, "the plane of the turns: two axes").repeats(2));
  }
};

using detail::require;

class RandCropByPosNegLabel final : public RandomWith<RandCropByPosNegLabelOptions> {
 public:
  explicit RandCropByPosNegLabel(RandCropByPosNegLabelOptions o) : RandomWith("RandCropByPosNegLabel", std::move(o)) {
    require(o_.pos >= 0 && o_.neg >= 0 && o_.pos + o_.neg > 0,
            "RandCropByPosNegLabel: arguments pos and neg must be non-negative and not both zero");
    require(o_.num_samples >= 1, "RandCropByPosNegLabel: argument num_samples must be at least 1");
    for (auto v : o_.spatial_size) require(v >= 1, "RandCropByPosNegLabel: argument spatial_size must be positive");
  }
  std::size_t samples() const override { return static_cast<std::size_t>(o_.num_samples); }
  bool expands() const override { return true; }
  // num_samples crops: each key of keys at spatial_size (cut to the image with
  // allow_smaller), the sample's other volumes as they are; in their dtypes.
  Expansion expansion(const Sample& s) const override {
    long double each = kSampleOverheadBytes;
    std::string parts;
    for (const auto& [key, v] : s.volumes) {
      if (v.data.dim() != 4) continue;  // a wrong shape is expand()'s error to name
      const bool cropped = std::find(o_.keys.begin(), o_.keys.end(), key) != o_.keys.end();
      std::array<std::int64_t, 4> shape{v.data.size(0), v.data.size(1), v.data.size(2), v.data.size(3)};
      if (cropped) {
        for (int a = 0; a < 3; ++a) shape[a + 1] = o_.allow_smaller ? std::min(o_.spatial_size[a], shape[a + 1]) : o_.spatial_size[a];
      }
      long double bytes = static_cast<long double>(v.data.element_size());
      for (auto n : shape) bytes *= static_cast<long double>(n);
      each += bytes;
      parts += str(parts.empty() ? "" : ", ", key, " [", shape[0], ", ", shape[1], ", ", shape[2], ", ", shape[3], "] ",
                   v.data.scalar_type());
    }
    return {each * static_cast<long double>(o_.num_samples),
            str("num_samples ", o_.num_samples, " crops (each ", parts, ")")};
  }
  void apply(Sample&, Rng&) const override { throw Error("RandCropByPosNegLabel: internal error: apply() on an expanding transform"); }

  std::vector<Sample> expand(const Sample& s, Rng& rng) const override {
    const Shape3 n = spatial_shape(s.volume(o_.label_key).data, o_.label_key);
    at::Tensor fg, bg;
    if (!o_.fg_indices_key.empty()) {
      if (!s.arrays.count(o_.fg_indices_key)) {  // a misspelt key must not silently recompute every sample
        std::string have;
        for (const auto& [k, v] : s.arrays) have += (have.empty() ? "" : ", ") + k;
        throw ValueError(str("RandCropByPosNegLabel: fg_indices_key '", o_.fg_indices_key,
                             "' is not in the sample (its index arrays: ", have.empty() ? "none" : have,
                             "); FgBgToIndices in the deterministic chain writes <key>_fg_indices and "
                             "<key>_bg_indices (or its fg_postfix/bg_postfix)"));
      }
      fg = s.arrays.at(o_.fg_indices_key);
      require(s.arrays.count(o_.bg_indices_key) > 0,
              str("RandCropByPosNegLabel: the sample has ", o_.fg_indices_key, " but no ", o_.bg_indices_key));
      bg = s.arrays.at(o_.bg_indices_key);
    } else {  // no cached indices: compute them (slower; put FgBgToIndices in the cached chain)
      const at::Tensor label = (foreground_channels(s.volume(o_.label_key).data) > 0).any(0);
      fg = mask_to_runs(label);
      bg = mask_to_runs(label.logical_not());
    }
    fg = fg.contiguous();  // cached runs are int32 or int64: read as they are, not converted per sample
    bg = bg.contiguous();
    const std::int64_t n_fg = runs_count(fg), n_bg = runs_count(bg);
    require(n_fg + n_bg > 0, "RandCropByPosNegLabel: the label has neither foreground nor background indices");
    Shape3 size = o_.spatial_size;
    for (int a = 0; a < 3; ++a) {
      if (size[a] > n[a]) {
        require(o_.allow_smaller, str("RandCropByPosNegLabel: spatial_size ", size[0], "x", size[1], "x", size[2],
                                      " is larger than the image ", n[0], "x", n[1], "x", n[2],
                                      " (set allow_smaller: true, or pad with ResizeWithPadOrCrop/SpatialPad first)"));
        size[a] = n[a];
      }
    }
    const double pos_ratio = o_.pos / (o_.pos + o_.neg);
    std::vector<Sample> out;
    for (std::int64_t k = 0; k < o_.num_samples; ++k) {
      const bool use_fg = n_bg == 0 || (n_fg > 0 && rng.uniform() < pos_ratio);
      const at::Tensor& runs = use_fg ? fg : bg;
      const std::int64_t flat = runs_index(runs, rng.integer(0, (use_fg ? n_fg : n_bg) - 1));
      const std::int64_t center[3] = {flat / (n[1] * n[2]), (flat / n[2]) % n[1], flat % n[2]};
      Shape3 start{}, end{};
      for (int a = 0; a < 3; ++a) {
        // MONAI's correct_crop_centers: keep the ROI inside the image.
        const std::int64_t lo = size[a] / 2;
        std::int64_t hi = static_cast<std::int64_t>(static_cast<double>(n[a] + 1) - size[a] / 2.0);
        if (hi == lo) ++hi;
        const std::int64_t c = std::min(std::max(center[a], lo), hi - 1);
        start[a] = c - size[a] / 2;
        end[a] = start[a] + size[a];
      }
      Sample crop = s;
      crop_or_pad(crop, o_.keys, start, end, 0.0, /*compact=*/false);  // a view until a later copy
      crop.arrays.erase(o_.fg_indices_key);
      crop.arrays.erase(o_.bg_indices_key);
      out.push_back(std::move(crop));
    }
    return out;
  }
};

// MONAI 1.3.2's RandSpatialCrop: roi_size (its non-positive axes: the image's size), with
// random_size each axis' size drawn from roi_size..max_roi_size (then cut to the image), and
// the crop at a random position (random_center) or at the centre as CenterSpatialCrop puts it.
class RandSpatialCrop final : public RandomWith<RandSpatialCropOptions> {
 public:
  explicit RandSpatialCrop(RandSpatialCropOptions o) : RandomWith("RandSpatialCrop", std::move(o)) {
    require(o_.max_roi_size.empty() || o_.max_roi_size.size() == 3,
            str("RandSpatialCrop: argument max_roi_size: expected one whole number or three, got ",
                o_.max_roi_size.size()));
  }
  void apply(Sample& s, Rng& rng) const override {
    const Shape3 n = spatial_shape(s.volume(o_.keys[0]).data, o_.keys[0]);
    Shape3 size{};
    for (int a = 0; a < 3; ++a) size[a] = o_.roi_size[a] > 0 ? o_.roi_size[a] : n[a];  // fall_back_tuple
    if (o_.random_size) {
      Shape3 most = n;
      for (int a = 0; a < 3 && !o_.max_roi_size.empty(); ++a) {
        if (o_.max_roi_size[static_cast<std::size_t>(a)] > 0) most[a] = o_.max_roi_size[static_cast<std::size_t>(a)];
      }
      for (int a = 0; a < 3; ++a) {
        require(size[a] <= most[a], str("RandSpatialCrop: min ROI size ", size[0], "x", size[1], "x", size[2],
                                        " is larger than max ROI size ", most[0], "x", most[1], "x", most[2],
                                        " (roi_size, max_roi_size; the image is ", n[0], "x", n[1], "x", n[2], ")"));
      }
      for (int a = 0; a < 3; ++a) size[a] = rng.integer(size[a], most[a]);
    }
    Shape3 start{}, end{};
    for (int a = 0; a < 3; ++a) {
      const std::int64_t cut = std::min(size[a], n[a]);
      if (o_.random_center) {
        start[a] = rng.integer(0, n[a] - cut);
      } else {  // CenterSpatialCrop: from max(n // 2 - size // 2, 0)
        start[a] = std::max<std::int64_t>(n[a] / 2 - size[a] / 2, 0);
      }
      end[a] = start[a] + cut;
    }
    crop_or_pad(s, o_.keys, start, end, 0.0, /*compact=*/false);
  }
};

class RandFlip final : public RandomWith<RandFlipOptions> {
 public:
  explicit RandFlip(RandFlipOptions o) : RandomWith("RandFlip", std::move(o)) {
    for (auto a : o_.spatial_axis) require(a >= 0 && a < 3, str("RandFlip: argument spatial_axis: ", a, " is not 0, 1 or 2"));
  }
  void apply(Sample& s, Rng& rng) const override {
    if (!(rng.uniform() < o_.prob)) return;
    for (auto a : o_.spatial_axis) flip_axis(s, o_.keys, static_cast<int>(a));
  }
  bool index_step() const override { return true; }
  bool compose_index(IndexPlan& plan, const Sample& s, Rng& rng) const override {
    for (const auto& key : o_.keys) (void)s.volume(key);  // a missing key fails as apply() would
    if (!(rng.uniform() < o_.prob)) return true;
    for (const auto& key : o_.keys) {
      for (auto a : o_.spatial_axis) plan.flip(key, static_cast<int>(a));
    }
    return true;
  }
};

class RandRotate90 final : public RandomWith<RandRotate90Options> {
 public:
  explicit RandRotate90(RandRotate90Options o)
      : RandomWith("RandRotate90", std::move(o)),
        a_(static_cast<int>(o_.spatial_axes[0])),
        b_(static_cast<int>(o_.spatial_axes[1])) {
    require(o_.max_k >= 1, "RandRotate90: argument max_k must be at least 1");
    require(a_ != b_ && a_ >= 0 && a_ < 3 && b_ >= 0 && b_ < 3,
            "RandRotate90: argument spatial_axes must be two different axes of 0, 1, 2");
  }
  void apply(Sample& s, Rng& rng) const override {
    // MONAI draws k (1..max_k) before deciding whether to rotate.
    const int k = static_cast<int>(rng.integer(0, o_.max_k - 1)) + 1;
    if (!(rng.uniform() < o_.prob)) return;
    rot90(s, o_.keys, k, a_, b_);
  }
  bool index_step() const override { return true; }
  bool compose_index(IndexPlan& plan, const Sample& s, Rng& rng) const override {
    for (const auto& key : o_.keys) (void)s.volume(key);
    const int k = static_cast<int>(rng.integer(0, o_.max_k - 1)) + 1;
    if (!(rng.uniform() < o_.prob)) return true;
    for (const auto& key : o_.keys) plan.rot90(key, k, a_, b_);
    return true;
  }

 private:
  int a_, b_;  // the plane of the turns
};

}  // namespace

// Entries of the random transform table (random_registry.cpp).
namespace registry {

RandomTransformPtr rand_crop_by_pos_neg_label(Args& a, const nlohmann::json&) { return made<RandCropByPosNegLabel>(a); }
RandomTransformPtr rand_spatial_crop(Args& a, const nlohmann::json&) { return made<RandSpatialCrop>(a); }
RandomTransformPtr rand_flip(Args& a, const nlohmann::json&) { return made<RandFlip>(a); }
RandomTransformPtr rand_rotate90(Args& a, const nlohmann::json&) { return made<RandRotate90>(a); }

}  // namespace registry

}  // namespace medfast::transforms
