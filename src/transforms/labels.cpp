// Label transforms: label values to region channels (LabelToRegions, medfast's, nnU-Net's
// regions; ConvertToMultiChannelBasedOnBratsClasses, MONAI's BraTS one) and MapLabelValue,
// with their entries in the transform table (registry.cpp).
//
// Region labels are uint8 [R, X, Y, Z] of 0 and 1 (MONAI's BraTS transform gives bool): the
// loader's batch gathers, the crops' and flips' copy kernels and the cache's stored labels
// take uint8 as they take the class labels medfast reads, while bool would fall back to
// libtorch copies in every loader thread. The values are the same; the losses and metrics
// take either (a sigmoid model's target: labels > 0).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "medfast/core/error.hpp"
#include "medfast/transforms/intensity.hpp"
#include "medfast/transforms/spatial.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

namespace {

/// The class label of `key` as [X, Y, Z]: one channel (MONAI squeezes a leading channel of 1).
at::Tensor class_label(const Sample& s, const std::string& key, const std::string& transform) {
  const at::Tensor x = s.volume(key).data;
  spatial_shape(x, key);
  if (x.size(0) != 1) {
    throw ValueError(str(transform, ": key ", key, " has ", x.size(0),
                         " channels; it maps a label of class values, one channel [1, X, Y, Z]"));
  }
  return x[0];
}

/// Whether `t` is a value of `type` (a whole number in its range, for integer types).
bool fits(double t, at::ScalarType type) {
  if (at::isFloatingType(type)) return std::isfinite(t);
  if (t != std::floor(t)) return false;
  switch (type) {
    case at::kBool:
      return t == 0 || t == 1;
    case at::kByte:
      return t >= 0 && t <= 255;
    case at::kChar:
      return t >= -128 && t <= 127;
    case at::kShort:
      return t >= -32768 && t <= 32767;
    case at::kInt:
      return t >= -2147483648.0 && t <= 2147483647.0;
    default:
      return std::fabs(t) < 9.2e18;
  }
}

/// Channel k of the output: the voxels whose value is one of regions[k].
at::Tensor regions_of(const at::Tensor& label, const std::vector<std::vector<std::int64_t>>& regions) {
  std::vector<at::Tensor> channels;
  channels.reserve(regions.size());
  for (const auto& region : regions) {
    at::Tensor in = at::zeros(label.sizes(), label.options().dtype(at::kBool));
    for (auto value : region) {
      // A value the label's type cannot hold is in no voxel (compared in that type, it would wrap).
      if (fits(static_cast<double>(value), label.scalar_type())) in.logical_or_(label == value);
    }
    channels.push_back(in);
  }
  return at::stack(channels).to(at::kByte);
}

struct LabelToRegionsOptions {
  std::vector<std::string> keys{"label"};
  /// Written back as a list of lists (one int stands for a list of one), so that the cache key
  /// is the same however a region was written.
  nlohmann::json regions;
  static constexpr auto fields() {
    using O = LabelToRegionsOptions;
    return std::make_tuple(
        field("keys", &O::keys, "the class labels it turns into regions: one key or a list").keys_or_default(),
        field("regions", &O::regions,
              "the label values of each region, as nnU-Net's dataset.json: [[1, 2, 3], [2, 3], [3]]; one output "
              "channel per region (1 where the label is one of its values), uint8")
            .must());
  }
};

class LabelToRegions final : public TransformWith<LabelToRegionsOptions> {
 public:
  LabelToRegions(LabelToRegionsOptions o, std::vector<std::vector<std::int64_t>> regions, std::string name)
      : TransformWith(std::move(name), std::move(o)), regions_(std::move(regions)) {}
  nlohmann::json config() const override {
    // ConvertToMultiChannelBasedOnBratsClasses has keys only: its regions are fixed.
    if (name_ != "LabelToRegions") return {{"keys", o_.keys}};
    return fields_json(o_);
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      v.data = regions_of(class_label(s, key, name_), regions_);
    }
  }

 private:
  std::vector<std::vector<std::int64_t>> regions_;
};

