#include "medfast/core/document.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/settings.hpp"

namespace medfast {

void load_settings_text(Settings& settings, const std::string& text, const std::string& path) {
  // Values as written ("1G", "0.5"): each setting's kind parses its own.
  DocumentOptions options;
  options.scalars_as_text = true;
  const nlohmann::json root = parse_yaml_document(text, str("config file ", path), options);
  if (root.is_null()) return;
  MEDFAST_CHECK_T(FormatError, root.is_object(), "config file ", path, ": expected a mapping at the top level");
  const auto node = root.find("settings");
  if (node == root.end() || node->is_null()) return;
  MEDFAST_CHECK_T(FormatError, node->is_object(), "config file ", path, ", key settings: expected a mapping of name: value");
  std::map<std::string, std::string> values;
  for (const auto& [key, value] : node->items()) {
    MEDFAST_CHECK_T(FormatError, value.is_string(), "config file ", path, ", key settings.", key,
                    ": expected a single value");
    values[key] = value.get<std::string>();
  }
  settings.load_file_values(values, path);
}

}  // namespace medfast
