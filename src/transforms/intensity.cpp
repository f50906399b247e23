#include "medfast/transforms/intensity.hpp"

#include "kernel_for.hpp"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "medfast/core/error.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/transforms/indices.hpp"
#include "medfast/transforms/spatial.hpp"

namespace medfast::transforms {

at::ScalarType parse_dtype(const std::string& name, const std::string& what) {
  return medfast::parse_dtype(name, what);
}

namespace {


class ScaleIntensityRange final : public TransformWith<ScaleIntensityRangeOptions> {
 public:
  explicit ScaleIntensityRange(ScaleIntensityRangeOptions o) : TransformWith("ScaleIntensityRange", std::move(o)) {
    if (o_.a_max == o_.a_min) throw ValueError("ScaleIntensityRange: arguments a_min and a_max must differ");
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      // MONAI's operations in MONAI's order, in float32 (its default dtype), fused into
      // one pass from the input (any real dtype) into a new tensor in its memory order.
      if (!use_native_kernels(v.data) || !v.data.is_non_overlapping_and_dense() ||
          !(v.data.scalar_type() == at::kFloat || v.data.scalar_type() == at::kDouble ||
            v.data.scalar_type() == at::kShort || v.data.scalar_type() == at::kInt ||
            v.data.scalar_type() == at::kByte || v.data.scalar_type() == at::kChar)) {
        at::Tensor x = v.data.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);  // CUDA/ROCm, other dtypes
        x.sub_(o_.a_min).div_(o_.a_max - o_.a_min).mul_(o_.b_max - o_.b_min).add_(o_.b_min);
        if (o_.clip) x.clamp_(std::min(o_.b_min, o_.b_max), std::max(o_.b_min, o_.b_max));
        v.data = x;
        continue;
      }
      const at::Tensor in = v.data;
      at::Tensor x = at::empty_strided(in.sizes(), in.strides(), in.options().dtype(at::kFloat));
      const float a_min = static_cast<float>(o_.a_min), range = static_cast<float>(o_.a_max - o_.a_min);
      const float b_range = static_cast<float>(o_.b_max - o_.b_min), b_min = static_cast<float>(o_.b_min);
      const float lo = static_cast<float>(std::min(o_.b_min, o_.b_max)), hi = static_cast<float>(std::max(o_.b_min, o_.b_max));
      const bool clip = o_.clip;
      float* p = x.data_ptr<float>();
      // Dense with the same strides: element i of the storage span is element i of both.
      AT_DISPATCH_ALL_TYPES(in.scalar_type(), "scale_intensity_range", [&] {
        const scalar_t* q = in.data_ptr<scalar_t>();
        kernel_for(0, x.numel(), 1 << 16, [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i) {
            float y = (static_cast<float>(q[i]) - a_min) / range * b_range + b_min;
            if (clip) y = y < lo ? lo : (y > hi ? hi : y);
            p[i] = y;
          }
        });
      });
      v.data = x;
    }
  }
};

class NormalizeIntensity final : public TransformWith<NormalizeIntensityOptions> {
 public:
  explicit NormalizeIntensity(NormalizeIntensityOptions o) : TransformWith("NormalizeIntensity", std::move(o)) {}
  static at::Tensor normalize(at::Tensor x, bool nonzero) {
    const at::Tensor mask = nonzero ? (x != 0) : at::ones_like(x, at::kBool);
    const at::Tensor values = x.masked_select(mask);
    if (values.numel() == 0) return x;
    const double mean = values.mean().item<double>();
    double sd = values.numel() > 1 ? values.std(/*unbiased=*/false).item<double>() : 0.0;
    if (sd == 0) sd = 1;  // as MONAI: a constant image is only shifted
    const at::Tensor y = (x - mean) / sd;
    return nonzero ? at::where(mask, y, x) : y;
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      at::Tensor x = v.data.to(at::kFloat);
      if (o_.channel_wise && x.dim() > 1) {
        std::vector<at::Tensor> channels;
        for (std::int64_t c = 0; c < x.size(0); ++c) channels.push_back(normalize(x[c], o_.nonzero));
        v.data = at::stack(channels);
      } else {
        v.data = normalize(x, o_.nonzero);
      }
    }
  }
};

