// MONAI 1.3.2's arguments of the dictionary transforms medfast names (the `...d` classes'
// __init__ parameters but keys, with their defaults), as tests/golden/make_monai_transform_args.py
// recorded them in tests/reference/monai_transform_args.json. An argument of this list that a
// transform does not read is refused as MONAI's ("...: MONAI's argument 'lazy' is not supported
// by medfast"), rather than called unknown: a MONAI chain translated line by line says what it
// asks that medfast does not do. Given with MONAI's default value it changes nothing and is
// taken. tests/transforms/test_monai_arguments.cpp checks every row against the recording;
// `tests/golden/make_monai_transform_args.py --rows` prints the rows from it.
#include <algorithm>
#include <iterator>

#include "medfast/transforms/transform.hpp"

namespace medfast::transforms {

namespace {

struct MonaiArgument {
  const char* transform;
  const char* argument;
  const char* default_json;  ///< MONAI's default as JSON; nullptr: required, or no JSON value (a dtype)
};

// clang-format off
constexpr MonaiArgument kMonaiArguments[] = {
    {"LoadImage", "reader", R"(null)"},
    {"LoadImage", "dtype", nullptr},
    {"LoadImage", "meta_keys", R"(null)"},
    {"LoadImage", "meta_key_postfix", R"("meta_dict")"},
    {"LoadImage", "overwriting", R"(false)"},
    {"LoadImage", "image_only", R"(true)"},
    {"LoadImage", "ensure_channel_first", R"(false)"},
    {"LoadImage", "simple_keys", R"(false)"},
    {"LoadImage", "prune_meta_pattern", R"(null)"},
    {"LoadImage", "prune_meta_sep", R"(".")"},
    {"LoadImage", "allow_missing_keys", R"(false)"},
    {"LoadImage", "expanduser", R"(true)"},
    {"EnsureChannelFirst", "strict_check", R"(true)"},
    {"EnsureChannelFirst", "allow_missing_keys", R"(false)"},
    {"EnsureChannelFirst", "channel_dim", R"(null)"},
    {"Orientation", "axcodes", R"(null)"},
    {"Orientation", "as_closest_canonical", R"(false)"},
    {"Orientation", "labels", nullptr},
    {"Orientation", "allow_missing_keys", R"(false)"},
    {"Orientation", "lazy", R"(false)"},
    {"Spacing", "pixdim", nullptr},
    {"Spacing", "diagonal", R"(false)"},
    {"Spacing", "mode", R"("bilinear")"},
    {"Spacing", "padding_mode", R"("border")"},
    {"Spacing", "align_corners", R"(false)"},
    {"Spacing", "dtype", nullptr},
    {"Spacing", "scale_extent", R"(false)"},
    {"Spacing", "recompute_affine", R"(false)"},
    {"Spacing", "min_pixdim", R"(null)"},
    {"Spacing", "max_pixdim", R"(null)"},
    {"Spacing", "ensure_same_shape", R"(true)"},
    {"Spacing", "allow_missing_keys", R"(false)"},
    {"Spacing", "lazy", R"(false)"},
    {"ScaleIntensityRange", "a_min", nullptr},
    {"ScaleIntensityRange", "a_max", nullptr},
    {"ScaleIntensityRange", "b_min", R"(null)"},
    {"ScaleIntensityRange", "b_max", R"(null)"},
    {"ScaleIntensityRange", "clip", R"(false)"},
    {"ScaleIntensityRange", "dtype", nullptr},
    {"ScaleIntensityRange", "allow_missing_keys", R"(false)"},
    {"NormalizeIntensity", "subtrahend", R"(null)"},
    {"NormalizeIntensity", "divisor", R"(null)"},
    {"NormalizeIntensity", "nonzero", R"(false)"},
    {"NormalizeIntensity", "channel_wise", R"(false)"},
    {"NormalizeIntensity", "dtype", nullptr},
    {"NormalizeIntensity", "allow_missing_keys", R"(false)"},
    {"CropForeground", "source_key", nullptr},
    {"CropForeground", "select_fn", nullptr},
    {"CropForeground", "channel_indices", R"(null)"},
    {"CropForeground", "margin", R"(0)"},
    {"CropForeground", "allow_smaller", R"(true)"},
    {"CropForeground", "k_divisible", R"(1)"},
    {"CropForeground", "mode", R"("constant")"},
    {"CropForeground", "start_coord_key", R"("foreground_start_coord")"},
    {"CropForeground", "end_coord_key", R"("foreground_end_coord")"},
    {"CropForeground", "allow_missing_keys", R"(false)"},
    {"CropForeground", "lazy", R"(false)"},
    {"FgBgToIndices", "fg_postfix", R"("_fg_indices")"},
    {"FgBgToIndices", "bg_postfix", R"("_bg_indices")"},
    {"FgBgToIndices", "image_key", R"(null)"},
    {"FgBgToIndices", "image_threshold", R"(0.0)"},
    {"FgBgToIndices", "output_shape", R"(null)"},
    {"FgBgToIndices", "allow_missing_keys", R"(false)"},
    {"ResizeWithPadOrCrop", "spatial_size", nullptr},
    {"ResizeWithPadOrCrop", "mode", R"("constant")"},
    {"ResizeWithPadOrCrop", "allow_missing_keys", R"(false)"},
    {"ResizeWithPadOrCrop", "method", R"("symmetric")"},
    {"ResizeWithPadOrCrop", "lazy", R"(false)"},
    {"SpatialPad", "spatial_size", nullptr},
    {"SpatialPad", "method", R"("symmetric")"},
    {"SpatialPad", "mode", R"("constant")"},
    {"SpatialPad", "allow_missing_keys", R"(false)"},
    {"SpatialPad", "lazy", R"(false)"},
    {"CastToType", "dtype", nullptr},
    {"CastToType", "allow_missing_keys", R"(false)"},
    {"EnsureType", "data_type", R"("tensor")"},
    {"EnsureType", "dtype", R"(null)"},
    {"EnsureType", "device", R"(null)"},
    {"EnsureType", "wrap_sequence", R"(true)"},
    {"EnsureType", "track_meta", R"(null)"},
    {"EnsureType", "allow_missing_keys", R"(false)"},
    {"ToDevice", "device", nullptr},
    {"ToDevice", "allow_missing_keys", R"(false)"},
    {"ConvertToMultiChannelBasedOnBratsClasses", "allow_missing_keys", R"(false)"},
    {"MapLabelValue", "orig_labels", nullptr},
    {"MapLabelValue", "target_labels", nullptr},
    {"MapLabelValue", "dtype", nullptr},
    {"MapLabelValue", "allow_missing_keys", R"(false)"},
    {"RandCropByPosNegLabel", "label_key", nullptr},
    {"RandCropByPosNegLabel", "spatial_size", nullptr},
    {"RandCropByPosNegLabel", "pos", R"(1.0)"},
    {"RandCropByPosNegLabel", "neg", R"(1.0)"},
    {"RandCropByPosNegLabel", "num_samples", R"(1)"},
    {"RandCropByPosNegLabel", "image_key", R"(null)"},
    {"RandCropByPosNegLabel", "image_threshold", R"(0.0)"},
    {"RandCropByPosNegLabel", "fg_indices_key", R"(null)"},
    {"RandCropByPosNegLabel", "bg_indices_key", R"(null)"},
    {"RandCropByPosNegLabel", "allow_smaller", R"(false)"},
    {"RandCropByPosNegLabel", "allow_missing_keys", R"(false)"},
    {"RandCropByPosNegLabel", "lazy", R"(false)"},
    {"RandSpatialCrop", "roi_size", nullptr},
    {"RandSpatialCrop", "max_roi_size", R"(null)"},
    {"RandSpatialCrop", "random_center", R"(true)"},
    {"RandSpatialCrop", "random_size", R"(false)"},
    {"RandSpatialCrop", "allow_missing_keys", R"(false)"},
    {"RandSpatialCrop", "lazy", R"(false)"},
    {"RandFlip", "prob", R"(0.1)"},
    {"RandFlip", "spatial_axis", R"(null)"},
    {"RandFlip", "allow_missing_keys", R"(false)"},
    {"RandFlip", "lazy", R"(false)"},
    {"RandRotate90", "prob", R"(0.1)"},
    {"RandRotate90", "max_k", R"(3)"},
    {"RandRotate90", "spatial_axes", R"([0, 1])"},
    {"RandRotate90", "allow_missing_keys", R"(false)"},
    {"RandRotate90", "lazy", R"(false)"},
    {"RandRotate", "range_x", R"(0.0)"},
    {"RandRotate", "range_y", R"(0.0)"},
    {"RandRotate", "range_z", R"(0.0)"},
    {"RandRotate", "prob", R"(0.1)"},
    {"RandRotate", "keep_size", R"(true)"},
    {"RandRotate", "mode", R"("bilinear")"},
    {"RandRotate", "padding_mode", R"("border")"},
    {"RandRotate", "align_corners", R"(false)"},
    {"RandRotate", "dtype", nullptr},
    {"RandRotate", "allow_missing_keys", R"(false)"},
    {"RandRotate", "lazy", R"(false)"},
    {"RandZoom", "prob", R"(0.1)"},
    {"RandZoom", "min_zoom", R"(0.9)"},
    {"RandZoom", "max_zoom", R"(1.1)"},
    {"RandZoom", "mode", R"("area")"},
    {"RandZoom", "padding_mode", R"("edge")"},
    {"RandZoom", "align_corners", R"(null)"},
    {"RandZoom", "dtype", nullptr},
    {"RandZoom", "keep_size", R"(true)"},
    {"RandZoom", "allow_missing_keys", R"(false)"},
    {"RandZoom", "lazy", R"(false)"},
    {"RandAffine", "spatial_size", R"(null)"},
    {"RandAffine", "prob", R"(0.1)"},
    {"RandAffine", "rotate_range", R"(null)"},
    {"RandAffine", "shear_range", R"(null)"},
    {"RandAffine", "translate_range", R"(null)"},
    {"RandAffine", "scale_range", R"(null)"},
    {"RandAffine", "mode", R"("bilinear")"},
    {"RandAffine", "padding_mode", R"("reflection")"},
    {"RandAffine", "cache_grid", R"(false)"},
    {"RandAffine", "device", R"(null)"},
    {"RandAffine", "allow_missing_keys", R"(false)"},
    {"RandAffine", "lazy", R"(false)"},
    {"RandScaleIntensity", "factors", nullptr},
    {"RandScaleIntensity", "prob", R"(0.1)"},
    {"RandScaleIntensity", "channel_wise", R"(false)"},
    {"RandScaleIntensity", "dtype", nullptr},
    {"RandScaleIntensity", "allow_missing_keys", R"(false)"},
    {"RandShiftIntensity", "offsets", nullptr},
    {"RandShiftIntensity", "safe", R"(false)"},
    {"RandShiftIntensity", "factor_key", R"(null)"},
    {"RandShiftIntensity", "meta_keys", R"(null)"},
    {"RandShiftIntensity", "meta_key_postfix", R"("meta_dict")"},
    {"RandShiftIntensity", "prob", R"(0.1)"},
    {"RandShiftIntensity", "channel_wise", R"(false)"},
    {"RandShiftIntensity", "allow_missing_keys", R"(false)"},
    {"RandGaussianNoise", "prob", R"(0.1)"},
    {"RandGaussianNoise", "mean", R"(0.0)"},
    {"RandGaussianNoise", "std", R"(0.1)"},
    {"RandGaussianNoise", "dtype", nullptr},
    {"RandGaussianNoise", "allow_missing_keys", R"(false)"},
    {"RandGaussianNoise", "sample_std", R"(true)"},
    {"RandGaussianSmooth", "sigma_x", R"([0.25, 1.5])"},
    {"RandGaussianSmooth", "sigma_y", R"([0.25, 1.5])"},
    {"RandGaussianSmooth", "sigma_z", R"([0.25, 1.5])"},
    {"RandGaussianSmooth", "approx", R"("erf")"},
    {"RandGaussianSmooth", "prob", R"(0.1)"},
    {"RandGaussianSmooth", "allow_missing_keys", R"(false)"},
    {"RandAdjustContrast", "prob", R"(0.1)"},
    {"RandAdjustContrast", "gamma", R"([0.5, 4.5])"},
    {"RandAdjustContrast", "invert_image", R"(false)"},
    {"RandAdjustContrast", "retain_stats", R"(false)"},
    {"RandAdjustContrast", "allow_missing_keys", R"(false)"},
};
// clang-format on

}  // namespace

void refuse_monai_arguments(Args& a) {
  for (const auto& key : a.unread()) {
    const auto* row = std::find_if(std::begin(kMonaiArguments), std::end(kMonaiArguments), [&](const MonaiArgument& m) {
      return a.where() == m.transform && key == m.argument;
    });
    if (row == std::end(kMonaiArguments)) continue;  // not MONAI's: finish() calls it unknown
    // Given with MONAI's default, it changes nothing: taken.
    if (row->default_json && a.raw(key) == nlohmann::json::parse(row->default_json)) continue;
    throw ConfigError(str(a.where(), ": MONAI's argument '", key, "' is not supported by medfast",
                          row->default_json ? str(" (only its default, ", row->default_json, ")") : std::string()));
  }
}

bool is_monai_argument(const std::string& transform, const std::string& argument) {
  return std::any_of(std::begin(kMonaiArguments), std::end(kMonaiArguments), [&](const MonaiArgument& m) {
    return transform == m.transform && argument == m.argument;
  });
}

}  // namespace medfast::transforms
