#pragma once
/// \file
/// Dataset lists: which files make up each item.
///   - MSD dataset.json: {"training": [{"image": "./imagesTr/x.nii.gz", "label": ...}], ...}
///   - a JSON list with folds: {"training": [{"image": ..., "label": ..., "fold": 0}, ...]}
///   - CSV with a header row: image,label[,fold]
///   - an nnU-Net v2 raw dataset: a dataset.json with channel_names, labels, numTraining and
///     file_ending, its cases in imagesTr/{case}_{XXXX}{file_ending} (one file a channel) and
///     labelsTr/{case}{file_ending}, test cases in imagesTs/ (read_nnunet_raw)
/// Relative paths are relative to the list's folder. An item's key may name several files
/// (MSD's "image": ["t2.nii.gz", "adc.nii.gz"], an nnU-Net case's channel files): LoadImage
/// stacks them as channels, in order, as MONAI's LoadImage does with a list.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace medfast::data {

/// The files of one key of an item: one path (a file, or a DICOM series folder), or several
/// channel files stacked in order. Never empty once read from a list.
struct FilePaths : std::vector<std::string> {
  using std::vector<std::string>::vector;
  FilePaths() = default;
  FilePaths(std::string one) : std::vector<std::string>{std::move(one)} {}    // NOLINT: one path is a list of one
  FilePaths(const char* one) : std::vector<std::string>{std::string(one)} {}  // NOLINT
  /// The first file: the one a case is named by.
  const std::string& first() const { return front(); }
  /// "a.nii.gz", or "a.nii.gz + b.nii.gz" for channel files (for messages).
  std::string text() const;
  /// One path as a JSON string, several as a list (what a list and Sample::meta hold).
  nlohmann::json to_json() const;
};

struct DatasetItem {
  std::map<std::string, FilePaths> files;  ///< key -> absolute path(s)
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
/// "1": "spleen"} or nnU-Net v2's {"background": 0, "spleen": 1}; for region labels the values
/// the regions hold (list_labels' names); empty without "labels". FormatError naming `path`
/// (the list, for messages) for another shape.
std::map<std::int64_t, std::string> list_label_names(const nlohmann::json& list, const std::string& path);
/// The same from the list file at `path` (a CSV list names none).
std::map<std::int64_t, std::string> list_label_names(const std::string& path);

/// A list's "labels" as nnU-Net v2's LabelManager reads them. Plain labels map names to
/// values ({"background": 0, "edema": 1}; MSD's {"0": "background"} too); region labels
/// map names to lists of values ({"whole tumor": [1, 2, 3], "tumor core": [2, 3]}), each
/// region but background one output channel (sigmoid), and the list gives
/// "regions_class_order": per region, the value it writes into a label map.
struct DatasetLabels {
  /// Plain labels: value -> name. Region labels: every value a region holds -> its name
  /// where a label names that value alone, else "label <value>" (the values a label file may hold).
  std::map<std::int64_t, std::string> names;
  /// The values of `names` that no label names alone (region values only): their name is the
  /// stand-in "label <value>", not the list's. A label the list calls "label 2" is not here.
  std::set<std::int64_t> unnamed;
  std::vector<std::string> region_names;           ///< regions, in the list's order (background left out)
  std::vector<std::vector<std::int64_t>> regions;  ///< per region its label values
  std::vector<std::int64_t> regions_class_order;   ///< per region the value it writes (may be empty)
  bool has_regions() const { return !regions.empty(); }
};

/// The labels of a JSON list (empty without "labels"). FormatError naming `path`, the label
/// and what was expected: a name mapped to neither a value nor a list of values, a region
/// dataset without regions_class_order or with one of another length, background not 0.
/// Regions are in the order "labels" gives them: read from an ordered document (the path
/// overload reads the file so; a plain nlohmann::json has sorted its keys).
DatasetLabels list_labels(const nlohmann::ordered_json& list, const std::string& path);
/// The same from the list file at `path` (a CSV list names none).
DatasetLabels list_labels(const std::string& path);

/// Whether the JSON list is an nnU-Net v2 raw dataset.json (it has "file_ending" and
/// "channel_names" and no MSD "training" section).
bool is_nnunet_raw(const nlohmann::json& list);

/// The items of an nnU-Net v2 raw dataset whose dataset.json is at `path`: section
/// "training" lists imagesTr and labelsTr, "test" imagesTs (images only). Cases are the
/// label files of labelsTr and the case names of imagesTr's {case}_{XXXX}{file_ending}
/// files, each case's channels in channel_names' order. FormatError naming the file and
/// what was expected: a missing channel file (the case and the file), a channel index
/// channel_names does not have, a case without a label or a label without images,
/// numTraining other than the cases found (nnU-Net's verify_dataset_integrity), a
/// file_ending medfast cannot read.
Dataset read_nnunet_raw(const nlohmann::json& list, const std::string& path, const std::string& section);

/// The case name of an nnU-Net channel file "{case}_{XXXX}{ending}" and its channel number,
/// or {"", -1} when `name` (a file name) is not one.
std::pair<std::string, int> nnunet_channel_file(const std::string& name, const std::string& ending);

/// Items whose fold is (validation) or is not (training) `fold`.
Dataset select_fold(const Dataset& dataset, int fold, bool validation);

}  // namespace medfast::data
