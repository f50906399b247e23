// The deterministic spatial transforms (include/medfast/transforms/spatial.hpp):
// EnsureChannelFirst, Orientation, Spacing, CropForeground, ResizeWithPadOrCrop, and the
// crops, pads and flips they share. Grids and resampling come from the engine in
// resample.cpp; Orientation followed by Spacing fuse through Transform::apply_with_next.
#include "medfast/transforms/spatial.hpp"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"

#include "kernel_for.hpp"
#include "resample_detail.hpp"

namespace medfast::transforms {

void crop_or_pad(Sample& sample, const std::vector<std::string>& keys, const Shape3& start, const Shape3& end,
                 double value, bool compact) {
  for (const auto& key : keys) {
    Volume& v = sample.volume(key);
    const Shape3 n = spatial_shape(v.data, key);
    at::Tensor x = v.data;
    // Pad first (negative start / end past the size), then crop.
    std::vector<std::int64_t> pad;  // torch order: last dim first
    bool any_pad = false;
    for (int axis = 2; axis >= 0; --axis) {
      const std::int64_t before = std::max<std::int64_t>(0, -start[axis]);
      const std::int64_t after = std::max<std::int64_t>(0, end[axis] - n[axis]);
      pad.push_back(before);
      pad.push_back(after);
      any_pad = any_pad || before > 0 || after > 0;
    }
    if (any_pad) {
      check_output_size("pad", key, x.size(0), {end[0] - start[0], end[1] - start[1], end[2] - start[2]},
                        x.element_size(), str("padding a ", n[0], "x", n[1], "x", n[2], " volume"));
      x = at::constant_pad_nd(x, pad, value);
    }
    for (int axis = 0; axis < 3; ++axis) {
      const std::int64_t offset = std::max<std::int64_t>(0, -start[axis]);
      x = x.narrow(axis + 1, start[axis] + offset, end[axis] - start[axis]);
    }
    // A compact copy (a view would pin the uncropped storage), in C order: what cache
    // entries store, and the order in which FgBgToIndices and the random chain's gathers
    // read (NIfTI data arrives x-fastest).
    v.data = compact || any_pad ? x.contiguous() : x;
    v.affine = detail::translate(v.affine, start);
  }
}

// ---------------------------------------------------------------------------
// Transforms
// ---------------------------------------------------------------------------

namespace {

// Flips `dims` of a dense tensor into a new tensor with the same memory
// order: every line along the innermost memory dim is copied whole, reversed
// if that dim is flipped (torch's generic flip indexes every element).
template <typename Word>
void flip_lines(const at::Tensor& in, at::Tensor& out, const std::vector<bool>& flipped, const std::vector<int>& order) {
  const Word* src = static_cast<const Word*>(in.data_ptr());
  Word* dst = static_cast<Word*>(out.data_ptr());
  const int inner = order.back();
  const std::int64_t n_inner = in.size(inner);
  const bool reverse = flipped[static_cast<std::size_t>(inner)];
  // Lines: all index combinations of the other dims, in memory order.
  std::int64_t lines = 1;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) lines *= in.size(order[i]);
  kernel_for(0, lines, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t line = begin; line < end; ++line) {
      std::int64_t rest = line, in_off = 0, out_off = 0;
      for (std::size_t i = order.size() - 1; i-- > 0;) {
        const int d = order[i];
        const std::int64_t k = rest % in.size(d);
        rest /= in.size(d);
        const std::int64_t src_k = flipped[static_cast<std::size_t>(d)] ? in.size(d) - 1 - k : k;
        in_off += src_k * in.stride(d);
        out_off += k * out.stride(d);
      }
      const Word* a = src + in_off;
      Word* b = dst + out_off;
      if (reverse) {
        for (std::int64_t j = 0; j < n_inner; ++j) b[j] = a[n_inner - 1 - j];
      } else {
        std::memcpy(b, a, static_cast<std::size_t>(n_inner) * sizeof(Word));
      }
    }
  });
}

}  // namespace

