#pragma once
/// \file
/// Internal to src/transforms: what the random transforms' files share. The concrete
/// transforms live in anonymous namespaces of random_crop.cpp (crops, flips, quarter
/// turns), random_intensity.cpp (intensity steps, Gaussian smoothing) and
/// random_affine.cpp (RandRotate, RandZoom, RandAffine), each with its entry (its
/// arguments read) in namespace registry, which random_registry.cpp's table lists.
/// Not a public header.

#include <string>

#include "medfast/core/error.hpp"
#include "medfast/transforms/random.hpp"

namespace medfast::transforms::detail {

/// Throws ValueError(msg) unless `ok`: the transforms' argument checks.
inline void require(bool ok, const std::string& msg) {
  if (!ok) throw ValueError(msg);
}

}  // namespace medfast::transforms::detail
