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

#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

using Shape3 = std::array<std::int64_t, 3>;

/// A spatial grid: shape and voxel-to-world affine.
struct Geometry {
  Shape3 shape{};
  Affine affine;
};

/// MONAI Spacing's output grid (diagonal=False, scale_extent=False): the
/// rotation kept, columns rescaled to `pixdim`, shape = round(extent + 1)
/// (numpy rounding), origin kept when the orientation is unchanged.
Geometry spacing_geometry(const Shape3& shape, const Affine& affine, const std::array<double, 3>& pixdim);

/// How Orientation reorders axes: output axis k takes input axis
/// `source_axis[k]`, flipped if `flip[k]`; `affine` is the new affine.
struct OrientationPlan {
  std::array<int, 3> source_axis{0, 1, 2};
  std::array<bool, 3> flip{false, false, false};
  Affine affine;
  Shape3 shape{};
};
/// Plan to reach `axcodes` (e.g. "RAS"), as nibabel's ornt_transform and
/// inv_ornt_aff compute it. Throws ValueError for bad codes.
OrientationPlan orientation_plan(const Shape3& shape, const Affine& affine, const std::string& axcodes);

/// Resamples channel-first data on grid `from` onto grid `to` (trilinear or
/// nearest, border padding), sampling at voxel centres mapped through the
/// affines. Bilinear output is float32 (float64 stays float64); nearest keeps the dtype.
at::Tensor resample(const at::Tensor& data, const Affine& from, const Geometry& to, bool nearest);

/// Resamples channel-first data through an index-space affine: output voxel o
/// takes input position out_to_in * o (trilinear or nearest). Outside the
/// input, border padding, or 0 with `zeros_outside`; output voxels outside
/// [box_lo, box_hi) are 0. Output is C-contiguous. One pass, no sampling grid.
at::Tensor resample_index_affine(const at::Tensor& data, const Affine& out_to_in, const std::array<std::int64_t, 3>& shape,
                                 bool nearest, bool zeros_outside, const std::array<std::int64_t, 3>& box_lo,
                                 const std::array<std::int64_t, 3>& box_hi);
/// The same, written into `dst` (contiguous [C, shape], the output's dtype: float for
/// linear resampling of non-floating data), e.g. a sample's slice of a batch.
void resample_index_affine_into(const at::Tensor& data, const Affine& m, const Shape3& shape, bool nearest,
                                bool zeros_outside, const Shape3& box_lo, const Shape3& box_hi, at::Tensor dst);

/// Spatial shape of a channel-first tensor; throws unless it is (C, X, Y, Z).
Shape3 spatial_shape(const at::Tensor& data, const std::string& what);

struct EnsureChannelFirstOptions {
  std::vector<std::string> keys;
};
struct OrientationOptions {
  std::vector<std::string> keys;
  std::string axcodes = "RAS";
};
struct SpacingOptions {
  std::vector<std::string> keys;
  std::array<double, 3> pixdim{1, 1, 1};
  std::vector<std::string> mode;  ///< per key: bilinear | nearest
};
struct CropForegroundOptions {
  std::vector<std::string> keys;
  std::string source_key;
  double threshold = 0;  ///< MONAI's default select_fn: x > 0
  std::array<std::int64_t, 3> margin{0, 0, 0};
  bool allow_smaller = true;
  std::array<std::int64_t, 3> k_divisible{1, 1, 1};
};
struct ResizeWithPadOrCropOptions {
  std::vector<std::string> keys;
  Shape3 spatial_size{};
  double value = 0;  ///< constant padding value
};

TransformPtr make_ensure_channel_first(const EnsureChannelFirstOptions& o);
TransformPtr make_orientation(const OrientationOptions& o);
TransformPtr make_spacing(const SpacingOptions& o);
TransformPtr make_crop_foreground(const CropForegroundOptions& o);
TransformPtr make_resize_with_pad_or_crop(const ResizeWithPadOrCropOptions& o);

/// Crops (start >= 0, end <= size) or pads (start < 0, end > size) every key
/// to [start, end) per spatial axis and moves the origin accordingly. With
/// `compact` the result owns a compact copy (for caching); without, a pure
/// crop stays a view of the input (random crops are copied once, later).
void crop_or_pad(Sample& sample, const std::vector<std::string>& keys, const Shape3& start, const Shape3& end,
                 double value, bool compact = true);

/// Flips `dims`; dense CPU tensors are copied line by line in their own memory
/// order, others go through at::flip.
at::Tensor flip_dims(const at::Tensor& x, const std::vector<std::int64_t>& dims);

/// Orientation immediately followed by Spacing (Compose calls this for each such pair):
/// for the keys both transform, the one resampling reads the data through the
/// orientation's flips and axis order instead of a flipped copy made first. The same
/// values, geometry and errors as applying them one after the other (the same grid,
/// tables and reads). False, doing nothing, when the two are not such a pair.
bool apply_orientation_spacing(const Transform& first, const Transform& second, Sample& sample);

}  // namespace medfast::transforms
