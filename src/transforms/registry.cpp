// The deterministic transforms by MONAI name: make(name, args) and names(). Each
// transform lives in its own file with its entry (a function reading its arguments into
// its options); a new transform is its file and one row in MEDFAST_TRANSFORMS.
// (The random transforms' table is random_registry.cpp.)
#include "medfast/transforms/transform.hpp"


// Name, entry (defined in the transform's file; its read_options call gives the key
// table too), in the order a MONAI chain has them.
#define MEDFAST_TRANSFORMS(X)                                       \
  X("LoadImage", load_image)                     /* intensity.cpp */ \
  X("EnsureChannelFirst", ensure_channel_first)  /* spatial.cpp */   \
  X("Orientation", orientation)                  /* spatial.cpp */   \
  X("Spacing", spacing)                          /* spatial.cpp */   \
  X("ScaleIntensityRange", scale_intensity_range) /* intensity.cpp */ \
  X("NormalizeIntensity", normalize_intensity)   /* intensity.cpp */ \
  X("CropForeground", crop_foreground)           /* spatial.cpp */   \
  X("FgBgToIndices", fg_bg_to_indices)           /* indices.cpp */   \
  X("LabelToRegions", label_to_regions)          /* labels.cpp */    \
  X("ResizeWithPadOrCrop", resize_with_pad_or_crop) /* spatial.cpp */ \
  X("SpatialPad", spatial_pad)                   /* spatial.cpp */   \
  X("CastToType", cast_to_type)                  /* intensity.cpp */ \
  X("EnsureType", ensure_type)                   /* intensity.cpp */ \
  X("ToDevice", to_device)                       /* intensity.cpp */

namespace medfast::transforms {

namespace registry {
#define MEDFAST_TRANSFORM_ENTRY(name, entry) TransformPtr entry(Args& arguments, const nlohmann::json& json);
MEDFAST_TRANSFORMS(MEDFAST_TRANSFORM_ENTRY)
#undef MEDFAST_TRANSFORM_ENTRY
constexpr Registered<TransformPtr (*)(Args&, const nlohmann::json&)> kTransformRows[] = {
    MEDFAST_TRANSFORMS(MEDFAST_REGISTRY_ROW)};
constexpr EntryTable kTransforms{kTransformRows, "transform"};
}  // namespace registry

std::vector<std::string> names() { return registry::kTransforms.names(); }

std::vector<FieldDoc> argument_docs(const std::string& name) { return registry::kTransforms.docs(name); }

TransformPtr make(const std::string& name, const nlohmann::json& json, nlohmann::json* arguments) {
  return registry::kTransforms.make(registry::kTransforms.at(name), json, arguments);
}

}  // namespace medfast::transforms

#undef MEDFAST_TRANSFORMS
