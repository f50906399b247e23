#pragma once
/// \file Deterministic intensity and type transforms: ScaleIntensityRange,
/// NormalizeIntensity, CastToType, LoadImage, ToDevice (EnsureType).

#include <string>
#include <vector>

#include "medfast/image/dicom.hpp"
#include "medfast/image/nifti_raw.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

struct ScaleIntensityRangeOptions {
  std::vector<std::string> keys;
  double a_min = 0, a_max = 1, b_min = 0, b_max = 1;
  bool clip = false;
};
struct NormalizeIntensityOptions {
  std::vector<std::string> keys;
  bool nonzero = false;
  bool channel_wise = false;
};
struct CastToTypeOptions {
  std::vector<std::string> keys;
  std::vector<std::string> dtype;  ///< per key: uint8, int16, float32, ...
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
};
struct ToDeviceOptions {
  std::vector<std::string> keys;
  std::string device = "cpu";
};

TransformPtr make_scale_intensity_range(const ScaleIntensityRangeOptions& o);
TransformPtr make_normalize_intensity(const NormalizeIntensityOptions& o);
TransformPtr make_cast_to_type(const CastToTypeOptions& o);
TransformPtr make_load_image(const LoadImageOptions& o);
TransformPtr make_to_device(const ToDeviceOptions& o);

/// "uint8" -> at::kByte ...; throws ValueError naming `what`.
at::ScalarType parse_dtype(const std::string& name, const std::string& what);

}  // namespace medfast::transforms
