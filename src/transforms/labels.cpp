// LabelToRegions: nnU-Net v2's region-based training target (its ConvertSegmentationToRegions
// transform): a label of class indices becomes one channel per region, channel k holding 1
// where the voxel's label is among regions[k]. Regions may overlap (BraTS' whole tumor, tumor
// core, enhancing tumor), so the channels are masks for a sigmoid network, not one-hot classes.
//
// A minimal version for `plan`'s region runs (issue 54); the full transform of the other
// branch takes its place at merge (the same name and arguments: keys, regions).
#include <ATen/ATen.h>

#include <algorithm>

#include "medfast/core/error.hpp"
#include "medfast/core/fields.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

namespace {

struct LabelToRegionsOptions {
  std::vector<std::string> keys;
  std::vector<std::vector<std::int64_t>> regions;  ///< per output channel, the label values it holds
  static constexpr auto fields() {
    using O = LabelToRegionsOptions;
    return std::make_tuple(
        field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
        field("regions", &O::regions, "per output channel the label values it holds, e.g. [[1, 2, 3], [2, 3], [3]]")
            .must());
  }
};

class LabelToRegions final : public TransformWith<LabelToRegionsOptions> {
 public:
  explicit LabelToRegions(LabelToRegionsOptions o) : TransformWith("LabelToRegions", std::move(o)) {
    if (o_.regions.empty()) throw ValueError("LabelToRegions: argument regions: expected at least one region");
    for (std::size_t k = 0; k < o_.regions.size(); ++k) {
      if (o_.regions[k].empty())
        throw ValueError(str("LabelToRegions: argument regions[", k, "] lists no label value"));
    }
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      const at::Tensor& x = v.data;
      if (x.dim() != 4 || x.size(0) != 1) {
        throw FormatError(str("LabelToRegions: key '", key, "' has shape ", x.sizes(),
                              ": expected one channel of label values [1, X, Y, Z] (after EnsureChannelFirst)"));
      }
      std::vector<at::Tensor> channels;
      for (const auto& region : o_.regions) {
        at::Tensor in = at::zeros(x[0].sizes(), x.options().dtype(at::kBool));
        for (const std::int64_t value : region) in.logical_or_(x[0] == value);
        channels.push_back(in.to(at::kByte));
      }
      v.data = at::stack(channels);
    }
  }
};

}  // namespace

namespace registry {

TransformPtr label_to_regions(Args& a, const nlohmann::json&) {
  if (a.has("regions")) {  // said as what it is (the generic reader would say "a list of texts")
    const nlohmann::json& r = a.raw("regions");
    const auto values = [](const nlohmann::json& v) {
      return v.is_array() &&
             std::all_of(v.begin(), v.end(), [](const nlohmann::json& x) { return x.is_number_integer(); });
    };
    if (!r.is_array() || !std::all_of(r.begin(), r.end(), values)) {
      a.fail("regions",
             str("expected per region a list of label values, e.g. [[1, 2, 3], [2, 3], [3]]; got ", r.dump()));
    }
  }
  return std::make_shared<LabelToRegions>(read_options<LabelToRegionsOptions>(a));
}

}  // namespace registry

}  // namespace medfast::transforms
