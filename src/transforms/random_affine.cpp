// RandRotate, RandZoom and RandAffine: AffineSpec, RandAffineFamily (composed into the
// spatial plan), affine_spec (their arguments) and their entries in the random table.
#include "medfast/transforms/random.hpp"

#include <cmath>

#include "medfast/core/error.hpp"
#include "random_families.hpp"

namespace medfast::transforms {

namespace {

using detail::require;

// RandRotate, RandZoom and RandAffine: an index-space affine about the volume
// centre (output shape kept), drawn per sample and composed into the plan.
struct AffineSpec {
  std::string name;
  std::vector<std::string> keys;
  std::vector<std::string> mode;
  double prob = 0.1;
  std::array<std::array<double, 2>, 3> rotate{};     // radians per axis
  std::array<std::array<double, 2>, 3> scale{};      // zoom factors (RandZoom) or 1+range (RandAffine)
  std::array<std::array<double, 2>, 3> translate{};  // voxels
  bool isotropic_zoom = false;
  std::string padding = "border";
};

Affine rotation(double ax, double ay, double az) {
  // MONAI's create_rotate for 3-D: Rz @ Ry @ Rx.
  Affine rx, ry, rz;
  rx.m = {{{1, 0, 0, 0}, {0, std::cos(ax), -std::sin(ax), 0}, {0, std::sin(ax), std::cos(ax), 0}, {0, 0, 0, 1}}};
  ry.m = {{{std::cos(ay), 0, std::sin(ay), 0}, {0, 1, 0, 0}, {-std::sin(ay), 0, std::cos(ay), 0}, {0, 0, 0, 1}}};
  rz.m = {{{std::cos(az), -std::sin(az), 0, 0}, {std::sin(az), std::cos(az), 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}}};
  return rz * ry * rx;
}

class RandAffineFamily final : public RandomTransform {
 public:
  explicit RandAffineFamily(AffineSpec a) : a_(std::move(a)) {
    require_keys(a_.keys, a_.name);
    if (a_.mode.empty()) a_.mode.assign(a_.keys.size(), "bilinear");
    require(a_.mode.size() == a_.keys.size(), str(a_.name, ": argument mode: one mode per key"));
    for (const auto& m : a_.mode) {
      require(m == "bilinear" || m == "nearest", str(a_.name, ": argument mode: '", m, "' is not bilinear or nearest"));
    }
    require(a_.padding == "border" || a_.padding == "zeros",
            str(a_.name, ": argument padding_mode: '", a_.padding, "' is not border or zeros"));
  }
  std::string name() const override { return a_.name; }
  nlohmann::json config() const override {
    return {{"keys", a_.keys}, {"mode", a_.mode}, {"prob", a_.prob}, {"rotate", a_.rotate},
            {"scale", a_.scale}, {"translate", a_.translate}, {"padding_mode", a_.padding}};
  }
  void apply(Sample& s, Rng& rng) const override {
    SpatialPlan plan;
    if (compose(plan, s, rng)) apply_plan(s, plan);
  }
  bool compose(SpatialPlan& plan, const Sample& s, Rng& rng) const override {
    if (plan.active) {
      for (const auto& k : a_.keys) {
        if (!plan.mode.count(k)) return false;  // a different key set: apply the pending plan first
      }
      if (plan.box_lo != Shape3{0, 0, 0} || plan.box_hi != plan.shape) return false;  // after a folded-in pad
    }
    const bool apply = rng.uniform() < a_.prob;
    double rot[3], scl[3], tr[3];
    for (int i = 0; i < 3; ++i) rot[i] = rng.uniform(a_.rotate[i][0], a_.rotate[i][1]);
    for (int i = 0; i < 3; ++i) scl[i] = rng.uniform(a_.scale[i][0], a_.scale[i][1]);
    if (a_.isotropic_zoom) scl[1] = scl[2] = scl[0];
    for (int i = 0; i < 3; ++i) tr[i] = rng.uniform(a_.translate[i][0], a_.translate[i][1]);
    if (!plan.active) {
      plan.active = true;
      plan.out_to_in = Affine();
      plan.shape = spatial_shape(s.volume(a_.keys[0]).data, a_.keys[0]);
      plan.box_lo = {0, 0, 0};
      plan.box_hi = plan.shape;
      for (std::size_t i = 0; i < a_.keys.size(); ++i) plan.mode[a_.keys[i]] = a_.mode[i];
      plan.padding = a_.padding;
    }
    if (!apply) return true;
    // About the centre of the current output grid: o -> c + A^-1 (o - c) - t.
    Affine centre, uncentre, scale;
    for (int i = 0; i < 3; ++i) {
      const double c = (static_cast<double>(plan.shape[i]) - 1) / 2.0;
      centre(i, 3) = c;
      uncentre(i, 3) = -c - tr[i];
      scale(i, i) = scl[i];
    }
    const Affine forward = rotation(rot[0], rot[1], rot[2]) * scale;  // input -> output, about the centre
    plan.out_to_in = plan.out_to_in * centre * forward.inverse() * uncentre;
    return true;
  }

