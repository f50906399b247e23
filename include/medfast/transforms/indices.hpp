#pragma once
/// \file
/// FgBgToIndices and the compact form of sampling indices it stores.
///
/// MONAI keeps one int64 per foreground and per background voxel (about 8
/// bytes x every voxel of the volume). medfast keeps runs of consecutive flat
/// indices: an int64 tensor [R, 2] of [start, end) pairs in C order of the
/// spatial shape, with R roughly the number of row boundaries. Drawing the
/// k-th index is a binary search over the runs' cumulative lengths.

#include <cstdint>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

/// Runs [start, end) of the true elements of a boolean tensor (flattened, C order).
at::Tensor mask_to_runs(const at::Tensor& mask);
/// Number of indices the runs hold.
std::int64_t runs_count(const at::Tensor& runs);
/// The flat indices the runs hold, in order (for tests and interop).
at::Tensor runs_to_indices(const at::Tensor& runs);
/// The k-th index held (0 <= k < runs_count).
std::int64_t runs_index(const at::Tensor& runs, std::int64_t k);

/// The channels of a label [C, X, Y, Z] whose nonzero voxels are foreground: all of one,
/// channels 1.. of several (MONAI 1.3.2's map_binary_to_indices takes several channels for
/// one-hot classes and leaves out channel 0, the background). A region label whose channel 0
/// holds voxels no other channel holds (nnU-Net's order, whole tumour first) loses them from
/// the foreground: compute the indices from the class label, before LabelToRegions.
at::Tensor foreground_channels(const at::Tensor& label);

struct FgBgToIndicesOptions {
  std::vector<std::string> keys;  ///< label keys
  std::string image_key;          ///< if set, background excludes image <= image_threshold
  double image_threshold = 0;
  std::string fg_postfix = "_fg_indices";
  std::string bg_postfix = "_bg_indices";
  static constexpr auto fields() {
    using O = FgBgToIndicesOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("image_key", &O::image_key, "if set, background excludes image <= image_threshold"),
                           field("image_threshold", &O::image_threshold, "see image_key"),
                           field("fg_postfix", &O::fg_postfix, "output key: the label key + this"),
                           field("bg_postfix", &O::bg_postfix, "output key: the label key + this"));
  }
};
TransformPtr make_fg_bg_to_indices(const FgBgToIndicesOptions& o);

}  // namespace medfast::transforms
