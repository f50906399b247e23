// RandRotate, RandZoom and RandAffine: AffineSpec, RandAffineFamily (composed into the
// spatial plan), their arguments as written (options declared once) and their entries.
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
  std::vector<Interp> mode;
  double prob = 0.1;
  std::array<std::array<double, 2>, 3> rotate{};     // radians per axis
  std::array<std::array<double, 2>, 3> scale{};      // zoom factors (RandZoom) or 1+range (RandAffine)
  std::array<std::array<double, 2>, 3> translate{};  // voxels
  bool isotropic_zoom = false;
  GridPadding padding = GridPadding::border;
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
    if (a_.mode.empty()) a_.mode.assign(a_.keys.size(), Interp::bilinear);
    require(a_.mode.size() == a_.keys.size(), str(a_.name, ": argument mode: one mode per key"));
  }
  std::string name() const override { return a_.name; }
  nlohmann::json steps() const override {
    return {{"keys", a_.keys}, {"mode", as_json(a_.mode)}, {"prob", a_.prob}, {"rotate", a_.rotate},
            {"scale", a_.scale}, {"translate", a_.translate}, {"padding_mode", as_json(a_.padding)}};
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

namespace {

// The arguments as written (MONAI's names and defaults), declared once; each entry turns
// them into the one spec the family runs (AffineSpec).
struct RandRotateOptions {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::array<double, 2> range_x{0, 0}, range_y{0, 0}, range_z{0, 0};
  std::vector<Interp> mode;
  GridPadding padding_mode = GridPadding::border;
  bool keep_size = true;
  static constexpr auto fields() {
    using O = RandRotateOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"),
                           field("range_x", &O::range_x, "rotation about x, radians: [lo, hi]; one number v: [-v, v]").symmetric(),
                           field("range_y", &O::range_y, "rotation about y, radians (as range_x)").symmetric(),
                           field("range_z", &O::range_z, "rotation about z, radians (as range_x)").symmetric(), field("mode", &O::mode, "interpolation per key").each_key("bilinear"),
                           field("padding_mode", &O::padding_mode, "what is read outside the input"),
                           field("keep_size", &O::keep_size, "the output keeps the input's size (always)"));
  }
};
struct RandZoomOptions {
  std::vector<std::string> keys;
  double prob = 0.1, min_zoom = 0.9, max_zoom = 1.1;
  std::vector<Interp> mode;
  GridPadding padding_mode = GridPadding::border;
  bool keep_size = true;
  static constexpr auto fields() {
    using O = RandZoomOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"), field("min_zoom", &O::min_zoom, "smallest zoom factor (the same on every axis)"),
                           field("max_zoom", &O::max_zoom, "largest zoom factor"), field("mode", &O::mode, "interpolation per key").each_key("bilinear"),
                           field("padding_mode", &O::padding_mode, "what is read outside the input"),
                           field("keep_size", &O::keep_size, "the output keeps the input's size (always)"));
  }
};
struct RandAffineOptions {
  std::vector<std::string> keys;
  double prob = 0.1;
  std::array<double, 3> rotate_range{0, 0, 0}, scale_range{0, 0, 0}, translate_range{0, 0, 0};
  std::vector<Interp> mode;
  GridPadding padding_mode = GridPadding::zeros;
  static constexpr auto fields() {
    using O = RandAffineOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("prob", &O::prob, "probability of applying it to a sample"),
                           field("rotate_range", &O::rotate_range, "rotation per axis drawn from [-r, r], radians").repeats(3),
                           field("scale_range", &O::scale_range, "zoom per axis drawn from [1 - s, 1 + s]").repeats(3),
                           field("translate_range", &O::translate_range, "shift per axis drawn from [-t, t], voxels").repeats(3),
                           field("mode", &O::mode, "interpolation per key").each_key("bilinear"), field("padding_mode", &O::padding_mode, "what is read outside the input"));
  }
};

AffineSpec base_spec(const std::string& name, const std::vector<std::string>& keys, double prob,
                     const std::vector<Interp>& mode, GridPadding padding) {
  return AffineSpec{name, keys, mode, prob, {}, {{{1, 1}, {1, 1}, {1, 1}}}, {}, false, padding};
}

}  // namespace

// Entries of the random transform table (random_registry.cpp).
namespace registry {

RandomTransformPtr rand_rotate(Args& a, const nlohmann::json&) {
  const auto o = read_options<RandRotateOptions>(a);
  AffineSpec sp = base_spec("RandRotate", o.keys, o.prob, o.mode, o.padding_mode);
  sp.rotate = {o.range_x, o.range_y, o.range_z};
  return std::make_shared<RandAffineFamily>(sp);
}

RandomTransformPtr rand_zoom(Args& a, const nlohmann::json&) {
  const auto o = read_options<RandZoomOptions>(a);
  require(o.min_zoom > 0 && o.max_zoom >= o.min_zoom, "RandZoom: arguments min_zoom and max_zoom must be a positive range");
  AffineSpec sp = base_spec("RandZoom", o.keys, o.prob, o.mode, o.padding_mode);
  for (auto& r : sp.scale) r = {o.min_zoom, o.max_zoom};
  sp.isotropic_zoom = true;
  return std::make_shared<RandAffineFamily>(sp);
}

RandomTransformPtr rand_affine(Args& a, const nlohmann::json&) {
  const auto o = read_options<RandAffineOptions>(a);
  AffineSpec sp = base_spec("RandAffine", o.keys, o.prob, o.mode, o.padding_mode);
  for (int i = 0; i < 3; ++i) {
    sp.rotate[i] = {-o.rotate_range[i], o.rotate_range[i]};
    sp.scale[i] = {1 - o.scale_range[i], 1 + o.scale_range[i]};
    sp.translate[i] = {-o.translate_range[i], o.translate_range[i]};
  }
  return std::make_shared<RandAffineFamily>(sp);
}

}  // namespace registry

}  // namespace medfast::transforms
