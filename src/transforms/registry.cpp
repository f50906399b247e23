// The deterministic transforms by MONAI name: make(name, args) and names(). Each
// transform lives in its own file with its entry (a function reading its arguments into
// its options); a new transform is its file, its entry's declaration and one row here.
// (The random transforms' table is random_registry.cpp.)
#include "medfast/transforms/transform.hpp"

#include <iterator>

#include "medfast/core/error.hpp"

namespace medfast::transforms {

namespace registry {

TransformPtr load_image(Args& a, const nlohmann::json& json);                  // intensity.cpp
TransformPtr ensure_channel_first(Args& a, const nlohmann::json& json);        // spatial.cpp
TransformPtr orientation(Args& a, const nlohmann::json& json);                 // spatial.cpp
TransformPtr spacing(Args& a, const nlohmann::json& json);                     // spatial.cpp
TransformPtr scale_intensity_range(Args& a, const nlohmann::json& json);       // intensity.cpp
TransformPtr normalize_intensity(Args& a, const nlohmann::json& json);         // intensity.cpp
TransformPtr crop_foreground(Args& a, const nlohmann::json& json);             // spatial.cpp
TransformPtr fg_bg_to_indices(Args& a, const nlohmann::json& json);            // indices.cpp
TransformPtr resize_with_pad_or_crop(Args& a, const nlohmann::json& json);     // spatial.cpp
TransformPtr cast_to_type(Args& a, const nlohmann::json& json);                // intensity.cpp
TransformPtr ensure_type(Args& a, const nlohmann::json& json);                 // intensity.cpp
TransformPtr to_device(Args& a, const nlohmann::json& json);                   // intensity.cpp

}  // namespace registry

namespace {

struct Entry {
  const char* name;
  TransformPtr (*make)(Args& arguments, const nlohmann::json& json);
};

// In the order a MONAI chain usually has them (names() lists them so).
constexpr Entry kTransforms[] = {
    {"LoadImage", &registry::load_image},
    {"EnsureChannelFirst", &registry::ensure_channel_first},
    {"Orientation", &registry::orientation},
    {"Spacing", &registry::spacing},
    {"ScaleIntensityRange", &registry::scale_intensity_range},
    {"NormalizeIntensity", &registry::normalize_intensity},
    {"CropForeground", &registry::crop_foreground},
    {"FgBgToIndices", &registry::fg_bg_to_indices},
    {"ResizeWithPadOrCrop", &registry::resize_with_pad_or_crop},
    {"CastToType", &registry::cast_to_type},
    {"EnsureType", &registry::ensure_type},
    {"ToDevice", &registry::to_device},
};

}  // namespace

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const auto& e : kTransforms) out.push_back(e.name);
  return out;
}

TransformPtr make(const std::string& name, const nlohmann::json& json) {
  for (const auto& e : kTransforms) {
    if (name != e.name) continue;
    Args a(name, json);
    TransformPtr t = e.make(a, json);
    a.finish();
    return t;
  }
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw ValueError(str("unknown transform '", name, "' (known: ", known, ")"));
}

}  // namespace medfast::transforms