class CastToType final : public TransformWith<CastToTypeOptions> {
 public:
  explicit CastToType(CastToTypeOptions o) : TransformWith("CastToType", std::move(o)) {
    if (o_.dtype.size() != o_.keys.size()) throw ValueError("CastToType: argument dtype: one dtype per key");
    for (const auto& d : o_.dtype) types_.push_back(parse_dtype(d, "CastToType: argument dtype"));
  }
  void apply(Sample& s) const override {
    for (std::size_t i = 0; i < o_.keys.size(); ++i) {
      Volume& v = s.volume(o_.keys[i]);
      v.data = v.data.to(types_[i]);
    }
  }

 private:
  std::vector<at::ScalarType> types_;
};

class LoadImage final : public TransformWith<LoadImageOptions> {
 public:
  explicit LoadImage(LoadImageOptions o) : TransformWith("LoadImage", std::move(o)) {
    if (o_.dtype.empty()) o_.dtype.assign(o_.keys.size(), "float32");
    if (o_.dtype.size() != o_.keys.size()) throw ValueError("LoadImage: argument dtype: one dtype per key");
    for (const auto& d : o_.dtype) {
      if (!d.empty()) parse_dtype(d, "LoadImage: argument dtype");
    }
    for (const auto& [name, value] : o_.label_dict) {
      if (value < 0 || value > 255) {
        throw ValueError(str("LoadImage: argument label_dict: class ", value, " for '", name, "' is outside 0..255"));
      }
    }
  }
  nlohmann::json config() const override {
    nlohmann::json c = fields_json(o_);
    if (!o_.label_dict.empty()) c["label_dict"] = o_.label_dict;  // (absent: NIfTI chains keep their hash)
    return c;
  }
  void apply(Sample& s) const override {
    ImageReadOptions read;
    read.nifti = o_.read;
    read.label_dict = o_.label_dict;
    if (s.meta.contains("series_uid") && s.meta["series_uid"].is_string()) {
      read.series_uid = s.meta["series_uid"].get<std::string>();
    }
    // Images first, then DICOM SEG labels, which are placed on the series they reference.
    std::vector<std::pair<std::size_t, std::string>> segs;
    for (std::size_t i = 0; i < o_.keys.size(); ++i) {
      const std::string& key = o_.keys[i];
      const std::vector<std::string> paths = paths_of(s, key);
      if (paths.size() > 1) {
        finish(s, i, read_channel_files(key, paths, read), join_paths(paths));
        continue;
      }
      const std::string& path = paths.front();
      if (is_dicom(path) && dicom::is_seg_file(path)) {
        segs.emplace_back(i, path);
        continue;
      }
      finish(s, i, read_image(path, read), path);
    }
    for (const auto& [i, path] : segs) {
      const Volume& reference = reference_for(s, o_.keys[i], path);
      finish(s, i, read_seg_volume(path, reference, read), path);
    }
    check_one_grid(s);
  }

 private:
  /// The key's file, or its channel files (a list: stacked in order).
  std::vector<std::string> paths_of(const Sample& s, const std::string& key) const {
    const bool list =
        s.meta.contains(key) && s.meta[key].is_array() && !s.meta[key].empty() &&
        std::all_of(s.meta[key].begin(), s.meta[key].end(), [](const nlohmann::json& p) { return p.is_string(); });
    if (!s.meta.contains(key) || !(s.meta[key].is_string() || list)) {
      throw ValueError(str("LoadImage: the item has no file for key '", key, "'"));
    }
    std::vector<std::string> paths;
    for (const auto& p : list ? s.meta[key] : nlohmann::json::array({s.meta[key]})) {
      std::string path = p.get<std::string>();
      if (!path.empty() && path[0] != '/' && s.meta.contains("base_dir")) {
        path = s.meta["base_dir"].get<std::string>() + "/" + path;
      }
      paths.push_back(std::move(path));
    }
    return paths;
  }
  std::string path_of(const Sample& s, const std::string& key) const { return join_paths(paths_of(s, key)); }
  static std::string join_paths(const std::vector<std::string>& paths) {
    std::string text;
    for (const auto& p : paths) text += (text.empty() ? "" : " + ") + p;
    return text;
  }

