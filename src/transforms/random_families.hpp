#pragma once
/// \file
/// Internal to src/transforms: what the random transforms' files share. The concrete
/// transforms live in anonymous namespaces of random_crop.cpp (crops, flips, quarter
/// turns), random_intensity.cpp (intensity steps, Gaussian smoothing) and
/// random_affine.cpp (RandRotate, RandZoom, RandAffine); make_random
/// (random_registry.cpp) builds them through the factories below, which take the
/// arguments it has parsed. Not a public header.

#include <array>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/transforms/random.hpp"

namespace medfast::transforms::detail {

/// Throws ValueError(msg) unless `ok`: the transforms' argument checks.
inline void require(bool ok, const std::string& msg) {
  if (!ok) throw ValueError(msg);
}

// ---------------------------------------------------------------------------
// random_crop.cpp
// ---------------------------------------------------------------------------

struct CropSpec {
  std::vector<std::string> keys;
  std::string label_key;
  Shape3 spatial_size{};
  double pos = 1, neg = 1;
  std::size_t num_samples = 1;
  std::string fg_indices_key, bg_indices_key;
  bool allow_smaller = false;
};

RandomTransformPtr make_rand_crop_by_pos_neg_label(const CropSpec& c);
RandomTransformPtr make_rand_spatial_crop(const std::vector<std::string>& keys, Shape3 roi);
RandomTransformPtr make_rand_flip(const std::vector<std::string>& keys, double prob, const std::vector<int>& axes);
RandomTransformPtr make_rand_rotate90(const std::vector<std::string>& keys, double prob, int max_k,
                                      std::array<int, 2> axes);

// ---------------------------------------------------------------------------
// random_intensity.cpp
// ---------------------------------------------------------------------------

RandomTransformPtr make_rand_scale_intensity(const std::vector<std::string>& keys, double prob, double lo, double hi);
RandomTransformPtr make_rand_shift_intensity(const std::vector<std::string>& keys, double prob, double lo, double hi);
RandomTransformPtr make_rand_gaussian_noise(const std::vector<std::string>& keys, double prob, double mean,
                                            double stddev);
RandomTransformPtr make_rand_gaussian_smooth(const std::vector<std::string>& keys, double prob,
                                             const std::array<std::array<double, 2>, 3>& sigma);
RandomTransformPtr make_rand_adjust_contrast(const std::vector<std::string>& keys, double prob, double lo, double hi);

// ---------------------------------------------------------------------------
// random_affine.cpp
// ---------------------------------------------------------------------------

/// RandRotate, RandZoom or RandAffine (`name`) from its arguments.
RandomTransformPtr make_rand_affine_family(const std::string& name, Args& a, const nlohmann::json& json);

}  // namespace medfast::transforms::detail