at::Tensor flip_dims(const at::Tensor& x, const std::vector<std::int64_t>& dims) {
  std::vector<int> order(static_cast<std::size_t>(x.dim()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x.stride(a) > x.stride(b); });
  const bool dense = use_native_kernels(x) && x.is_non_overlapping_and_dense() && x.stride(order.back()) == 1;
  const std::size_t word = x.element_size();
  if (!dense || (word != 1 && word != 2 && word != 4 && word != 8)) return x.flip(dims);
  std::vector<bool> flipped(static_cast<std::size_t>(x.dim()), false);
  for (auto d : dims) flipped[static_cast<std::size_t>(d)] = true;
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Preserve);
  switch (word) {
    case 1: flip_lines<std::uint8_t>(x, out, flipped, order); break;
    case 2: flip_lines<std::uint16_t>(x, out, flipped, order); break;
    case 4: flip_lines<std::uint32_t>(x, out, flipped, order); break;
    default: flip_lines<std::uint64_t>(x, out, flipped, order); break;
  }
  return out;
}

namespace {

class EnsureChannelFirst final : public TransformWith<EnsureChannelFirstOptions> {
 public:
  explicit EnsureChannelFirst(EnsureChannelFirstOptions o) : TransformWith("EnsureChannelFirst", std::move(o)) {}
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      const auto d = v.data.dim();
      if (d == 2) {
        // MONAI would take it as one channel of a 2-D image; every later step here needs 3D.
        throw FormatError(str("EnsureChannelFirst: key '", key, "'",
                              v.meta.source.empty() ? "" : " (" + v.meta.source + ")", " is a 2-D image (shape ",
                              v.data.size(0), " x ", v.data.size(1), "): medfast trains 3D images"));
      }
      if (d == 3) {
        v.data = v.data.unsqueeze(0);
      } else if (d == 4) {
        v.data = v.data.movedim(3, 0);  // NIfTI keeps channels (or time) last
      } else {
        throw ValueError(str("EnsureChannelFirst: key ", key, " has ", d, " dimensions; expected 2, 3 or 4"));
      }
    }
  }
};

class Spacing;

class Orientation final : public TransformWith<OrientationOptions> {
 public:
  explicit Orientation(OrientationOptions o) : TransformWith("Orientation", std::move(o)) {
    orientation_plan({2, 2, 2}, Affine(), o_.axcodes);  // validates the codes now
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) orient(s.volume(key), key, o_.axcodes);
  }
  static void orient(Volume& v, const std::string& key, const std::string& axcodes) {
    const auto plan = orientation_plan(spatial_shape(v.data, key), v.affine, axcodes);
    at::Tensor x = v.data;
    std::vector<std::int64_t> flips;
    for (int k = 0; k < 3; ++k) {
      if (plan.flip[k]) flips.push_back(plan.source_axis[k] + 1);
    }
    if (!flips.empty()) x = flip_dims(x, flips);
    // flip copies in the data's own memory order; the permute is a view.
    v.data = x.permute({0, plan.source_axis[0] + 1, plan.source_axis[1] + 1, plan.source_axis[2] + 1});
    v.affine = plan.affine;
  }
  bool apply_with_next(const Transform& next, Sample& s) const override;
};

/// An axis of at least this many voxels that Spacing maps to one voxel is an error.
constexpr std::int64_t kCollapseVoxels = 8;

class Spacing final : public TransformWith<SpacingOptions> {
 public:
  explicit Spacing(SpacingOptions o) : TransformWith("Spacing", std::move(o)) {
    if (o_.mode.empty()) o_.mode.assign(o_.keys.size(), Interp::bilinear);
    if (o_.mode.size() != o_.keys.size()) {
      throw ValueError(str("Spacing: argument mode: ", o_.mode.size(), " modes for ", o_.keys.size(), " keys"));
    }
    for (double p : o_.pixdim) {
      if (!(p > 0)) throw ValueError(str("Spacing: argument pixdim: ", p, " is not a positive spacing"));
    }
  }
  nlohmann::json config() const override {
    nlohmann::json c = fields_json(o_);
    c["diagonal"] = false;  // MONAI's fixed choices here, kept in the key of earlier caches
    c["padding_mode"] = "border";
    return c;
  }
  void apply(Sample& s) const override {
    for (std::size_t i = 0; i < o_.keys.size(); ++i) apply_key(s, i, nullptr);
  }
  const SpacingOptions& options() const { return o_; }