  /// A key's channel files read and stacked as channels, in order (MONAI's LoadImage of a
  /// list of files: channel-first there, channels last here as NIfTI keeps them, so that
  /// EnsureChannelFirst moves them first as for a 4D file). Each file lies on the first's
  /// grid: the same shape, spacing, orientation and origin (to 0.001 mm), else FormatError
  /// naming both files and what differs.
  Volume read_channel_files(const std::string& key, const std::vector<std::string>& paths,
                            const ImageReadOptions& read) const {
    Volume first = read_image(paths.front(), read);
    std::vector<at::Tensor> channels;
    const auto as_channels = [&](const Volume& v, const std::string& path) {
      if (v.data.dim() == 3) return v.data.unsqueeze(3);
      if (v.data.dim() == 4) return v.data;
      throw FormatError(str("LoadImage: key '", key, "': channel file ", path, " has ", v.data.dim(),
                            " dimensions (shape ", v.data.sizes(),
                            "); a channel file is a 3D image (or 3D with channels)"));
    };
    channels.push_back(as_channels(first, paths.front()));
    for (std::size_t c = 1; c < paths.size(); ++c) {
      Volume v = read_image(paths[c], read);
      const std::string both =
          str("LoadImage: key '", key, "': channel file ", paths[c], " is not on the grid of ", paths.front(), ": ");
      const auto spatial = [](const Volume& x) {
        return std::vector<std::int64_t>(x.data.sizes().begin(),
                                         x.data.sizes().begin() + std::min<std::int64_t>(3, x.data.dim()));
      };
      if (spatial(v) != spatial(first)) {
        throw FormatError(str(both, "shape ", at::IntArrayRef(spatial(v)), " vs ", at::IntArrayRef(spatial(first)),
                              " (an image's channel files must share one grid)"));
      }
      const auto sa = first.spacing(), sb = v.spacing();
      for (int d = 0; d < 3; ++d) {
        if (std::abs(sa[d] - sb[d]) > 1e-3) {
          throw FormatError(str(both, "spacing ", sb[0], " x ", sb[1], " x ", sb[2], " mm vs ", sa[0], " x ", sa[1],
                                " x ", sa[2], " mm"));
        }
      }
      if (v.axcodes() != first.axcodes()) {
        throw FormatError(str(both, "orientation ", v.axcodes(), " vs ", first.axcodes()));
      }
      if (const double diff = first.affine.max_abs_diff(v.affine); diff > 1e-3) {
        throw FormatError(str(both, "affine (origin or direction) differs by up to ", diff, " mm (allowed 0.001)\n",
                              v.affine.to_string(), "\nvs\n", first.affine.to_string()));
      }
      channels.push_back(as_channels(v, paths[c]));
    }
    // One type for all: the widest of the files' (a float channel beside integer ones stays float).
    at::ScalarType type = channels.front().scalar_type();
    for (const auto& t : channels) type = at::promote_types(type, t.scalar_type());
    for (auto& t : channels) t = t.to(type);
    first.data = at::cat(channels, 3);
    return first;
  }

  /// An item's files lie on one grid: the same spatial shape, and affines equal to a
  /// thousandth of a millimetre (nnU-Net's dataset check, as `plan`'s). A label of another
  /// case or resolution would otherwise be cropped and trained on with the image (CropForeground
  /// cuts both with one box) and scored without a word.
  void check_one_grid(const Sample& s) const {
    const std::string& first = o_.keys.front();
    const Volume& a = s.volume(first);
    for (std::size_t i = 1; i < o_.keys.size(); ++i) {
      const Volume& b = s.volume(o_.keys[i]);
      const auto describe = [&](const std::string& key, const Volume& v) {
        return str("key '", key, "' (", path_of(s, key), ") ", v.data.size(0), "x", v.data.size(1), "x",
                   v.data.size(2));
      };
      if (a.data.dim() < 3 || b.data.dim() < 3) continue;  // not volumes: no grid to compare
      bool same = true;
      for (int d = 0; d < 3; ++d) same = same && a.data.size(d) == b.data.size(d);
      if (!same) {
        throw FormatError(str("LoadImage: ", describe(o_.keys[i], b), " is not on the grid of ", describe(first, a),
                              ": an item's files must have one spatial shape"));
      }
      const double diff = a.affine.max_abs_diff(b.affine);
      if (diff > 1e-3) {
        throw FormatError(str("LoadImage: key '", o_.keys[i], "' (", path_of(s, o_.keys[i]),
                              ") is not on the grid of key '", first, "' (", path_of(s, first),
                              "): their affines differ by up to ", diff, " mm (allowed 0.001)\n", b.affine.to_string(),
                              "\nvs\n", a.affine.to_string()));
      }
    }
  }

