#include <yaml-cpp/yaml.h>

#include "medfast/core/error.hpp"
#include "medfast/core/settings.hpp"

namespace medfast {

void load_settings_text(Settings& settings, const std::string& text, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw FormatError(str("config file ", path, ": not valid YAML/JSON: ", e.what()));
  }
  if (!root || root.IsNull()) return;
  MEDFAST_CHECK_T(FormatError, root.IsMap(), "config file ", path, ": expected a mapping at the top level");
  const YAML::Node node = root["settings"];
  if (!node || node.IsNull()) return;
  MEDFAST_CHECK_T(FormatError, node.IsMap(), "config file ", path, ", key settings: expected a mapping of name: value");
  std::map<std::string, std::string> values;
  for (const auto& kv : node) {
    const auto key = kv.first.as<std::string>();
    MEDFAST_CHECK_T(FormatError, kv.second.IsScalar(), "config file ", path, ", key settings.", key,
                    ": expected a single value");
    values[key] = kv.second.as<std::string>();
  }
  settings.load_file_values(values, path);
}

}  // namespace medfast
