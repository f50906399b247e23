#pragma once
/// \file
/// Internal to src/transforms: the pieces of the resampling engine (resample.cpp) that
/// the spatial transforms reuse: Spacing reads its input through an Orientation that was
/// not applied (InputView), and crops move the origin (translate). Not a public header.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "medfast/transforms/resample.hpp"

namespace medfast::transforms::detail {

// The input of a resampling as the kernel reads it: per spatial axis d (1..3) of the
// grid the tables index, the element stride in memory, counted from the axis' far end
// when `flip` (an Orientation not applied: its flips and axis order are read through
// here instead of copied first).
struct InputView {
  std::int64_t stride[4] = {0, 0, 0, 0};
  bool flip[4] = {false, false, false, false};
  std::int64_t size[4] = {0, 0, 0, 0};
  std::int64_t offset(int d, std::int64_t i) const { return (flip[d] ? size[d] - 1 - i : i) * stride[d]; }
  static InputView of(const at::Tensor& t) {
    InputView v;
    for (int d = 0; d < 4; ++d) v.stride[d] = t.stride(d), v.size[d] = t.size(d);
    return v;
  }
};

/// The axis-aligned resampling of `x` (read through `view`, whose grid is `in` with
/// index->world `from`) onto `to`, in one pass; an undefined tensor when the map is not
/// axis-aligned or the native kernels do not apply. `layout` gives the output's memory order.
at::Tensor resample_aligned(at::Tensor x, const InputView& view, const at::Tensor& layout, const Shape3& in,
                            const Affine& from, const Geometry& to, bool nearest);

/// `a` with its origin moved by `voxels` (index space): the affine of a crop starting there.
Affine translate(const Affine& a, const Shape3& voxels);

}  // namespace medfast::transforms::detail