  /// Key i; with `axcodes`, first oriented as Orientation would, but read through the
  /// orientation (flips, axis order) by the resampling instead of copied first.
  void apply_key(Sample& s, std::size_t i, const std::string* axcodes) const {
    const std::string& key = o_.keys[i];
    Volume& v = s.volume(key);
    Shape3 in = spatial_shape(v.data, key);
    Affine from = v.affine;
    std::optional<OrientationPlan> plan;
    if (axcodes) {
      plan = orientation_plan(in, v.affine, *axcodes);
      in = plan->shape;
      from = plan->affine;
    }
    const Geometry g = spacing_geometry(in, from, o_.pixdim);
    const auto sp = from.spacing();
    const std::string why = str("input spacing (", sp[0], ", ", sp[1], ", ", sp[2], ") mm on a ", in[0], "x", in[1],
                                "x", in[2], " grid resampled to pixdim (", o_.pixdim[0], ", ", o_.pixdim[1], ", ",
                                o_.pixdim[2], ")");
    check_output_size(name(), key, v.data.size(0), g.shape, std::max<std::size_t>(v.data.element_size(), 4), why);
    for (int a = 0; a < 3; ++a) {
      // Many voxels into one: the file's spacing (pixdim, srow) is almost surely wrong.
      if (in[a] >= kCollapseVoxels && g.shape[a] == 1) {
        throw ValueError(str(name(), ": key ", key, ": ", why, " collapses axis ", a, "'s ", in[a],
                             " voxels into 1 (output shape [", g.shape[0], ", ", g.shape[1], ", ", g.shape[2],
                             "]): check the image's spacing (pixdim/srow) or the transform's pixdim"));
      }
    }
    const bool nearest = o_.mode[i] == Interp::nearest;
    at::Tensor out;
    if (plan) {
      at::Tensor x = v.data;
      if (!nearest && x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) x = x.to(at::kFloat);
      detail::InputView view;
      view.stride[0] = x.stride(0);
      view.size[0] = x.size(0);
      for (int k = 0; k < 3; ++k) {
        const int d = plan->source_axis[static_cast<std::size_t>(k)] + 1;
        view.stride[k + 1] = x.stride(d);
        view.size[k + 1] = x.size(d);
        view.flip[k + 1] = plan->flip[static_cast<std::size_t>(k)];
      }
      const at::Tensor layout =
          x.permute({0, plan->source_axis[0] + 1, plan->source_axis[1] + 1, plan->source_axis[2] + 1});
      out = detail::resample_aligned(x, view, layout, in, from, g, nearest);
      if (!out.defined()) Orientation::orient(v, key, *axcodes);  // oblique: orient, then resample
    }
    if (!out.defined()) out = resample(v.data, v.affine, g, nearest);
    v.data = out;
    v.affine = g.affine;
  }
};

// Orientation then Spacing: for the keys both transform, the one resampling reads the
// data through the orientation's flips and axis order instead of a flipped copy made
// first. The same values, geometry and errors as one after the other (the same grid,
// tables and reads).
bool Orientation::apply_with_next(const Transform& next, Sample& s) const {
  const auto* sp = dynamic_cast<const Spacing*>(&next);
  if (!sp) return false;
  const auto& okeys = o_.keys;
  const auto& skeys = sp->options().keys;
  auto has = [](const std::vector<std::string>& keys, const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) != keys.end();
  };
  for (const auto& key : okeys) {
    if (!has(skeys, key)) orient(s.volume(key), key, o_.axcodes);
  }
  for (std::size_t i = 0; i < skeys.size(); ++i) {
    sp->apply_key(s, i, has(okeys, skeys[i]) ? &o_.axcodes : nullptr);
  }
  return true;
}

}  // namespace