 private:
  AffineSpec a_;
};

}  // namespace

/// RandRotate, RandZoom and RandAffine's arguments as one spec (MONAI's names and defaults).
AffineSpec affine_spec(const std::string& name, Args& a, const nlohmann::json& json) {
  AffineSpec sp;
  sp.name = name;
  sp.keys = a.keys();
  sp.prob = a.number("prob", 0.1);
  sp.mode = a.per_key("mode", "bilinear", sp.keys.size());
  sp.padding = a.text("padding_mode", name == "RandAffine" ? "zeros" : "border");
  for (auto& r : sp.scale) r = {1, 1};
  auto range = [&](const std::string& key, double scale_by) -> std::array<double, 2> {
    if (a.has(key) && json[key].is_number()) {
      const double x = a.number(key, 0) * scale_by;
      return {-x, x};
    }
    const auto v = a.numbers(key, 2, {0, 0});
    return {v[0] * scale_by, v[1] * scale_by};
  };
  if (name == "RandRotate") {
    sp.rotate = {range("range_x", 1), range("range_y", 1), range("range_z", 1)};
    a.flag("keep_size", true);
  } else if (name == "RandZoom") {
    const double lo = a.number("min_zoom", 0.9), hi = a.number("max_zoom", 1.1);
    require(lo > 0 && hi >= lo, "RandZoom: arguments min_zoom and max_zoom must be a positive range");
    for (auto& r : sp.scale) r = {lo, hi};
    sp.isotropic_zoom = true;
    a.flag("keep_size", true);
  } else {
    const auto per_axis = [&](const std::string& key) -> std::array<std::array<double, 2>, 3> {
      const auto v = a.numbers(key, 3, {0, 0, 0});
      return {{{-v[0], v[0]}, {-v[1], v[1]}, {-v[2], v[2]}}};
    };
    sp.rotate = per_axis("rotate_range");
    const auto sr = per_axis("scale_range");
    for (int i = 0; i < 3; ++i) sp.scale[i] = {1 + sr[i][0], 1 + sr[i][1]};
    sp.translate = per_axis("translate_range");
  }
  return sp;
}

// Entries of the random transform table (random_registry.cpp).
namespace registry {

RandomTransformPtr rand_rotate(Args& a, const nlohmann::json& json) {
  return std::make_shared<RandAffineFamily>(affine_spec("RandRotate", a, json));
}
RandomTransformPtr rand_zoom(Args& a, const nlohmann::json& json) {
  return std::make_shared<RandAffineFamily>(affine_spec("RandZoom", a, json));
}
RandomTransformPtr rand_affine(Args& a, const nlohmann::json& json) {
  return std::make_shared<RandAffineFamily>(affine_spec("RandAffine", a, json));
}

}  // namespace registry

}  // namespace medfast::transforms
