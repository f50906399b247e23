#pragma once
/// \file
/// Deterministic spatial transforms on channel-first volumes (C, X, Y, Z):
/// EnsureChannelFirst, Orientation, Spacing, CropForeground,
/// ResizeWithPadOrCrop. Output shapes and affines follow MONAI 1.3 (checked
/// against ../shared/reference/monai_geometry.json), so a model sees the same
/// geometry either way.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"
#include "medfast/transforms/resample.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

// Each options struct lists its MONAI arguments once (core/fields.hpp): the transform's
// entry reads them, its config() (the cache's key) writes them back, the docs list them.
struct EnsureChannelFirstOptions {
  std::vector<std::string> keys;
  static constexpr auto fields() {
    using O = EnsureChannelFirstOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys());
  }
};
struct OrientationOptions {
  std::vector<std::string> keys;
  std::string axcodes = "RAS";
  static constexpr auto fields() {
    using O = OrientationOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("axcodes", &O::axcodes, "the axis codes of the output (RAS, LPS, ...)"));
  }
};
struct SpacingOptions {
  std::vector<std::string> keys;
  std::array<double, 3> pixdim{1, 1, 1};
  std::vector<Interp> mode;  ///< per key
  static constexpr auto fields() {
    using O = SpacingOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
                           field("pixdim", &O::pixdim, "output voxel size in mm: one number or three").repeats(3).must(),
                           field("mode", &O::mode, "interpolation per key").each_key("bilinear"));
  }
};
struct CropForegroundOptions {
  std::vector<std::string> keys;
  std::string source_key;
  double threshold = 0;  ///< MONAI's default select_fn: x > 0
  /// Foreground: source values != 0 instead (nnU-Net's crop to the nonzero region; MONAI:
  /// select_fn=lambda x: x != 0). Written back only when on, so chains of earlier versions
  /// keep their cache keys.
  bool nonzero = false;
  std::array<std::int64_t, 3> margin{0, 0, 0};
  bool allow_smaller = true;
  std::array<std::int64_t, 3> k_divisible{1, 1, 1};
  static constexpr auto fields() {
    using O = CropForegroundOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("source_key", &O::source_key, "the key whose foreground sets the box").must(),
                           field("threshold", &O::threshold, "foreground: source values above it"),
                           field("nonzero", &O::nonzero, "foreground: source values other than 0 instead (nnU-Net's crop to nonzero)")
                               .written_when_set(),
                           field("margin", &O::margin, "voxels added around the box: one number or three").repeats(3),
                           field("allow_smaller", &O::allow_smaller, "a margin may go past the volume's edge"),
                           field("k_divisible", &O::k_divisible, "the box's size a multiple of it: one or three").repeats(3));
  }
};
struct ResizeWithPadOrCropOptions {
  std::vector<std::string> keys;
  Shape3 spatial_size{};
  double value = 0;  ///< constant padding value
  static constexpr auto fields() {
    using O = ResizeWithPadOrCropOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
                           field("spatial_size", &O::spatial_size, "output size: one whole number or three").repeats(3).must(),
                           field("value", &O::value, "the padding value"));
  }
};

/// MONAI's SpatialPad (method symmetric, mode constant): each axis padded to at least
/// spatial_size (<= 0 or smaller than the image: unchanged), the extra voxel after.
struct SpatialPadOptions {
  std::vector<std::string> keys;
  Shape3 spatial_size{};
  double value = 0;  ///< constant padding value
  static constexpr auto fields() {
    using O = SpatialPadOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
                           field("spatial_size", &O::spatial_size, "smallest output size: one whole number or three").repeats(3).must(),
                           field("value", &O::value, "the padding value"));
  }
};

TransformPtr make_ensure_channel_first(const EnsureChannelFirstOptions& o);
TransformPtr make_orientation(const OrientationOptions& o);
TransformPtr make_spacing(const SpacingOptions& o);
TransformPtr make_crop_foreground(const CropForegroundOptions& o);
TransformPtr make_resize_with_pad_or_crop(const ResizeWithPadOrCropOptions& o);
TransformPtr make_spatial_pad(const SpatialPadOptions& o);

/// Crops (start >= 0, end <= size) or pads (start < 0, end > size) every key
/// to [start, end) per spatial axis and moves the origin accordingly. With
/// `compact` the result owns a compact copy (for caching); without, a pure
/// crop stays a view of the input (random crops are copied once, later).
void crop_or_pad(Sample& sample, const std::vector<std::string>& keys, const Shape3& start, const Shape3& end,
                 double value, bool compact = true);

/// Flips `dims`; dense CPU tensors are copied line by line in their own memory
/// order, others go through at::flip.
at::Tensor flip_dims(const at::Tensor& x, const std::vector<std::int64_t>& dims);

}  // namespace medfast::transforms
