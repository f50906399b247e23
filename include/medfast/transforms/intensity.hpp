#pragma once
/// \file Deterministic intensity and type transforms: ScaleIntensityRange,
/// NormalizeIntensity, CastToType, LoadImage, ToDevice (EnsureType).

#include <string>
#include <vector>

#include "medfast/core/fields.hpp"
#include "medfast/image/dicom.hpp"
#include "medfast/image/nifti_raw.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

struct ScaleIntensityRangeOptions {
  std::vector<std::string> keys;
  double a_min = 0, a_max = 1, b_min = 0, b_max = 1;
  bool clip = false;
  static constexpr auto fields() {
    using O = ScaleIntensityRangeOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("a_min", &O::a_min, "input value mapped to b_min"),
                           field("a_max", &O::a_max, "input value mapped to b_max"),
                           field("b_min", &O::b_min, "output of a_min"), field("b_max", &O::b_max, "output of a_max"),
                           field("clip", &O::clip, "clip the output to [b_min, b_max]"));
  }
};
struct NormalizeIntensityOptions {
  std::vector<std::string> keys;
  bool nonzero = false;
  bool channel_wise = false;
  static constexpr auto fields() {
    using O = NormalizeIntensityOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("nonzero", &O::nonzero, "statistics and scaling over nonzero voxels only"),
                           field("channel_wise", &O::channel_wise, "statistics per channel"));
  }
};
struct CastToTypeOptions {
  std::vector<std::string> keys;
  std::vector<std::string> dtype;  ///< per key: uint8, int16, float32, ...
  static constexpr auto fields() {
    using O = CastToTypeOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("dtype", &O::dtype, "type per key: uint8, int16, float32, ...").each_key("float32"));
  }
};
struct LoadImageOptions {
  std::vector<std::string> keys;
  /// Per key: the dtype to cast to (MONAI's default float32), or "" to keep the file's.
  std::vector<std::string> dtype;
  NiftiReadOptions read;
  /// DICOM SEG keys: class numbers by segment (SegmentDescription, else SegmentLabel), applied
  /// in order, the later entry winning where segments overlap (MONAI PydicomReader's
  /// label_dict). Empty: every segment gets its SegmentNumber.
  dicom::LabelDict label_dict;
  /// keys and dtype (dtype: null keeps every file's type); label_dict, a mapping read
  /// by dicom::parse_label_dict, is read beside them.
  static constexpr auto fields() {
    using O = LoadImageOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(),
                           field("dtype", &O::dtype, "type per key (\"\": the file's; null: the file's for every key)")
                               .each_key("float32"));
  }
};
struct ToDeviceOptions {
  std::vector<std::string> keys;
  std::string device = "cpu";
  static constexpr auto fields() {
    using O = ToDeviceOptions;
    return std::make_tuple(field("keys", &O::keys, "the sample keys it transforms: one key or a list").keys(), field("device", &O::device, "cpu | cuda[:N]"));
  }
};

TransformPtr make_scale_intensity_range(const ScaleIntensityRangeOptions& o);
TransformPtr make_normalize_intensity(const NormalizeIntensityOptions& o);
TransformPtr make_cast_to_type(const CastToTypeOptions& o);
TransformPtr make_load_image(const LoadImageOptions& o);
TransformPtr make_to_device(const ToDeviceOptions& o);

/// "uint8" -> at::kByte ...; throws ValueError naming `what`.
at::ScalarType parse_dtype(const std::string& name, const std::string& what);

}  // namespace medfast::transforms