namespace {

// Smallest and largest index per spatial axis of voxels above `threshold` in
// any channel, in one pass in memory order. False if there are none.
template <typename T>
bool box_kernel(const at::Tensor& x, double threshold, std::array<std::int64_t, 3>& lo, std::array<std::int64_t, 3>& hi) {
  const T* p = x.data_ptr<T>();
  lo = {INT64_MAX, INT64_MAX, INT64_MAX};
  hi = {-1, -1, -1};
  int order[4] = {0, 1, 2, 3};
  std::sort(order, order + 4, [&](int a, int b) { return x.stride(a) > x.stride(b); });
  std::int64_t idx[4];
  const T thr = static_cast<T>(threshold);
  const bool exact = static_cast<double>(thr) == threshold;
  for (idx[order[0]] = 0; idx[order[0]] < x.size(order[0]); ++idx[order[0]]) {
    for (idx[order[1]] = 0; idx[order[1]] < x.size(order[1]); ++idx[order[1]]) {
      for (idx[order[2]] = 0; idx[order[2]] < x.size(order[2]); ++idx[order[2]]) {
        const T* line = p + idx[order[0]] * x.stride(order[0]) + idx[order[1]] * x.stride(order[1]) +
                        idx[order[2]] * x.stride(order[2]);
        // Only the first and last hit of a line matter.
        const std::int64_t s = x.stride(order[3]), n = x.size(order[3]);
        auto above = [&](T v) { return exact ? v > thr : static_cast<double>(v) > threshold; };
        std::int64_t first = 0;
        while (first < n && !above(line[first * s])) ++first;
        if (first == n) continue;
        std::int64_t last = n - 1;
        while (!above(line[last * s])) --last;
        for (std::int64_t at_end : {first, last}) {
          idx[order[3]] = at_end;
          for (int a = 0; a < 3; ++a) {
            lo[a] = std::min(lo[a], idx[a + 1]);
            hi[a] = std::max(hi[a], idx[a + 1]);
          }
        }
      }
    }
  }
  return hi[0] >= 0;
}

bool foreground_box(const at::Tensor& data, double threshold, std::array<std::int64_t, 3>& lo,
                    std::array<std::int64_t, 3>& hi) {
  if (!use_native_kernels(data)) {
    const at::Tensor mask = (data > threshold).any(0);
    for (int axis = 0; axis < 3; ++axis) {
      std::vector<std::int64_t> others;
      for (int d = 0; d < 3; ++d) {
        if (d != axis) others.push_back(d);
      }
      const at::Tensor hits = mask.any(others[1]).any(others[0]).nonzero();
      if (hits.numel() == 0) return false;
      lo[axis] = hits.min().item<std::int64_t>();
      hi[axis] = hits.max().item<std::int64_t>();
    }
    return true;
  }
  bool found = false;
  AT_DISPATCH_ALL_TYPES_AND(at::kBool, data.scalar_type(), "foreground_box",
                            [&] { found = box_kernel<scalar_t>(data, threshold, lo, hi); });
  return found;
}

class CropForeground final : public TransformWith<CropForegroundOptions> {
 public:
  explicit CropForeground(CropForegroundOptions o) : TransformWith("CropForeground", std::move(o)) {
    if (o_.source_key.empty()) throw ValueError("CropForeground: argument source_key is required");
    for (int i = 0; i < 3; ++i) {
      if (o_.margin[i] < 0) throw ValueError(str("CropForeground: argument margin: ", o_.margin[i], " is negative"));
      if (o_.k_divisible[i] < 1) throw ValueError(str("CropForeground: argument k_divisible: ", o_.k_divisible[i], " < 1"));
    }
  }
  void apply(Sample& s) const override {
    const Volume& src = s.volume(o_.source_key);
    const Shape3 n = spatial_shape(src.data, o_.source_key);
    std::array<std::int64_t, 3> lo{}, hi{};
    const bool found = o_.nonzero ? foreground_box(src.data.ne(0), 0.0, lo, hi)
                                  : foreground_box(src.data, o_.threshold, lo, hi);
    if (!found) {
      log::warn("CropForeground: no voxel of '", o_.source_key, "' is ", o_.nonzero ? "nonzero" : "above ",
                o_.nonzero ? "" : str(o_.threshold), "; keeping the whole volume");
      return;
    }
    Shape3 start{}, end{};
    for (int axis = 0; axis < 3; ++axis) {
      std::int64_t a = lo[axis] - o_.margin[axis];
      std::int64_t b = hi[axis] + o_.margin[axis] + 1;
      if (o_.allow_smaller) {
        a = std::max<std::int64_t>(a, 0);
        b = std::min<std::int64_t>(b, n[axis]);
      }
      // k_divisible: grow to a multiple of k around the box (MONAI's compute_divisible_spatial_size).
      const std::int64_t size = b - a;
      const std::int64_t k = o_.k_divisible[axis];
      const std::int64_t want = (size + k - 1) / k * k;
      a -= (want - size) / 2;
      start[axis] = a;
      end[axis] = a + want;
    }
    crop_or_pad(s, o_.keys, start, end, 0.0);
  }
};

class ResizeWithPadOrCrop final : public TransformWith<ResizeWithPadOrCropOptions> {
 public:
  explicit ResizeWithPadOrCrop(ResizeWithPadOrCropOptions o) : TransformWith("ResizeWithPadOrCrop", std::move(o)) {
    for (auto v : o_.spatial_size) {
      if (v < 1) throw ValueError(str("ResizeWithPadOrCrop: argument spatial_size: ", v, " is not a positive size"));
    }
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      const Shape3 n = spatial_shape(s.volume(key).data, key);
      Shape3 start{}, end{};
      for (int axis = 0; axis < 3; ++axis) {
        const std::int64_t t = o_.spatial_size[axis];
        // SpatialPad (symmetric: the extra voxel after), then CenterSpatialCrop (start = n/2 - t/2).
        start[axis] = n[axis] < t ? -((t - n[axis]) / 2) : n[axis] / 2 - t / 2;
        end[axis] = start[axis] + t;
      }
      crop_or_pad(s, {key}, start, end, o_.value);
    }
  }
};

