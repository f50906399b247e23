#pragma once
/// \file
/// The resampling engine under the spatial and random transforms: the grids
/// (Spacing's output grid, Orientation's axis plan) and the resampling of
/// channel-first volumes (C, X, Y, Z) between them, in one pass with medfast's
/// native CPU kernels (scalar and AVX2, bit-equal to each other) or libtorch ops
/// on other devices. Grids and values follow MONAI 1.3 / nibabel.

#include <array>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "medfast/core/choices.hpp"
#include "medfast/image/affine.hpp"

namespace medfast::transforms {

using Shape3 = std::array<std::int64_t, 3>;

/// How a resampled voxel is computed (MONAI's mode): trilinear ("bilinear", MONAI's name
/// in every dimension) or the nearest input voxel.
enum class Interp { bilinear, nearest };
constexpr std::array<Choice<Interp>, 2> choices(Interp) {
  return {{{Interp::bilinear, "bilinear"}, {Interp::nearest, "nearest"}}};
}
/// What a resampling reads outside its input (MONAI's padding_mode for grids): the
/// nearest border voxel, or zeros.
enum class GridPadding { border, zeros };
constexpr std::array<Choice<GridPadding>, 2> choices(GridPadding) {
  return {{{GridPadding::border, "border"}, {GridPadding::zeros, "zeros"}}};
}

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

/// Spatial shape of a channel-first tensor; throws ValueError naming `what` unless it is (C, X, Y, Z).
Shape3 spatial_shape(const at::Tensor& data, const std::string& what);

}  // namespace medfast::transforms
