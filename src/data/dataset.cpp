#include "medfast/data/dataset.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
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

std::string FilePaths::text() const {
  std::string s;
  for (const auto& p : *this) s += (s.empty() ? "" : " + ") + p;
  return s;
}

nlohmann::json FilePaths::to_json() const {
  if (size() == 1) return front();
  return nlohmann::json(static_cast<const std::vector<std::string>&>(*this));
}

namespace {

/// An item's key given as a list of files: its channel files, stacked in order.
FilePaths file_list(const nlohmann::json& v, const std::string& base, const std::string& where) {
  FilePaths files;
  if (v.empty()) throw FormatError(str(where, " is an empty list (expected one file per channel)"));
  for (std::size_t c = 0; c < v.size(); ++c) {
    if (!v[c].is_string() || v[c].get<std::string>().empty()) {
      throw FormatError(
          str(where, "[", c, "] is not a file name (", v[c].dump(), "): a list names one file per channel"));
    }
    files.push_back(resolve_path(base, v[c].get<std::string>()));
  }
  return files;
}

Dataset from_json(const std::string& path, const std::string& section) {
  const nlohmann::json j = parse_json_document(os::read_text_file(path), path);
  const std::string base = os::parent_directory(path);
  const nlohmann::json* list = nullptr;
  if (j.is_array()) {
    list = &j;
  } else if (j.is_object() && j.contains(section)) {
    list = &j[section];
  } else if (is_nnunet_raw(j)) {
    return read_nnunet_raw(j, path, section);
  } else {
    throw FormatError(str(path, ": no section '", section,
                          "' (expected an MSD dataset.json, an nnU-Net v2 raw dataset.json with channel_names and "
                          "file_ending, or a list of items)"));
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
        } else if (v.is_array() && !is_attribute_key(k) &&
                   (k == "image" || k == "label" ||
                    (!v.empty() &&
                     std::all_of(v.begin(), v.end(), [](const nlohmann::json& f) { return f.is_string(); })))) {
          // A key's channel files (other lists, of numbers say, are not files: left as before).
          item.files[k] = file_list(v, base, str(path, ": ", section, "[", i, "].", k));
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

namespace {

/// A whole number >= 0 written as a JSON key ("0", "12"), or -1.
long long key_number(const std::string& k) {
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(k, &used);
  } catch (const std::exception&) {
    return -1;
  }
  return used == k.size() && value >= 0 ? value : -1;
}

}  // namespace

DatasetLabels list_labels(const nlohmann::ordered_json& list, const std::string& path) {
  DatasetLabels out;
  if (!list.is_object() || !list.contains("labels")) return out;
  const auto& m = list["labels"];
  if (!m.is_object())
    throw FormatError(str(path, ": 'labels' must be an object such as {\"background\": 0, \"spleen\": 1}"));
  // nnU-Net's LabelManager: a region dataset is one where a label maps to several values.
  bool regions = false;
  for (const auto& [k, v] : m.items()) regions = regions || (v.is_array() && v.size() > 1);
  // (ordered_json's items(): the document's order)
  const auto bad = [&](const std::string& k, const nlohmann::ordered_json& v, const std::string& expected) {
    return FormatError(str(path, ": 'labels': \"", k, "\": ", v.dump(), ": ", expected));
  };
  std::set<std::int64_t> region_values;
  for (const auto& [k, v] : m.items()) {
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
      const std::int64_t value = v.get<std::int64_t>();
      if (k == "background" && value != 0) throw bad(k, v, "background must be 0 (nnU-Net's rule)");
      out.names[value] = k;
      if (regions && value != 0 && k != "ignore") {
        out.region_names.push_back(k);
        out.regions.push_back({value});
      }
      continue;
    }
    if (v.is_array()) {
      std::vector<std::int64_t> values;
      for (const auto& x : v) {
        if (!x.is_number_integer() || x.get<std::int64_t>() < 0) {
          throw bad(k, v, "a region lists label values, whole numbers >= 0, e.g. [1, 2, 3]");
        }
        values.push_back(x.get<std::int64_t>());
      }
      if (values.empty()) throw bad(k, v, "a region lists at least one label value");
      if (k == "background" && values != std::vector<std::int64_t>{0}) throw bad(k, v, "background must be 0");
      if (values.size() == 1) out.names[values[0]] = k;
      if (k == "background") continue;
      if (regions) {
        out.region_names.push_back(k);
        out.regions.push_back(values);
      }
      region_values.insert(values.begin(), values.end());
      continue;
    }
    // MSD: {"1": "spleen"}.
    const long long value = key_number(k);
    if (value < 0 || !v.is_string()) {
      throw FormatError(
          str(path,
              ": 'labels' must map label values to names ({\"1\": \"spleen\"}), or names to values "
              "({\"spleen\": 1}) or, for regions, to lists of values ({\"whole tumor\": [1, 2, 3]}); got \"",
              k, "\": ", v.dump()));
    }
    out.names[value] = v.get<std::string>();
  }
  if (!regions) return out;
  for (const std::int64_t v : region_values) {
    if (out.names.count(v)) continue;
    out.names[v] = str("label ", v);
    out.unnamed.insert(v);
  }
  out.names.emplace(0, "background");
  if (!list.contains("regions_class_order")) {
    throw FormatError(str(path, ": 'labels' defines regions (", out.regions.size(),
                          " labels map to lists of values) but the list has no 'regions_class_order': one label "
                          "value per region, in the order of 'labels', e.g. [1, 2, 3] (nnU-Net v2 needs it to write "
                          "a label map)"));
  }
  const auto& order = list["regions_class_order"];
  if (!order.is_array() || order.size() != out.regions.size() ||
      !std::all_of(order.begin(), order.end(), [](const nlohmann::ordered_json& x) {
        return x.is_number_integer() && x.get<std::int64_t>() >= 0;
      })) {
    std::string names;
    for (const auto& n : out.region_names) names += (names.empty() ? "" : ", ") + n;
    throw FormatError(str(path, ": 'regions_class_order' ", order.dump(), ": expected ", out.regions.size(),
                          " whole numbers >= 0, one per region (", names, ")"));
  }
  for (const auto& x : order) out.regions_class_order.push_back(x.get<std::int64_t>());
  return out;
}

DatasetLabels list_labels(const std::string& path) {
  if (is_csv_list(path)) return {};
  const std::string text = os::read_text_file(path);
  (void)parse_json_document(text, path);  // a malformed list: its error, with the line
  return list_labels(nlohmann::ordered_json::parse(text), path);
}

std::map<std::int64_t, std::string> list_label_names(const nlohmann::json& list, const std::string& path) {
  return list_labels(nlohmann::ordered_json::parse(list.dump()), path)
      .names;  // names by value: the order does not matter
}

std::map<std::int64_t, std::string> list_label_names(const std::string& path) {
  return list_labels(path).names;
}

bool is_nnunet_raw(const nlohmann::json& list) {
  return list.is_object() && !list.contains("training") && list.contains("file_ending") &&
         (list.contains("channel_names") || list.contains("modality"));
}

std::pair<std::string, int> nnunet_channel_file(const std::string& name, const std::string& ending) {
  if (name.size() < ending.size() + 6 || name.compare(name.size() - ending.size(), ending.size(), ending) != 0) {
    return {"", -1};
  }
  const std::string stem = name.substr(0, name.size() - ending.size());
  const std::string digits = stem.substr(stem.size() - 4);
  if (stem[stem.size() - 5] != '_' ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return {"", -1};
  }
  return {stem.substr(0, stem.size() - 5), std::stoi(digits)};
}

namespace {

/// The file names of `dir` that end with `ending` (sorted), or none where it does not exist.
std::vector<std::string> files_ending(const std::string& dir, const std::string& ending) {
  std::vector<std::string> out;
  if (!os::exists(dir)) return out;
  for (const auto& name : os::list_directory(dir)) {
    if (name.size() > ending.size() && name.compare(name.size() - ending.size(), ending.size(), ending) == 0 &&
        name[0] != '.' && os::stat(dir + "/" + name).is_regular) {
      out.push_back(name);
    }
  }
  return out;
}

/// nnU-Net's name of channel `k` of case `c`: {case}_{XXXX}{ending}.
std::string channel_name(const std::string& c, std::size_t k, const std::string& ending) {
  char index[24];  // "_" and up to 20 digits
  std::snprintf(index, sizeof index, "_%04zu", k);
  return c + index + ending;
}

/// A folder of nnU-Net channel files grouped by case: case -> its files, channel k at k.
/// FormatError for a file that is no channel file, or a channel index beyond `channels`.
std::map<std::string, std::vector<std::string>> channel_files(const std::string& dir, const std::string& ending,
                                                              std::size_t channels, const std::string& list) {
  std::map<std::string, std::vector<std::string>> cases;
  for (const auto& name : files_ending(dir, ending)) {
    const auto [c, channel] = nnunet_channel_file(name, ending);
    if (channel < 0) {
      throw FormatError(str(dir, "/", name, ": not an nnU-Net channel file: expected {case}_{XXXX}", ending,
                            " (the case, an underscore and a 4-digit channel number; ", list, ")"));
    }
    if (static_cast<std::size_t>(channel) >= channels) {
      throw FormatError(str(dir, "/", name, ": channel ", channel, " of case '", c, "', but ", list, " names ",
                            channels, " channel(s) in channel_names (0..", channels - 1, ")"));
    }
    auto& files = cases[c];
    files.resize(channels);
    files[static_cast<std::size_t>(channel)] = dir + "/" + name;
  }
  for (auto& [c, files] : cases) {
    for (std::size_t k = 0; k < channels; ++k) {
      if (files[k].empty()) {
        throw FormatError(str(dir, ": case '", c, "' has no channel ", k, ": expected ", dir, "/",
                              channel_name(c, k, ending), " (", list, " names ", channels,
                              " channel(s) in channel_names)"));
      }
    }
  }
  return cases;
}

}  // namespace

Dataset read_nnunet_raw(const nlohmann::json& list, const std::string& path, const std::string& section) {
  const std::string base = os::parent_directory(path);
  const auto& fe = list["file_ending"];
  if (!fe.is_string())
    throw FormatError(str(path, ": 'file_ending' ", fe.dump(), ": expected a string such as \".nii.gz\""));
  const std::string ending = fe.get<std::string>();
  if (ending != ".nii.gz" && ending != ".nii") {
    throw FormatError(str(path, ": 'file_ending' \"", ending, "\": medfast reads nnU-Net raw datasets of NIfTI files, ",
                          "\".nii.gz\" or \".nii\"",
                          ending.empty() || ending[0] != '.' ? " (with its leading dot)" : ""));
  }
  const char* const names_key = list.contains("channel_names") ? "channel_names" : "modality";
  const auto& names = list[names_key];
  if (!names.is_object() || names.empty()) {
    throw FormatError(str(path, ": '", names_key, "' ", names.dump(),
                          ": expected the channels by number, e.g. {\"0\": \"T2\", \"1\": \"ADC\"}"));
  }
  const std::size_t channels = names.size();
  for (const auto& [k, v] : names.items()) {
    const long long i = key_number(k);
    if (i < 0 || static_cast<std::size_t>(i) >= channels) {
      throw FormatError(
          str(path, ": '", names_key, "' must number its channels 0..", channels - 1, "; got \"", k, "\""));
    }
  }
  const auto other_endings = [&](const std::string& dir) {
    // Files of another NIfTI ending than file_ending: a wrong file_ending, said as such.
    for (const char* e : {".nii.gz", ".nii", ".mha", ".nrrd", ".png", ".tif"}) {
      if (e == ending) continue;
      const auto found = files_ending(dir, e);
      if (!found.empty() && files_ending(dir, ending).empty()) {
        throw FormatError(str(path, ": 'file_ending' is \"", ending, "\" but ", dir, " holds ", e, " files (", dir, "/",
                              found.front(), "): set file_ending to \"", e, "\"",
                              std::string(e) == ".nii" ? "" : " (medfast reads NIfTI only)"));
      }
    }
  };
  Dataset d;
  d.source = path;
  if (section == "test") {
    const std::string dir = base + "/imagesTs";
    if (!os::exists(dir))
      throw FormatError(str(path, ": no section 'test': the dataset has no imagesTs folder (", dir, ")"));
    other_endings(dir);
    for (auto& [c, files] : channel_files(dir, ending, channels, path)) {
      DatasetItem item;
      item.files["image"] = FilePaths(files.begin(), files.end());
      d.items.push_back(std::move(item));
    }
    return d;
  }
  if (section != "training") {
    throw FormatError(str(path, ": no section '", section, "': an nnU-Net v2 raw dataset has 'training' (imagesTr, ",
                          "labelsTr) and 'test' (imagesTs)"));
  }
  const std::string images = base + "/imagesTr", labels = base + "/labelsTr";
  for (const auto& dir : {images, labels}) {
    if (!os::exists(dir) || !os::stat(dir).is_directory) {
      throw FormatError(
          str(path, ": an nnU-Net v2 raw dataset keeps its training cases in ", dir, ", which does not exist"));
    }
  }
  other_endings(images);
  other_endings(labels);
  const auto cases = channel_files(images, ending, channels, path);
  std::set<std::string> labelled;
  for (const auto& name : files_ending(labels, ending)) labelled.insert(name.substr(0, name.size() - ending.size()));
  for (const auto& [c, files] : cases) {
    if (!labelled.count(c)) {
      throw FormatError(
          str(path, ": case '", c, "' (", files.front(), ") has no label: expected ", labels, "/", c, ending));
    }
  }
  for (const auto& c : labelled) {
    if (!cases.count(c)) {
      throw FormatError(str(labels, "/", c, ending, ": a label without images: expected ", images, "/",
                            channel_name(c, 0, ending),
                            channels > 1 ? " .. " + channel_name(c, channels - 1, ending) : "",
                            " (one file per channel of channel_names)"));
    }
  }
  if (cases.empty())
    throw FormatError(str(path, ": ", images, " holds no ", ending, " files (expected {case}_0000", ending, ")"));
  if (list.contains("numTraining")) {
    // nnU-Net's verify_dataset_integrity asserts it; a count off says files are missing or extra.
    const auto& n = list["numTraining"];
    if (!n.is_number_integer() || n.get<std::int64_t>() != static_cast<std::int64_t>(cases.size())) {
      throw FormatError(str(path, ": 'numTraining' is ", n.dump(), " but ", images, " and ", labels, " hold ",
                            cases.size(),
                            " case(s): a case is missing or extra, or numTraining is out of date (nnU-Net's "
                            "verify_dataset_integrity refuses it too)"));
    }
  }
  for (const auto& [c, files] : cases) {
    DatasetItem item;
    item.files["image"] = FilePaths(files.begin(), files.end());
    item.files["label"] = labels + "/" + c + ending;
    d.items.push_back(std::move(item));
  }
  return d;
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