/// regions as read: a non-empty list, each an int or a non-empty list of ints.
std::vector<std::vector<std::int64_t>> parse_regions(Args& a, const nlohmann::json& given) {
  const auto fail = [&](const std::string& what) {
    a.fail("regions", str(what,
                          "; expected a list of regions, each a label value or a list of them, e.g. "
                          "[[1, 2, 3], [2, 3], [3]], got ",
                          given.dump()));
  };
  if (!given.is_array() || given.empty()) fail("no regions");
  const auto value_of = [&](const nlohmann::json& v, std::size_t k) {
    if (!v.is_number_integer() &&
        !(v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()))) {
      fail(str("region ", k, ": ", v.dump(), " is not a whole number"));
    }
    const std::string why = ConfigReader::range_problem<std::int64_t>(v);
    if (!why.empty()) fail(str("region ", k, ": ", why));
    return v.is_number_float() ? static_cast<std::int64_t>(v.get<double>()) : v.get<std::int64_t>();
  };
  std::vector<std::vector<std::int64_t>> regions;
  for (std::size_t k = 0; k < given.size(); ++k) {
    const nlohmann::json& r = given[k];
    std::vector<std::int64_t> values;
    if (r.is_array()) {
      if (r.empty()) fail(str("region ", k, " is empty"));
      for (const auto& v : r) values.push_back(value_of(v, k));
    } else {
      values.push_back(value_of(r, k));
    }
    regions.push_back(std::move(values));
  }
  return regions;
}

struct MapLabelValueOptions {
  std::vector<std::string> keys;
  std::vector<double> orig_labels;
  std::vector<double> target_labels;
  std::string dtype = "float32";  // MONAI's np.float32
  static constexpr auto fields() {
    using O = MapLabelValueOptions;
    return std::make_tuple(
        field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
        field("orig_labels", &O::orig_labels, "the label values to map").must(),
        field("target_labels", &O::target_labels, "what each of orig_labels becomes").must(),
        field("dtype", &O::dtype, "the output type; values not in orig_labels are kept, cast to it"));
  }
};

// MONAI 1.3.2's MapLabelValue: the label cast to dtype, then each pair (o, t) with o != t in
// order sets t where the input (not the output so far) equals o.
class MapLabelValue final : public TransformWith<MapLabelValueOptions> {
 public:
  explicit MapLabelValue(MapLabelValueOptions o) : TransformWith("MapLabelValue", std::move(o)) {
    if (o_.orig_labels.size() != o_.target_labels.size()) {
      throw ValueError(str("MapLabelValue: arguments orig_labels and target_labels must have the same length (",
                           o_.orig_labels.size(), " and ", o_.target_labels.size(), ")"));
    }
    type_ = parse_dtype(o_.dtype, "MapLabelValue: argument dtype");
    for (std::size_t i = 0; i < o_.orig_labels.size(); ++i) {
      const double t = o_.target_labels[i];
      if (!fits(t, type_)) {
        throw ValueError(str("MapLabelValue: argument target_labels: ", t, " does not fit dtype ", o_.dtype));
      }
      if (o_.orig_labels[i] != t) pairs_.emplace_back(o_.orig_labels[i], t);
    }
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      const at::Tensor in = v.data;
      at::Tensor out = in.to(type_, /*non_blocking=*/false, /*copy=*/true);
      for (const auto& [from, to] : pairs_) out.masked_fill_(in == from, to);
      v.data = out;
    }
  }

 private:
  at::ScalarType type_;
  std::vector<std::pair<double, double>> pairs_;
};

struct BratsOptions {
  std::vector<std::string> keys;
  static constexpr auto fields() {
    using O = BratsOptions;
    return std::make_tuple(field("keys", &O::keys,
                                 "the BraTS labels (1 necrotic core, 2 edema, 4 enhancing) it turns into TC (1|4), WT "
                                 "(1|2|4), ET (4): uint8")
                               .keys());
  }
};

}  // namespace

// The entries of the transform table (registry.cpp).
namespace registry {

TransformPtr label_to_regions(Args& a, const nlohmann::json&) {
  LabelToRegionsOptions o = read_options<LabelToRegionsOptions>(a);
  auto regions = parse_regions(a, o.regions);
  o.regions = nlohmann::json(regions);  // canonical: a list of lists
  return std::make_shared<LabelToRegions>(std::move(o), std::move(regions), "LabelToRegions");
}

TransformPtr convert_to_multi_channel_based_on_brats_classes(Args& a, const nlohmann::json&) {
  const BratsOptions b = read_options<BratsOptions>(a);
  LabelToRegionsOptions o;
  o.keys = b.keys;
  return std::make_shared<LabelToRegions>(std::move(o), std::vector<std::vector<std::int64_t>>{{1, 4}, {1, 2, 4}, {4}},
                                          "ConvertToMultiChannelBasedOnBratsClasses");
}

TransformPtr map_label_value(Args& a, const nlohmann::json&) {
  return std::make_shared<MapLabelValue>(read_options<MapLabelValueOptions>(a));
}

}  // namespace registry

}  // namespace medfast::transforms