  void finish(Sample& s, std::size_t i, Volume v, const std::string& path) const {
    // NaN or infinite voxels would go on into every later step and show up far away (a crop
    // "larger than the image" once CropForeground found no foreground, a NaN loss): named
    // here, with the file and how many.
    if (v.data.is_floating_point()) {
      const std::int64_t bad = at::isfinite(v.data).logical_not().sum().item<std::int64_t>();
      if (bad > 0) {
        const std::int64_t nan = at::isnan(v.data).sum().item<std::int64_t>();
        throw FormatError(str("LoadImage: key '", o_.keys[i], "' (", path, "): ", bad, " of ", v.data.numel(),
                              " voxels are not finite (", nan, " NaN, ", bad - nan,
                              " infinite); medfast trains on finite values only: replace them in the file (e.g. "
                              "numpy.nan_to_num) or leave the case out"));
      }
    }
    if (!o_.dtype[i].empty()) {
      const at::ScalarType to = parse_dtype(o_.dtype[i], "LoadImage");
      check_exact(v.data, to, i, path);
      v.data = v.data.to(to);
    }
    s.volumes[o_.keys[i]] = std::move(v);
  }

  /// A cast to an integer dtype keeps every value (a label read as uint8): a fraction or a
  /// value out of its range would silently become another class.
  void check_exact(const at::Tensor& x, at::ScalarType to, std::size_t i, const std::string& path) const {
    if (at::isFloatingType(to) || to == at::kBool || x.scalar_type() == to || x.numel() == 0) return;
    const std::string what =
        str("LoadImage: key '", o_.keys[i], "' (", path, "): dtype ", o_.dtype[i], " cannot hold its ",
            x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ? "float " : "", "values: ");
    if (x.is_floating_point()) {
      const at::Tensor fractional = x != x.trunc();
      const std::int64_t n = fractional.sum().item<std::int64_t>();
      if (n > 0) {
        throw FormatError(str(what, n, " of ", x.numel(), " voxels are not whole numbers (e.g. ",
                              x.masked_select(fractional)[0].item<double>(),
                              "); a label holds class indices: fix the file, or read it as float32"));
      }
    }
    const auto [lo_t, hi_t] = at::aminmax(x.to(at::kDouble));
    const double lo = lo_t.item<double>(), hi = hi_t.item<double>();
    const auto [min, max] = [&]() -> std::pair<double, double> {
      switch (to) {
        case at::kByte:
          return {0, 255};
        case at::kChar:
          return {-128, 127};
        case at::kShort:
          return {-32768, 32767};
        case at::kInt:
          return {-2147483648.0, 2147483647.0};
        default:
          return {-9.2e18, 9.2e18};
      }
    }();
    if (lo < min || hi > max) {
      throw FormatError(str(what, "they range from ", lo, " to ", hi, ", beyond ", min, "..", max,
                            ": read it as a wider type (int16, int32)"));
    }
  }

