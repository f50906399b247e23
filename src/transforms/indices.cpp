#include "medfast/transforms/indices.hpp"

#include <ATen/ATen.h>

#include "medfast/core/error.hpp"
#include "medfast/transforms/spatial.hpp"

namespace medfast::transforms {

at::Tensor mask_to_runs(const at::Tensor& mask) {
  // Runs are small and sampled on the host: computed on the CPU whatever the mask's device.
  const at::Tensor m = mask.to(at::kCPU).to(at::kBool).contiguous().view({-1});
  const auto n = m.numel();
  std::vector<std::int64_t> runs;
  const bool* p = m.data_ptr<bool>();
  std::int64_t i = 0;
  while (i < n) {
    while (i < n && !p[i]) ++i;
    if (i == n) break;
    const std::int64_t start = i;
    while (i < n && p[i]) ++i;
    runs.push_back(start);
    runs.push_back(i);
  }
  return at::tensor(runs, at::kLong).view({-1, 2});
}

std::int64_t runs_count(const at::Tensor& runs) {
  if (runs.numel() == 0) return 0;
  return (runs.select(1, 1) - runs.select(1, 0)).sum().item<std::int64_t>();
}

at::Tensor runs_to_indices(const at::Tensor& runs) {
  std::vector<at::Tensor> parts;
  for (std::int64_t r = 0; r < runs.size(0); ++r) {
    parts.push_back(at::arange(runs[r][0].item<std::int64_t>(), runs[r][1].item<std::int64_t>(), at::kLong));
  }
  return parts.empty() ? at::empty({0}, at::kLong) : at::cat(parts);
}

std::int64_t runs_index(const at::Tensor& runs, std::int64_t k) {
  if (!runs.is_cpu() || runs.scalar_type() != at::kLong || !runs.is_contiguous()) {
    return runs_index(runs.to(at::kCPU).to(at::kLong).contiguous(), k);
  }
  const auto* r = runs.data_ptr<std::int64_t>();
  const auto n = runs.size(0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = r[2 * i + 1] - r[2 * i];
    if (k < len) return r[2 * i] + k;
    k -= len;
  }
  throw ValueError(str("runs_index: index past the ", runs_count(runs), " indices held"));
}

namespace {

class FgBgToIndices final : public Transform {
 public:
  explicit FgBgToIndices(FgBgToIndicesOptions o) : o_(std::move(o)) {
    require_keys(o_.keys, "FgBgToIndices");
  }
  std::string name() const override { return "FgBgToIndices"; }
  nlohmann::json config() const override {
    return {{"keys", o_.keys},           {"image_key", o_.image_key},   {"image_threshold", o_.image_threshold},
            {"fg_postfix", o_.fg_postfix}, {"bg_postfix", o_.bg_postfix}, {"storage", "runs"}};
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      const Volume& label = s.volume(key);
      spatial_shape(label.data, key);
      const at::Tensor fg = (label.data > 0).any(0);
      at::Tensor bg = fg.logical_not();
      if (!o_.image_key.empty()) {
        const Volume& image = s.volume(o_.image_key);
        if (image.data.sizes().slice(1) != label.data.sizes().slice(1)) {
          throw ValueError(str("FgBgToIndices: ", o_.image_key, " and ", key, " differ in spatial shape"));
        }
        bg = bg.logical_and((image.data > o_.image_threshold).any(0));
      }
      s.arrays[key + o_.fg_postfix] = mask_to_runs(fg);
      s.arrays[key + o_.bg_postfix] = mask_to_runs(bg);
    }
  }

 private:
  FgBgToIndicesOptions o_;
};

}  // namespace

TransformPtr make_fg_bg_to_indices(const FgBgToIndicesOptions& o) { return std::make_shared<FgBgToIndices>(o); }

}  // namespace medfast::transforms
