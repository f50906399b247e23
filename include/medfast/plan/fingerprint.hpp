#pragma once
/// \file
/// One case's part of a dataset fingerprint (nnU-Net v2's DatasetFingerprintExtractor.
/// analyze_case): the image cropped to its nonzero region, the crop's share of the image,
/// and foreground intensity samples per channel. The dataset reader pools these over cases
/// (rules.hpp turns them into a plan; issue 23).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "medfast/plan/rules.hpp"

namespace medfast::plan {

struct CaseFingerprint {
  Shape shape_after_crop{};       ///< the bounding box of voxels nonzero in any channel
  double relative_size = 1;       ///< its voxels / the image's voxels
  Spacing spacing{};
  std::vector<std::vector<double>> samples;  ///< per channel: foreground intensities, with replacement
  std::int64_t foreground_voxels = 0;        ///< label > 0 inside the crop
};

/// `image` [C, X, Y, Z] (any real dtype), `label` [X, Y, Z] or [1, X, Y, Z] (integers; > 0 is
/// foreground), `spacing` in mm. Crops both to the bounding box of voxels where any channel is
/// nonzero (nnU-Net's crop_to_nonzero: the whole image where none is), then draws
/// `samples_per_channel` foreground voxels per channel, with replacement, uniformly, from
/// medfast's Rng seeded with `seed` (nnU-Net draws 1e8 / cases with numpy's seed 1234: the same
/// distribution, not the same draws). No foreground: no samples. ValueError naming `where`
/// for shapes that do not match or a spacing that is not positive.
CaseFingerprint case_fingerprint(const at::Tensor& image, const at::Tensor& label, const Spacing& spacing,
                                 std::int64_t samples_per_channel, std::uint64_t seed, const std::string& where);

}  // namespace medfast::plan