class SpatialPad final : public TransformWith<SpatialPadOptions> {
 public:
  explicit SpatialPad(SpatialPadOptions o) : TransformWith("SpatialPad", std::move(o)) {}
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      const Shape3 n = spatial_shape(s.volume(key).data, key);
      Shape3 start{}, end{};
      bool pad = false;
      for (int axis = 0; axis < 3; ++axis) {
        const std::int64_t extra = std::max<std::int64_t>(0, o_.spatial_size[axis] - n[axis]);
        start[axis] = -(extra / 2);  // symmetric: the extra voxel after
        end[axis] = n[axis] + extra - extra / 2;
        pad = pad || extra > 0;
      }
      if (pad) crop_or_pad(s, {key}, start, end, o_.value);
    }
  }
};

}  // namespace

TransformPtr make_spatial_pad(const SpatialPadOptions& o) { return std::make_shared<SpatialPad>(o); }
TransformPtr make_ensure_channel_first(const EnsureChannelFirstOptions& o) { return std::make_shared<EnsureChannelFirst>(o); }
TransformPtr make_orientation(const OrientationOptions& o) { return std::make_shared<Orientation>(o); }
TransformPtr make_spacing(const SpacingOptions& o) { return std::make_shared<Spacing>(o); }
TransformPtr make_crop_foreground(const CropForegroundOptions& o) { return std::make_shared<CropForeground>(o); }
TransformPtr make_resize_with_pad_or_crop(const ResizeWithPadOrCropOptions& o) {
  return std::make_shared<ResizeWithPadOrCrop>(o);
}

// ---------------------------------------------------------------------------
// Entries of the transform table (registry.cpp): MONAI's arguments read into options.
// ---------------------------------------------------------------------------

namespace registry {

TransformPtr ensure_channel_first(Args& a, const nlohmann::json&) {
  return make_ensure_channel_first(read_options<EnsureChannelFirstOptions>(a));
}

TransformPtr orientation(Args& a, const nlohmann::json&) { return make_orientation(read_options<OrientationOptions>(a)); }

TransformPtr spacing(Args& a, const nlohmann::json&) { return make_spacing(read_options<SpacingOptions>(a)); }

TransformPtr crop_foreground(Args& a, const nlohmann::json&) {
  return make_crop_foreground(read_options<CropForegroundOptions>(a));
}

namespace {
/// A MONAI argument of which only its default is supported: not an option (not in the cache
/// key of earlier versions), but anything else is an error, not ignored.
void only_default(Args& a, const char* key, const char* value, const char* what) {
  const std::string given = a.text(key, value);
  if (given != value) a.fail(key, str("'", given, "' is not supported (only ", what, ")"));
}
}  // namespace

TransformPtr resize_with_pad_or_crop(Args& a, const nlohmann::json&) {
  const auto o = read_options<ResizeWithPadOrCropOptions>(a);
  only_default(a, "mode", "constant", "constant padding");
  return make_resize_with_pad_or_crop(o);
}

TransformPtr spatial_pad(Args& a, const nlohmann::json&) {
  const auto o = read_options<SpatialPadOptions>(a);
  only_default(a, "method", "symmetric", "symmetric");
  only_default(a, "mode", "constant", "constant padding");
  return make_spatial_pad(o);
}

}  // namespace registry

}  // namespace medfast::transforms
