#pragma once
/// \file
/// A dataset's check before training (nnU-Net's `--verify_dataset_integrity`): what
/// `medfast data check` runs in full, and `train` in part (the headers up front; the label
/// values where the cache fill reads the labels anyway, LabelCheck).
///
/// Checks, each finding naming the file:
///   - every item has an image and a label file, and they exist (error);
///   - no entry (image and label) is listed twice in a section (error), and no validation
///     image is also a training one (error: its Dice would score a case the network trained on);
///   - headers (NIfTI: the header alone, cheap; DICOM: the series read): images are 3D
///     (a 2-D image is an error, a 1-voxel-thick one a warning), with as many channels as
///     most cases (error); a label lies on its image's grid: shape, then spacing and
///     affine to 0.001 mm (error);
///   - label voxels (read_labels): whole numbers (error), among the allowed values (error),
///     some foreground (a warning per case; an error where no training label has any, a
///     warning where no validation label has any: every Dice would be NaN).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "medfast/data/dataset.hpp"
#include "medfast/image/sample.hpp"

namespace medfast::data {

/// The values a label volume holds, read in one pass over its voxels.
struct LabelValues {
  std::map<std::int64_t, std::int64_t> voxels;  ///< voxels per whole value
  std::int64_t not_whole = 0;                   ///< voxels that are fractions, NaN or infinite
  double first_not_whole = 0;                   ///< one of them
  bool whole() const { return not_whole == 0; }
  /// Voxels other than 0.
  std::int64_t foreground() const;
};
/// Counts the values of a label tensor of any dtype and device.
LabelValues label_values(const at::Tensor& label);

/// Which values a label may hold.
struct LabelRule {
  std::vector<std::int64_t> allowed;  ///< sorted; empty: any whole value >= 0
  std::string source;                 ///< where they come from, for messages ("model.out_channels 2")
  /// Values 0..classes-1 (a one-channel output: 0 and 1).
  static LabelRule classes(std::int64_t classes, const std::string& source);
  /// "" when `values` are allowed, else what is wrong ("holds label value 7; ...").
  std::string problem(const LabelValues& values) const;
};

struct Finding {
  enum class Severity { error, warning };
  Severity severity = Severity::error;
  std::string check;    ///< what found it: files, duplicate, validation_in_training, dimensions, channels, grid,
                        ///< label_values, foreground
  std::string file;     ///< the file concerned (a dataset-wide finding: the list)
  std::string message;  ///< what is wrong, and what follows
  bool error() const { return severity == Severity::error; }
  std::string text() const { return file + ": " + message; }
  nlohmann::json to_json() const;
};

struct DatasetCheckOptions {
  std::string image_key = "image";
  std::string label_key = "label";
  LabelRule labels;           ///< values labels may hold
  std::int64_t channels = 0;  ///< image channels every case must have (0: as most cases have)
  bool read_labels = true;    ///< read the label voxels (false: files, lists and headers only)
  int threads = 1;
  /// After each item (serialised; from the thread that checked it).
  std::function<void(std::size_t done, std::size_t total)> progress;
};

struct DatasetCheckReport {
  std::string list;
  std::size_t training = 0, validation = 0;           ///< items checked per section
  std::size_t headers = 0;                            ///< image and label files whose geometry was read
  std::size_t labels_read = 0;                        ///< label files whose voxels were read
  std::uint64_t label_bytes = 0;                      ///< bytes of those labels in memory
  std::map<std::int64_t, std::int64_t> label_voxels;  ///< voxels per value over the labels read
  double seconds = 0;
  std::vector<Finding> findings;  ///< per item in list order (training, then validation), then dataset-wide
  std::size_t errors() const;
  std::size_t warnings() const;
  /// The errors as one message: a first line that says how many, then one line each.
  std::string error_text() const;
  nlohmann::json to_json() const;
};

/// Checks `training` and `validation` (may be empty) as described in the file comment.
DatasetCheckReport check_dataset(const Dataset& training, const Dataset& validation,
                                 const DatasetCheckOptions& options = {});

/// The label check of a run's cache fill: each sample's label after the deterministic chain
/// (what training sees) holds whole values the rule allows (else a FormatError naming the
/// label file); and which labels have no foreground. Thread-safe.
class LabelCheck {
 public:
  LabelCheck(std::string label_key, LabelRule rule);
  /// Checks the sample's label; throws FormatError naming its file.
  void operator()(const Sample& sample);
  /// Label files checked (each once, however often it was computed).
  std::size_t checked() const;
  /// The label files checked whose label had no foreground, in the order first checked.
  std::vector<std::string> without_foreground() const;

 private:
  std::string key_;
  LabelRule rule_;
  mutable std::mutex mutex_;
  std::set<std::string> checked_;
  std::vector<std::string> empty_;
};

}  // namespace medfast::data
