#pragma once
/// \file
/// Dataset lists: which files make up each item.
///   - MSD dataset.json: {"training": [{"image": "./imagesTr/x.nii.gz", "label": ...}], ...}
///   - a JSON list with folds: {"training": [{"image": ..., "label": ..., "fold": 0}, ...]}
///   - CSV with a header row: image,label[,fold]
/// Relative paths are relative to the list's folder.

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace medfast::data {

struct DatasetItem {
  std::map<std::string, std::string> files;  ///< key -> absolute path (a file, or a DICOM series folder)
  /// Values that are not files (is_attribute_key), e.g. series_uid: the DICOM series to read.
  std::map<std::string, std::string> attrs;
  int fold = -1;
};

/// Item fields that hold a value rather than a path.
inline bool is_attribute_key(const std::string& key) { return key == "series_uid"; }

struct Dataset {
  std::string source;  ///< the list file
  std::vector<DatasetItem> items;
};

/// `path` relative to the folder `base` (leading "./" dropped); absolute paths unchanged.
std::string resolve_path(const std::string& base, const std::string& path);

/// Whether `path` is a CSV list (by its name: .csv); otherwise a JSON list.
bool is_csv_list(const std::string& path);

/// Reads a list; `section` picks the JSON section ("training", "validation",
/// "test"). Throws FormatError naming the file, the item and the field.
Dataset load_dataset(const std::string& path, const std::string& section = "training");

/// The label values a JSON list names in "labels", value -> name: MSD's {"0": "background",
/// "1": "spleen"} or nnU-Net v2's {"background": 0, "spleen": 1}; empty without "labels".
/// FormatError naming `path` (the list, for messages) for another shape.
std::map<std::int64_t, std::string> list_label_names(const nlohmann::json& list, const std::string& path);
/// The same from the list file at `path` (a CSV list names none).
std::map<std::int64_t, std::string> list_label_names(const std::string& path);

/// Items whose fold is (validation) or is not (training) `fold`.
Dataset select_fold(const Dataset& dataset, int fold, bool validation);

}  // namespace medfast::data
