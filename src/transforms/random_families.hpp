#pragma once
/// \file
/// Internal to src/transforms: what the random transforms' files share. The concrete
/// transforms live in anonymous namespaces of random_crop.cpp (crops, flips, quarter
/// turns), random_intensity.cpp (intensity steps, Gaussian smoothing) and
/// random_affine.cpp (RandRotate, RandZoom, RandAffine), each with its entry (its
/// arguments read) in namespace registry, which random_registry.cpp's table lists.
/// RandomWith is their common part. Not a public header.

#include <memory>
#include <string>
#include <utility>

#include "medfast/core/error.hpp"
#include "medfast/core/fields.hpp"
#include "medfast/transforms/random.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms::detail {

/// Throws ValueError(msg) unless `ok`: the transforms' argument checks.
inline void require(bool ok, const std::string& msg) {
  if (!ok) throw ValueError(msg);
}

}  // namespace medfast::transforms::detail

namespace medfast::transforms {

/// A random transform that runs on its options as read (a struct with fields(), declared
/// once beside it): its name, the options, and steps() as they are written back, every
/// default filled in. A transform names its arguments in its options struct alone.
template <typename Options>
class RandomWith : public RandomTransform {
 public:
  using options_type = Options;
  RandomWith(std::string name, Options o) : name_(std::move(name)), o_(std::move(o)) { require_keys(o_.keys, name_); }
  std::string name() const override { return name_; }
  nlohmann::json steps() const override { return fields_json(o_, name_); }

 protected:
  std::string name_;
  Options o_;
};

/// A random table's entry for transform T: its options read (and checked) from `a`, after
/// any leading constructor arguments.
template <typename T, typename... Leading>
RandomTransformPtr made(Args& a, Leading&&... leading) {
  return std::make_shared<T>(std::forward<Leading>(leading)..., read_options<typename T::options_type>(a));
}

}  // namespace medfast::transforms
