// nnU-Net v2's planning rules (nnunetv2/experiment_planning/experiment_planners/
// default_experiment_planner.py, network_topology.py, dataset_fingerprint/, preprocessing/
// normalization/), restated; tests/golden/nnunet_rules.py states them again in numpy.
#include "medfast/plan/rules.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <numeric>

#include "medfast/core/error.hpp"
#include "medfast/core/stats.hpp"

namespace medfast::plan {

namespace {

using Size = std::array<double, 3>;  // sizes may be x.5 (medians of an even number of cases)

// Python's round() of a float: half to even (the default rounding mode's nearbyint).
double round_half_even(double v) {
  const int mode = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double r = std::nearbyint(v);
  std::fesetround(mode);
  return r;
}

// pad_shape: each size rounded up to a multiple of its divisor (kept where it is one), as int.
Shape pad_shape(const Size& size, const Shape& divisor) {
  Shape out{};
  for (int d = 0; d < 3; ++d) {
    const double rem = std::fmod(size[d], static_cast<double>(divisor[d]));
    out[d] = static_cast<std::int64_t>(rem == 0 ? size[d] : size[d] + static_cast<double>(divisor[d]) - rem);
  }
  return out;
}

Topology pool_and_conv_sized(const Spacing& spacing, const Size& size, std::int64_t min_fm, std::int64_t max_pools) {
  Spacing sp = spacing;
  Size sz = size;
  Topology t;
  t.strides.push_back({1, 1, 1});
  Shape pools{0, 0, 0}, kernel{1, 1, 1};
  const double min_size = 2.0 * static_cast<double>(min_fm);
  while (true) {
    std::vector<int> valid;
    for (int d = 0; d < 3; ++d) {
      if (sz[d] >= min_size) valid.push_back(d);
    }
    if (valid.empty()) break;
    double finest = sp[static_cast<std::size_t>(valid[0])];
    for (const int d : valid) finest = std::min(finest, sp[d]);
    std::vector<int> pooled;
    for (const int d : valid) {
      if (sp[d] / finest < 2 && pools[d] < max_pools) pooled.push_back(d);
    }
    if (pooled.size() == 1 && sz[pooled[0]] < 3.0 * static_cast<double>(min_fm)) break;
    if (pooled.empty()) break;
    const double finest_all = *std::min_element(sp.begin(), sp.end());
    for (int d = 0; d < 3; ++d) {
      if (kernel[d] != 3 && sp[d] / finest_all < 2) kernel[d] = 3;
    }
    Shape stride{1, 1, 1};
    for (const int d : pooled) {
      stride[d] = 2;
      ++pools[d];
      sp[d] *= 2;
      sz[d] = std::ceil(sz[d] / 2);
    }
    t.strides.push_back(stride);
    t.kernels.push_back(kernel);
  }
  t.kernels.push_back({3, 3, 3});
  for (int d = 0; d < 3; ++d) t.divisor[d] = std::int64_t{1} << pools[d];
  t.patch = pad_shape(size, t.divisor);
  return t;
}

// The coarsest axis as nnU-Net's np.argmax finds it in its (z, y, x) arrays: of equal
// spacings, the last in x, y, z.
int coarsest_axis(const Spacing& s) {
  int worst = 2;
  for (int d = 1; d >= 0; --d) {
    if (s[d] > s[worst]) worst = d;
  }
  return worst;
}

Size as_size(const Shape& s) { return {static_cast<double>(s[0]), static_cast<double>(s[1]), static_cast<double>(s[2])}; }

}  // namespace

double percentile(std::vector<double> values, double q) {
  if (values.empty()) throw ValueError("percentile: no values");
  if (!(q >= 0 && q <= 100)) throw ValueError(str("percentile: q ", q, " is outside [0, 100]"));
  return numpy_percentile(values, q);
}

Spacing target_spacing(const std::vector<Spacing>& spacings, const std::vector<Shape>& shapes_after_crop) {
  if (spacings.empty() || spacings.size() != shapes_after_crop.size()) {
    throw ValueError(str("target spacing: ", spacings.size(), " spacings and ", shapes_after_crop.size(),
                         " shapes; expected one of each per case, at least one case"));
  }
  Spacing target{};
  Size size{};
  for (int d = 0; d < 3; ++d) {
    std::vector<double> sp, sz;
    for (std::size_t c = 0; c < spacings.size(); ++c) {
      sp.push_back(spacings[c][d]);
      sz.push_back(static_cast<double>(shapes_after_crop[c][d]));
    }
    target[d] = percentile(sp, 50);
    size[d] = percentile(sz, 50);
  }
  const int worst = coarsest_axis(target);
  double other_spacing = 0, other_size = 0;
  bool first = true;
  for (int d = 0; d < 3; ++d) {
    if (d == worst) continue;
    other_spacing = first ? target[d] : std::max(other_spacing, target[d]);
    other_size = first ? size[d] : std::min(other_size, size[d]);
    first = false;
  }
  const bool aniso_spacing = target[worst] > kAnisotropyThreshold * other_spacing;
  const bool aniso_voxels = size[worst] * kAnisotropyThreshold < other_size;
  if (aniso_spacing && aniso_voxels) {
    std::vector<double> axis;
    for (const auto& s : spacings) axis.push_back(s[worst]);
    double t = percentile(axis, 10);
    if (t < other_spacing) t = std::max(other_spacing, t) + 1e-5;
    target[worst] = t;
  }
  return target;
}

Topology pool_and_conv(const Spacing& spacing, const Shape& size, std::int64_t min_feature_map, std::int64_t max_pools) {
  return pool_and_conv_sized(spacing, as_size(size), min_feature_map, max_pools);
}

std::vector<std::int64_t> stage_features(std::size_t stages, std::int64_t base, std::int64_t max) {
  std::vector<std::int64_t> f;
  for (std::size_t i = 0; i < stages; ++i) f.push_back(std::min(max, base << i));
  return f;
}

double feature_map_elements(const Topology& t, const std::vector<std::int64_t>& features, std::int64_t classes) {
  if (features.size() != t.stages()) {
    throw ValueError(str("feature map estimate: ", features.size(), " feature counts for ", t.stages(), " stages"));
  }
  Shape s = t.patch;
  double total = 0;
  std::vector<double> voxels;
  for (std::size_t k = 0; k < t.stages(); ++k) {
    for (int d = 0; d < 3; ++d) s[d] /= t.strides[k][d];
    voxels.push_back(static_cast<double>(s[0]) * static_cast<double>(s[1]) * static_cast<double>(s[2]));
    total += 2.0 * static_cast<double>(features[k]) * voxels.back();  // encoder: 2 convolutions
  }
  for (std::size_t k = 0; k + 1 < t.stages(); ++k) {
    total += 3.0 * static_cast<double>(features[k]) * voxels[k];  // decoder: 2 convolutions + the transposed one
  }
  return total + static_cast<double>(classes) * voxels[0];
}

Spacing resampled_median_shape(const std::vector<Spacing>& spacings, const std::vector<Shape>& shapes,
                               const Spacing& target) {
  if (spacings.empty() || spacings.size() != shapes.size()) throw ValueError("median shape: one spacing and shape per case");
  Spacing out{};
  for (int d = 0; d < 3; ++d) {
    std::vector<double> v;
    for (std::size_t c = 0; c < shapes.size(); ++c) {
      v.push_back(round_half_even(spacings[c][d] / target[d] * static_cast<double>(shapes[c][d])));
    }
    out[d] = percentile(v, 50);
  }
  return out;
}

Shape resampled_max_shape(const std::vector<Spacing>& spacings, const std::vector<Shape>& shapes,
                          const Spacing& target) {
  if (spacings.empty() || spacings.size() != shapes.size())
    throw ValueError("largest shape: one spacing and shape per case");
  Shape out{1, 1, 1};
  for (std::size_t c = 0; c < shapes.size(); ++c) {
    for (int d = 0; d < 3; ++d) {
      const double r = spacings[c][d] / target[d], n = static_cast<double>(shapes[c][d]);
      const double either = std::max(round_half_even(r * n), round_half_even((n - 1) * r + 1));
      out[d] = std::max(out[d], static_cast<std::int64_t>(either));
    }
  }
  return out;
}

namespace {

PatchPlan plan_patch_ordered(const Spacing& spacing, const Spacing& median_shape, double dataset_voxels,
                             const StepModel& memory) {
  for (int d = 0; d < 3; ++d) {
    if (!(spacing[d] > 0) || !(median_shape[d] >= 1)) {
      throw ValueError(str("patch plan: spacing and median shape must be positive (axis ", d, ": ", spacing[d], ", ",
                           median_shape[d], ")"));
    }
  }
  const Spacing inv{1 / spacing[0], 1 / spacing[1], 1 / spacing[2]};
  const double scale = std::pow(256.0 * 256.0 * 256.0 / (inv[0] * inv[1] * inv[2]), 1.0 / 3);  // Python's ** (1/3)
  Size init{};
  for (int d = 0; d < 3; ++d) init[d] = std::min(round_half_even(inv[d] * scale), median_shape[d]);
  PatchPlan p;
  p.topology = pool_and_conv_sized(spacing, init, 4, 999999);
  const auto features_of = [&](const Topology& t) {
    return stage_features(t.stages(), memory.base_features, memory.max_features);
  };
  p.features = features_of(p.topology);
  const std::int64_t ref_bs = 2;  // the loop fits a batch of 2 (nnU-Net's reference batch size)
  p.estimate = memory.cost(p.topology, p.features, ref_bs);
  const auto macs = [&](std::int64_t batch) {
    return memory.compute ? memory.compute(p.topology, p.features, batch) : 0.0;
  };
  while (p.estimate > memory.budget || macs(ref_bs) > memory.compute_budget) {
    int axis = 0;
    double worst = -1;
    for (int d = 0; d < 3; ++d) {  // the largest patch / median ratio; ties: the last axis
      const double r = static_cast<double>(p.topology.patch[d]) / median_shape[d];
      if (r >= worst) worst = r, axis = d;
    }
    Shape smaller = p.topology.patch;
    smaller[axis] -= p.topology.divisor[axis];
    const Shape divisor = pool_and_conv(spacing, smaller).divisor;
    Shape patch = p.topology.patch;
    patch[axis] -= divisor[axis];
    if (patch[axis] < 1) {
      if (p.estimate > memory.budget) {
        const auto text = [&](double v) { return memory.describe ? memory.describe(v) : str(v); };
        throw ValueError(str("patch plan: no patch fits the memory budget (", text(memory.budget),
                             "; the smallest tried needs ", text(p.estimate), " for a batch of 2)"));
      }
      throw ValueError(str("patch plan: no patch fits the compute budget (", memory.compute_budget / 1e9,
                           " GMAC a training step; the smallest tried needs ", macs(ref_bs) / 1e9,
                           " GMAC for a batch of 2)"));
    }
    p.topology = pool_and_conv(spacing, patch);
    p.features = features_of(p.topology);
    p.estimate = memory.cost(p.topology, p.features, ref_bs);
  }
  const double patch_voxels = static_cast<double>(p.topology.patch[0]) * static_cast<double>(p.topology.patch[1]) *
                              static_cast<double>(p.topology.patch[2]);
  const double fixed = memory.cost(p.topology, p.features, 0);
  const double per_sample = memory.cost(p.topology, p.features, 1) - fixed;
  const double fits = (memory.budget - fixed) / per_sample;
  const double by_memory = memory.round_batch ? round_half_even(fits) : std::floor(fits);
  const double by_dataset = round_half_even(dataset_voxels * 0.05 / patch_voxels);
  const double by_compute = memory.compute ? std::floor(memory.compute_budget / macs(1)) : by_dataset;
  p.batch_size = static_cast<std::int64_t>(std::max(std::min({by_memory, by_dataset, by_compute}), 2.0));
  p.cost = memory.cost(p.topology, p.features, p.batch_size);
  return p;
}

template <typename T>
std::array<T, 3> permuted(const std::array<T, 3>& a, const std::array<int, 3>& order) {
  return {a[order[0]], a[order[1]], a[order[2]]};
}
template <typename T>
std::array<T, 3> unpermuted(const std::array<T, 3>& a, const std::array<int, 3>& order) {
  std::array<T, 3> out{};
  for (int i = 0; i < 3; ++i) out[order[i]] = a[i];
  return out;
}

}  // namespace

StepModel nnunet_memory_model(std::int64_t classes, double reference) {
  StepModel m;
  m.cost = [classes](const Topology& t, const std::vector<std::int64_t>& features, std::int64_t batch) {
    return feature_map_elements(t, features, classes) * static_cast<double>(batch) / 2;
  };
  m.budget = reference;
  m.round_batch = true;
  m.describe = [](double v) { return str(v, " feature-map elements"); };
  return m;
}

PatchPlan plan_patch(const Spacing& spacing, const Spacing& median_shape, std::int64_t classes, double dataset_voxels,
                     double reference) {
  return plan_patch(spacing, median_shape, dataset_voxels, nnunet_memory_model(classes, reference));
}

PatchPlan plan_patch(const Spacing& spacing, const Spacing& median_shape, double dataset_voxels,
                     const StepModel& memory) {
  // nnU-Net plans with the coarsest axis first (its transpose_forward), the others in its
  // array order, z, y, x.
  const int worst = coarsest_axis(spacing);
  std::array<int, 3> order{worst, 0, 0};
  for (int d = 2, k = 1; d >= 0; --d) {
    if (d != worst) order[k++] = d;
  }
  PatchPlan p = plan_patch_ordered(permuted(spacing, order), permuted(median_shape, order), dataset_voxels, memory);
  Topology& t = p.topology;
  for (auto& s : t.strides) s = unpermuted(s, order);
  for (auto& k : t.kernels) k = unpermuted(k, order);
  t.divisor = unpermuted(t.divisor, order);
  t.patch = unpermuted(t.patch, order);
  return p;
}

Normalization normalization_for(const std::string& channel_name) {
  return parse_choice<Normalization>(channel_name).value_or(Normalization::zscore);
}

bool use_mask_for_norm(Normalization scheme, double median_relative_size_after_crop) {
  return median_relative_size_after_crop < 0.75 && scheme == Normalization::zscore;
}

IntensityStats intensity_stats(const std::vector<double>& pooled) {
  if (pooled.empty()) throw ValueError("intensity statistics: no foreground samples");
  IntensityStats s;
  const double n = static_cast<double>(pooled.size());
  s.mean = std::accumulate(pooled.begin(), pooled.end(), 0.0) / n;
  double sq = 0;
  for (const double v : pooled) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / n);  // numpy's std: ddof 0
  const auto [lo, hi] = std::minmax_element(pooled.begin(), pooled.end());
  s.min = *lo;
  s.max = *hi;
  s.median = percentile(pooled, 50);
  s.p00_5 = percentile(pooled, 0.5);
  s.p99_5 = percentile(pooled, 99.5);
  return s;
}

}  // namespace medfast::plan
