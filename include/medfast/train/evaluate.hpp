#pragma once
/// \file
/// A trained checkpoint at work: `medfast eval` (Dice, HD95 on a config's
/// validation items) and `medfast infer` (predictions on the input's own grid).
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "medfast/core/settings.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::train {

/// Dice of a checkpoint's network on a config's validation items (or every item of
/// `section` when given): per case and class, and the mean.
struct EvalCase {
  std::string image;
  std::vector<double> dice;  ///< per class (NaN: empty ground truth)
  std::optional<std::vector<double>> hd95;
};
struct EvalResult {
  std::vector<EvalCase> cases;
  std::vector<double> mean_per_class;
  std::vector<std::string> class_names;  ///< as mean_per_class (metric_class_names)
  double mean_dice = 0;
  std::optional<double> mean_hd95;
  /// Cases whose logits held NaN or infinity: their scores and the means are NaN (null).
  std::int64_t nonfinite_cases = 0;
  nlohmann::json to_json() const;
};
struct EvalOptions {
  std::string device = "auto";  ///< auto | cpu | cuda | cuda:N (train/placement.hpp)
  nlohmann::json amp = false;   ///< as train.amp
  bool hd95 = false;
  std::string section;          ///< evaluate every item of this dataset section instead
  /// `key.path=value` overrides of the checkpoint's own config (`config` null), as --set
  /// (a config given by the caller has its overrides applied already).
  std::vector<std::string> overrides;
  /// After each case: cases done, cases in all (the CLI's progress line).
  std::function<void(std::size_t done, std::size_t total)> on_progress;
};
/// `config` null: the config stored in the checkpoint (paths relative to where it was trained).
/// `checkpoint` empty: the weights are `config`'s model.pretrained (a MONAI state_dict).
EvalResult evaluate(const std::string& checkpoint, nlohmann::json config, const std::string& path,
                    const Settings& settings, const EvalOptions& options = {});

/// `infer`: runs a checkpoint's network over images (NIfTI files, folders of them, DICOM
/// series: a folder or a multi-frame file) with the deterministic chain the checkpoint was
/// trained with (without its label steps), sliding-window, argmax, and writes each
/// prediction (uint8 labels, NIfTI) with the input's own grid and affine to
/// `output_dir/<name><suffix>.nii[.gz]` (written atomically; a DICOM input's name is its
/// folder's or file's, written .nii.gz). Inputs that would write one output name are refused
/// before any work. Returns the files written.
struct InferOptions {
  std::string device = "auto";  ///< auto | cpu | cuda | cuda:N
  nlohmann::json amp = false;
  nlohmann::json sliding_window;  ///< overrides of the checkpoint's validation.sliding_window
  std::string tta;                ///< none | flips; empty: the checkpoint's validation.tta
  std::string suffix = "_seg";
  /// Replace outputs that exist already (otherwise infer refuses, writing nothing).
  bool overwrite = false;
  /// With no checkpoint: a run config (its deterministic chain, sliding window and a model
  /// with `pretrained` weights), read from `config_path`.
  nlohmann::json config;
  std::string config_path;
  /// After each file: files done, files in all.
  std::function<void(std::size_t done, std::size_t total)> on_progress;
};
/// One input's outcome: where the labels went, and the seconds and memory it took.
struct InferCase {
  std::string input, output;
  double read_seconds = 0;   ///< the deterministic chain (reading and preprocessing), read ahead
  double wait_seconds = 0;   ///< how long inference waited for that read (0 when it was ahead)
  double infer_seconds = 0;  ///< sliding-window inference and the labels (argmax)
  double write_seconds = 0;  ///< back onto the input's grid and written, behind the next inference
  std::uint64_t peak_rss_bytes = 0;  ///< the process's peak resident memory after the case
  nlohmann::json to_json() const;
};
std::vector<InferCase> infer(const std::string& checkpoint, const std::vector<std::string>& inputs,
                               const std::string& output_dir, const InferOptions& options, const Settings& settings,
                               const std::function<void(const std::string&)>& message = {});

}  // namespace medfast::train
