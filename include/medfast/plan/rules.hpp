#pragma once
/// \file
/// nnU-Net v2's planning rules (its default ExperimentPlanner, 3d_fullres), as pure functions
/// of a dataset fingerprint, so that each rule is pinned by tests on hand-made fingerprints
/// (tests/golden/nnunet_rules.py states them again, independently, in numpy). The fingerprint
/// reader and `medfast plan` build on these (issue 23); docs/plan.md gives each rule's source
/// and reason.
///
/// Axes are the image's (x, y, z). nnU-Net reads NIfTI with SimpleITK, whose arrays are
/// (z, y, x): where it breaks ties by numpy's order in those arrays, so do these (the
/// coarsest of equal axes is the last in x, y, z; the others are planned z, y, x).
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "medfast/core/choices.hpp"

namespace medfast::plan {

using Spacing = std::array<double, 3>;
using Shape = std::array<std::int64_t, 3>;

/// numpy.percentile(values, q) with its default linear interpolation (q in [0, 100]).
/// ValueError for no values or q outside [0, 100].
double percentile(std::vector<double> values, double q);

/// nnU-Net's ANISO_THRESHOLD.
constexpr double kAnisotropyThreshold = 3.0;

/// determine_fullres_target_spacing: the per-axis median spacing; where the coarsest axis is
/// more than 3x coarser than the others and has fewer than a third of their voxels (median
/// shapes after cropping), that axis takes the 10th percentile of its spacings instead, but
/// no finer than the other axes (then their largest + 1e-5). ValueError for no cases or
/// mismatched lists.
Spacing target_spacing(const std::vector<Spacing>& spacings, const std::vector<Shape>& shapes_after_crop);

/// get_pool_and_conv_props: the network's stages for a patch of `size` at `spacing`. Axes are
/// pooled (stride 2) while their feature map keeps at least 2 * min_feature_map voxels and
/// their spacing is less than twice the finest pooled one; a kernel becomes 3 (from 1) once
/// an axis' spacing is less than twice the finest. `strides[0]` is [1, 1, 1]; the last
/// kernel (bottleneck) is 3 everywhere; `patch` is `size` rounded up to a multiple of
/// `divisor` (2^pools per axis).
struct Topology {
  std::vector<Shape> strides;  ///< per stage
  std::vector<Shape> kernels;  ///< per stage
  Shape divisor{};             ///< the patch must be divisible by this
  Shape patch{};
  std::size_t stages() const { return strides.size(); }
};
Topology pool_and_conv(const Spacing& spacing, const Shape& size, std::int64_t min_feature_map = 4,
                       std::int64_t max_pools = 999999);

/// nnU-Net's channels per stage: min(32 * 2^stage, 320).
std::vector<std::int64_t> stage_features(std::size_t stages, std::int64_t base = 32, std::int64_t max = 320);

/// nnU-Net's memory proxy (PlainConvUNet.compute_conv_feature_map_size, 2 convolutions per
/// stage): feature-map elements of one sample, encoder 2 * F_k * voxels_k per stage, decoder
/// 3 * F_k * voxels_k per stage above the bottleneck, plus the output's classes * voxels.
double feature_map_elements(const Topology& topology, const std::vector<std::int64_t>& features,
                            std::int64_t classes);

/// The median over cases of each case's shape at `target` spacing (round(spacing / target *
/// shape), half to even, per axis): what the patch is planned for.
Spacing resampled_median_shape(const std::vector<Spacing>& spacings, const std::vector<Shape>& shapes,
                               const Spacing& target);
/// The largest case per axis at `target` spacing, as either rule rounds a case's shape there
/// (nnU-Net's round(spacing / target * n), medfast's and MONAI's Spacing round((n - 1) *
/// spacing / target + 1)): the case the sliding window's case-sized buffers are planned for.
/// ValueError for no cases or mismatched lists.
Shape resampled_max_shape(const std::vector<Spacing>& spacings, const std::vector<Shape>& shapes,
                          const Spacing& target);

/// The 3d_fullres patch and batch size (get_plans_for_configuration): an initial patch of
/// about 256^3 voxels shaped by 1/spacing, capped by the median shape; while the memory
/// proxy exceeds `reference` (nnU-Net: 560e6 for its 8 GB reference GPU and batch size 2),
/// the axis with the largest patch / median-shape ratio shrinks by its divisor; the batch is
/// round(reference / estimate * 2), at most 5% of the dataset's voxels, at least 2. Planned
/// as nnU-Net does, with the coarsest axis first (its transpose) and the others z, y, x, and
/// given back in x, y, z.
struct PatchPlan {
  Topology topology;
  std::vector<std::int64_t> features;
  std::int64_t batch_size = 2;
  double estimate = 0;  ///< the memory model's cost of the final patch at batch 2 (nnU-Net: feature_map_elements)
  double cost = 0;      ///< its cost at batch_size
};
constexpr double kReferenceElements = 560e6;  ///< nnU-Net's UNet_reference_val_3d (8 GB)

/// What the patch loop asks of a training step: its memory (linear in the batch) within a
/// budget that a batch of 2 must fit; where `compute` is set, its multiply-accumulates (linear
/// in the batch) within `compute_budget` too; and the network's channels per stage,
/// stage_features(stages, base_features, max_features) (nnU-Net's: 32..320).
struct StepModel {
  std::function<double(const Topology&, const std::vector<std::int64_t>& features, std::int64_t batch)> cost;
  double budget = 0;
  /// nnU-Net rounds the batch its proxy allows (round(reference / estimate * 2)); medfast's
  /// byte estimate takes the largest batch that fits.
  bool round_batch = false;
  /// A cost as the messages give it (e.g. "1.5 GiB"); default: the number.
  std::function<std::string(double)> describe;
  /// A step's multiply-accumulates; empty: compute is not budgeted.
  std::function<double(const Topology&, const std::vector<std::int64_t>& features, std::int64_t batch)> compute;
  double compute_budget = 0;
  std::int64_t base_features = 32, max_features = 320;
};
/// nnU-Net's: feature_map_elements * batch / 2 against `reference` (its proxy is per batch of 2).
StepModel nnunet_memory_model(std::int64_t classes, double reference = kReferenceElements);

PatchPlan plan_patch(const Spacing& spacing, const Spacing& median_shape, std::int64_t classes,
                     double dataset_voxels, double reference = kReferenceElements);
/// The same loop with another step model (medfast's estimate in bytes against a budget, and
/// a compute budget): the patch shrinks until both fit a batch of 2; the batch is the largest
/// that both allow. ValueError, naming the budget, when not even the smallest patch fits.
PatchPlan plan_patch(const Spacing& spacing, const Spacing& median_shape, double dataset_voxels,
                     const StepModel& model);

/// A channel's normalization by its name (nnU-Net's table, case-insensitive): CT, noNorm,
/// zscore, rescale_to_0_1; any other name (MRI, T2, ...) z-scores per image.
enum class Normalization { ct, zscore, none, rescale_to_0_1 };
constexpr std::array<Choice<Normalization>, 4> choices(Normalization) {
  return {{{Normalization::ct, "CT"},
           {Normalization::zscore, "zscore"},
           {Normalization::none, "noNorm"},
           {Normalization::rescale_to_0_1, "rescale_to_0_1"}}};
}
Normalization normalization_for(const std::string& channel_name);
/// z-score uses only the nonzero region when cropping to it left less than 3/4 of the image
/// (the median over cases); other schemes never do.
bool use_mask_for_norm(Normalization scheme, double median_relative_size_after_crop);

/// Foreground intensity statistics of a channel over the pooled samples of all cases.
struct IntensityStats {
  double mean = 0, median = 0, std = 0, min = 0, max = 0, p00_5 = 0, p99_5 = 0;
};
IntensityStats intensity_stats(const std::vector<double>& pooled);

}  // namespace medfast::plan
