#include "data_checks.hpp"

#include <algorithm>

#include "medfast/core/error.hpp"
#include "medfast/nn/network.hpp"

namespace medfast::train::detail {

namespace {

constexpr std::size_t kMostWarnings = 10;  ///< said one by one; more are counted
constexpr std::size_t kMostFiles = 5;      ///< files named in one warning

std::string some_files(const std::vector<std::string>& files) {
  std::string s;
  for (std::size_t i = 0; i < files.size() && i < kMostFiles; ++i) s += (i ? ", " : "") + files[i];
  if (files.size() > kMostFiles) s += str(" and ", files.size() - kMostFiles, " more");
  return s;
}

}  // namespace

RunDataChecks::RunDataChecks(const RunConfig& c) : c_(c) {
  const std::string where = c.path + ": model";
  rule_ = data::LabelRule::classes(nn::output_channels(nn::parse_network(c.model, where), where), "model.out_channels");
  training_ = std::make_shared<data::LabelCheck>(c.train.label_key, rule_);
  validation_ = std::make_shared<data::LabelCheck>(c.train.label_key, rule_);
}

std::vector<std::string> RunDataChecks::check_headers() const {
  const auto listed = [&](const std::string& key) {
    const auto& items = c_.data.dataset.items;
    return std::any_of(items.begin(), items.end(), [&](const data::DatasetItem& i) { return i.files.count(key) > 0; });
  };
  // Keys no item has are not files (the batches' keys are checked where they are taken).
  if (!listed(c_.train.image_key) || !listed(c_.train.label_key)) return {};
  data::DatasetCheckOptions o;
  o.image_key = c_.train.image_key;
  o.label_key = c_.train.label_key;
  o.labels = rule_;
  o.read_labels = false;
  o.threads = c_.data.cache.threads;
  const data::DatasetCheckReport r = data::check_dataset(c_.data.dataset, c_.data.validation, o);
  if (r.errors() > 0) throw FormatError(r.error_text());
  std::vector<std::string> out;
  for (const auto& f : r.findings) {
    if (out.size() == kMostWarnings) {
      out.push_back(str("warning: ", r.warnings() - kMostWarnings, " more (medfast data check lists them)"));
      break;
    }
    out.push_back("warning: " + f.text());
  }
  return out;
}

data::SampleCheck RunDataChecks::training_check() const {
  return [check = training_](const Sample& s) { (*check)(s); };
}

data::SampleCheck RunDataChecks::validation_check() const {
  return [check = validation_](const Sample& s) { (*check)(s); };
}

std::vector<std::string> RunDataChecks::after_training_fill(bool complete) const {
  const std::vector<std::string> empty = training_->without_foreground();
  const std::size_t checked = training_->checked();
  if (empty.empty()) return {};
  if (complete && empty.size() == checked) {
    throw FormatError(str("no training label has any foreground after data.deterministic (every voxel 0 in all ",
                          checked, "): nothing to train: ", some_files(empty)));
  }
  return {str("warning: ", empty.size(), " of ", checked,
              " training labels have no foreground after data.deterministic (their crops are background only): ",
              some_files(empty))};
}

std::vector<std::string> RunDataChecks::after_validation_fill(bool complete) {
  const std::vector<std::string> empty = validation_->without_foreground();
  const std::size_t checked = validation_->checked();
  if (empty.empty()) return {};
  if (complete && empty.size() == checked) {
    validation_empty_ = true;
    return {str("warning: no validation label has any foreground after data.deterministic (every voxel 0 in all ",
                checked,
                "): every class's Dice is NaN (MONAI's DiceMetric leaves out a case whose ground truth is "
                "empty), so no epoch has a Dice and no best.ckpt is written: ",
                some_files(empty))};
  }
  return {str("warning: ", empty.size(), " of ", checked,
              " validation labels have no foreground after data.deterministic: their Dice is NaN and left out of the "
              "mean (MONAI's DiceMetric, ignore_empty): ",
              some_files(empty))};
}

}  // namespace medfast::train::detail