  /// The DICOM series volume of this sample that the SEG at `path` references.
  const Volume& reference_for(const Sample& s, const std::string& key, const std::string& path) const {
    const dicom::Series seg = dicom::scan_seg(path);
    std::vector<const Volume*> candidates;
    std::string loaded;
    for (const auto& [k, v] : s.volumes) {
      if (!v.meta.dicom) continue;
      loaded += (loaded.empty() ? "" : ", ") + k + " (series " + v.meta.dicom->series_uid + ")";
      const auto& refs = seg.referenced_series;
      // One candidate per series: a label already placed on a series carries that series too.
      const bool seen = std::any_of(candidates.begin(), candidates.end(), [&](const Volume* c) {
        return c->meta.dicom->series_uid == v.meta.dicom->series_uid;
      });
      if (!seen && (refs.empty() || std::find(refs.begin(), refs.end(), v.meta.dicom->series_uid) != refs.end())) {
        candidates.push_back(&v);
      }
    }
    if (candidates.size() == 1) return *candidates.front();
    std::string refs;
    for (const auto& r : seg.referenced_series) refs += (refs.empty() ? "" : ", ") + r;
    if (candidates.empty()) {
      throw FormatError(str("LoadImage: key '", key, "': ", path, ": the SEG references series ",
                            refs.empty() ? std::string("(none named)") : refs, " (ReferencedSeriesSequence), but ",
                            loaded.empty() ? std::string("no key of this item is a DICOM series")
                                           : "this item's DICOM series are " + loaded));
    }
    throw FormatError(str("LoadImage: key '", key, "': ", path, ": the SEG names no ReferencedSeriesSequence and ",
                          "this item has several DICOM series (", loaded, "): which one it labels is ambiguous"));
  }

};

class ToDevice final : public TransformWith<ToDeviceOptions> {
 public:
  ToDevice(ToDeviceOptions o, std::string name) : TransformWith(std::move(name), std::move(o)), device_(o_.device) {}
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      Volume& v = s.volume(key);
      v.data = v.data.to(device_);
    }
  }

 private:
  at::Device device_;
};

}  // namespace

TransformPtr make_scale_intensity_range(const ScaleIntensityRangeOptions& o) { return std::make_shared<ScaleIntensityRange>(o); }
TransformPtr make_normalize_intensity(const NormalizeIntensityOptions& o) { return std::make_shared<NormalizeIntensity>(o); }
TransformPtr make_cast_to_type(const CastToTypeOptions& o) { return std::make_shared<CastToType>(o); }
TransformPtr make_load_image(const LoadImageOptions& o) { return std::make_shared<LoadImage>(o); }
TransformPtr make_to_device(const ToDeviceOptions& o) { return std::make_shared<ToDevice>(o, "ToDevice"); }

// ---------------------------------------------------------------------------
// Entries of the transform table (registry.cpp): MONAI's arguments read into options.
// ---------------------------------------------------------------------------

namespace {

/// label_dict: [[name, class], ...] in order (a YAML/JSON mapping arrives as such a list,
/// in the order written: data/pipeline.cpp keeps it), or a mapping (applied by class).
dicom::LabelDict parse_label_dict(Args& a, const nlohmann::json& j) {
  try {
    return dicom::parse_label_dict(j);
  } catch (const ValueError& e) {
    a.fail("label_dict", e.what());
  }
}

}  // namespace


namespace registry {

TransformPtr load_image(Args& a, const nlohmann::json& json) {
  LoadImageOptions o = read_options<LoadImageOptions>(a);
  if (json.contains("dtype") && json["dtype"].is_null()) o.dtype.assign(o.keys.size(), "");  // every file's own type
  a.flag("image_only", true);  // medfast always keeps the geometry with the image
  if (a.has("label_dict")) o.label_dict = parse_label_dict(a, a.raw("label_dict"));
  return make_load_image(o);
}

TransformPtr scale_intensity_range(Args& a, const nlohmann::json&) {
  return make_scale_intensity_range(read_options<ScaleIntensityRangeOptions>(a));
}

TransformPtr normalize_intensity(Args& a, const nlohmann::json&) {
  return make_normalize_intensity(read_options<NormalizeIntensityOptions>(a));
}

TransformPtr cast_to_type(Args& a, const nlohmann::json&) { return make_cast_to_type(read_options<CastToTypeOptions>(a)); }

TransformPtr to_device(Args& a, const nlohmann::json&) {
  return std::make_shared<ToDevice>(read_options<ToDeviceOptions>(a), "ToDevice");
}

TransformPtr ensure_type(Args& a, const nlohmann::json&) {
  const auto o = read_options<ToDeviceOptions>(a);
  a.text("data_type", "tensor");  // EnsureType's data_type is always a tensor here
  return std::make_shared<ToDevice>(o, "EnsureType");
}

}  // namespace registry

}  // namespace medfast::transforms
