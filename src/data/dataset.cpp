#include "medfast/data/dataset.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/os/file.hpp"

namespace medfast::data {

std::string resolve_path(const std::string& base, const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  std::string rel = p;
  while (rel.rfind("./", 0) == 0) rel = rel.substr(2);
  return base + "/" + rel;
}

namespace {

Dataset from_json(const std::string& path, const std::string& section) {
  const nlohmann::json j = parse_json_document(os::read_text_file(path), path);
  const std::string base = os::parent_directory(path);
  const nlohmann::json* list = nullptr;
  if (j.is_array()) {
    list = &j;
  } else if (j.is_object() && j.contains(section)) {
    list = &j[section];
  } else {
    throw FormatError(str(path, ": no section '", section, "' (expected an MSD dataset.json or a list of items)"));
  }
  if (!list->is_array()) throw FormatError(str(path, ": section '", section, "' is not a list"));
  Dataset d;
  d.source = path;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const auto& it = (*list)[i];
    DatasetItem item;
    if (it.is_string()) {  // MSD "test": ["./imagesTs/x.nii.gz", ...]
      item.files["image"] = resolve_path(base, it.get<std::string>());
    } else if (it.is_object()) {
      for (const auto& [k, v] : it.items()) {
        if (k == "fold") {
          if (!v.is_number_integer()) throw FormatError(str(path, ": ", section, "[", i, "].fold is not a whole number"));
          item.fold = v.get<int>();
        } else if (v.is_string() && is_attribute_key(k)) {
          item.attrs[k] = v.get<std::string>();
        } else if (v.is_string()) {
          item.files[k] = resolve_path(base, v.get<std::string>());
        }
      }
    } else {
      throw FormatError(str(path, ": ", section, "[", i, "] is neither a path nor an object"));
    }
    if (item.files.empty()) throw FormatError(str(path, ": ", section, "[", i, "] names no file"));
    d.items.push_back(std::move(item));
  }
  return d;
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) {
    while (!cell.empty() && (cell.back() == '\r' || cell.back() == ' ')) cell.pop_back();
    while (!cell.empty() && cell.front() == ' ') cell.erase(cell.begin());
    out.push_back(cell);
  }
  return out;
}

Dataset from_csv(const std::string& path) {
  std::istringstream in(os::read_text_file(path));
  std::string line;
  if (!std::getline(in, line)) throw FormatError(str(path, ": empty CSV (expected a header row such as image,label)"));
  const auto header = split_csv(line);
  const std::string base = os::parent_directory(path);
  Dataset d;
  d.source = path;
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.empty() || line == "\r") continue;
    const auto cells = split_csv(line);
    if (cells.size() != header.size()) {
      throw FormatError(str(path, ": line ", row, " has ", cells.size(), " columns, the header has ", header.size()));
    }
    DatasetItem item;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (header[c] == "fold") {
        try {
          item.fold = std::stoi(cells[c]);
        } catch (const std::exception&) {
          throw FormatError(str(path, ": line ", row, ", column fold: '", cells[c], "' is not a whole number"));
        }
      } else if (is_attribute_key(header[c])) {
        if (!cells[c].empty()) item.attrs[header[c]] = cells[c];
      } else {
        item.files[header[c]] = resolve_path(base, cells[c]);
      }
    }
    d.items.push_back(std::move(item));
  }
  return d;
}

}  // namespace

bool is_csv_list(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
}

Dataset load_dataset(const std::string& path, const std::string& section) {
  return is_csv_list(path) ? from_csv(path) : from_json(path, section);
}

std::map<std::int64_t, std::string> list_label_names(const nlohmann::json& list, const std::string& path) {
  std::map<std::int64_t, std::string> out;
  if (!list.is_object() || !list.contains("labels")) return out;
  const auto& m = list["labels"];
  if (!m.is_object()) throw FormatError(str(path, ": 'labels' must be an object such as {\"0\": \"background\"}"));
  for (const auto& [k, v] : m.items()) {
    if (v.is_number_integer()) {
      out[v.get<std::int64_t>()] = k;
      continue;
    }
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(k, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != k.size() || value < 0 || !v.is_string()) {
      throw FormatError(str(path,
                            ": 'labels' must map label values to names ({\"1\": \"spleen\"}) or names to "
                            "values ({\"spleen\": 1}); got \"",
                            k, "\": ", v.dump()));
    }
    out[value] = v.get<std::string>();
  }
  return out;
}

std::map<std::int64_t, std::string> list_label_names(const std::string& path) {
  if (is_csv_list(path)) return {};
  return list_label_names(parse_json_document(os::read_text_file(path), path), path);
}

Dataset select_fold(const Dataset& dataset, int fold, bool validation) {
  Dataset out;
  out.source = dataset.source;
  for (const auto& it : dataset.items) {
    if ((it.fold == fold) == validation) out.items.push_back(it);
  }
  return out;
}

}  // namespace medfast::data
