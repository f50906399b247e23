#pragma once
/// \file
/// A run's dataset check (data/check.hpp), without a second read of the data: the lists,
/// files and headers before the cache fill, and the labels where the fill computes them
/// (each sample's label after the deterministic chain: its values, then which labels have
/// no foreground). `medfast data check` reads every label in full instead.
#include <memory>
#include <string>
#include <vector>

#include "medfast/data/cached_dataset.hpp"
#include "medfast/data/check.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::train::detail {

class RunDataChecks {
 public:
  explicit RunDataChecks(const RunConfig& config);
  /// Lists, files and headers of the training and validation items (no voxels read).
  /// Throws FormatError listing every error; returns the warnings to say.
  std::vector<std::string> check_headers() const;
  /// The checks the caches run on each computed sample.
  data::SampleCheck training_check() const;
  data::SampleCheck validation_check() const;
  /// After the training items are filled (`complete`: every one of them computed now, in
  /// one process): warnings to say; FormatError where no training label has foreground.
  std::vector<std::string> after_training_fill(bool complete) const;
  /// After the validation items are filled: warnings to say.
  std::vector<std::string> after_validation_fill(bool complete);
  /// Every validation label the fill computed had no foreground (all of them computed).
  bool validation_labels_empty() const { return validation_empty_; }

 private:
  const RunConfig& c_;
  data::LabelRule rule_;
  std::shared_ptr<data::LabelCheck> training_, validation_;
  bool validation_empty_ = false;
};

}  // namespace medfast::train::detail
