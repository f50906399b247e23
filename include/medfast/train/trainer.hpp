#pragma once
/// \file
/// The training run: a config (YAML/JSON) with sections
///
///   data:        the pipeline (data/pipeline.hpp), with data.validation naming the validation items
///   model:       {name: UNet|SegResNet|SwinUNETR, ...MONAI arguments}          (nn/network.hpp)
///   loss:        {name: Dice|DiceCE|DiceFocal, ...MONAI arguments}               (losses.hpp)
///   optimizer:   {name: SGD|Adam|AdamW|Novograd, lr, ...}                         (optim.hpp)
///   schedule:    {name: constant|warmup_cosine|poly, ...}, stepped once per epoch (optim.hpp)
///   validation:  {interval: 1, sliding_window: {roi_size, sw_batch_size, overlap, mode}, hd95: false}
///   train:       {run_dir, epochs, seed, device, amp, target_dice, threads, image_key, label_key, deterministic,
///                 max_nonfinite_steps, tensorboard}
///   settings:    medfast settings (threads, ...; see `medfast config show`)
///
/// Reproducibility: the network's initial weights come from train.seed; each epoch
/// reseeds libtorch's generator (dropout) from (seed, epoch); the loader's order and
/// augmentation are seeded by (data.seed, epoch, item, sample); the learning rate is
/// a closed form of the epoch. A checkpoint after every epoch therefore holds all the
/// state a run needs, and `resume` continues bit-identically (same threads, same device).
///
/// Files in run_dir: last.ckpt (every epoch), best.ckpt (best validation Dice),
/// metrics.jsonl (one JSON object per epoch, rewritten atomically), config.json
/// (the resolved config). Under DDP only rank 0 writes them.
///
/// Before the first forward the backends are checked against float64 (nn/self_check.hpp;
/// setting self_check). Non-finite losses stop the run (train/nonfinite.hpp) with
/// NonFiniteLoss; checkpoints already written stay, the bad epoch is not saved.
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "medfast/core/settings.hpp"
#include "medfast/train/collective.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::train {

/// Wall-clock seconds per stage, summed over an epoch's steps.
struct StageTimes {
  double data_wait = 0, copy = 0, forward = 0, backward = 0, optimizer = 0, validation = 0;
  nlohmann::json to_json() const;
};

struct EpochRecord {
  int epoch = 0;          ///< 1-based
  int steps = 0, skipped_steps = 0;  ///< skipped: non-finite loss or gradients (not applied)
  double loss = 0;        ///< mean training loss
  double lr = 0;
  std::optional<double> dice;            ///< mean validation Dice (validation epochs)
  std::vector<double> dice_per_class;
  /// The classes' names, as dice_per_class (metric_class_names; validation epochs).
  std::vector<std::string> class_names;
  std::optional<double> hd95;
  /// Validation cases whose logits held NaN or infinity: then dice and hd95 are NaN
  /// (null in JSON), not a mean over the other cases.
  std::int64_t nonfinite_validation_cases = 0;
  StageTimes times;
  double seconds = 0;     ///< this epoch
  double elapsed = 0;     ///< since the run started (cumulative over resumes)
  /// Since this process started (start-up, dataset and cache preparation included): the
  /// first epoch's is how long the user waited for the first epoch line. Negative: unknown.
  double process_seconds = -1;
  std::int64_t samples = 0;        ///< training samples (crops) this rank stepped through
  double samples_per_second = 0;   ///< samples over the training part of the epoch (all ranks)
  std::uint64_t peak_rss_bytes = 0;  ///< this process's peak resident memory during the epoch
  /// On CUDA: the caching allocator's peak allocated and reserved bytes during the epoch.
  std::optional<std::uint64_t> cuda_peak_allocated, cuda_peak_reserved;
  /// On CUDA with NVML: this rank's GPU over the epoch (profile::GpuEpochStats::to_json).
  nlohmann::json gpu;
  nlohmann::json to_json() const;
  static EpochRecord from_json(const nlohmann::json& j);
};

/// Where a run stopped on a stop signal (TrainCallbacks::stop_signal).
struct StopPoint {
  int signal = 0;
  int epoch = 0;  ///< 1-based
  int step = 0;   ///< steps of that epoch taken
  bool mid_epoch = false;  ///< last.ckpt holds the epoch so far (else the epoch ended, validated)
};

struct TrainResult {
  std::vector<EpochRecord> history;
  std::optional<StopPoint> stopped;  ///< a stop signal ended the run early; last.ckpt holds it
  double best_dice = -1;
  int best_epoch = 0;              ///< 0: no epoch gave a finite validation Dice (no best.ckpt)
  std::string best_checkpoint;     ///< its path; "" where none was written
  std::string no_best_checkpoint;  ///< where none was written: why
  bool reached_target = false;
  std::optional<double> time_to_target;  ///< seconds from the run's start
  double seconds = 0;                    ///< this invocation
  double prepare_seconds = 0;            ///< dataset + cache fill
  std::string run_dir;
  /// The names of the classes the metrics report (metric_class_names).
  std::vector<std::string> class_names;
  nlohmann::json to_json() const;
};

/// What the run reports as it goes (the CLI prints these; the library never does).
struct TrainCallbacks {
  std::function<void(const std::string&)> message;
  std::function<void(const EpochRecord&)> epoch;
  /// After each training step: epoch (1-based), step (1-based), steps per epoch, the step's loss.
  std::function<void(int epoch, int step, int steps, double loss)> step;
  /// Cache fill before training: what ("training items", "validation items"), items done, in all.
  std::function<void(const std::string& what, std::size_t done, std::size_t total)> progress;
  /// Tests only: sees each step's loss (epoch and step 1-based) before backward and may
  /// replace it (a NaN, an fp16 overflow), as a diverging run or a faulty backend would.
  std::function<at::Tensor(int epoch, int step, const at::Tensor& loss)> loss_filter;
  /// A graceful stop: the signal that asks the run to stop (0: none), polled after each step.
  /// The run finishes the step under way, writes last.ckpt (mid-epoch: the epoch so far, which
  /// --resume continues from the next step as if nothing had happened) and returns with
  /// TrainResult::stopped set. Under DDP every rank stops after the same step.
  std::function<int()> stop_signal;
};

/// In a run_dir: the lock a running `train` holds (one train per folder; the file holds its
/// pid), and the folder --overwrite moves the old run's files into (those the folder's mark,
/// .medfast.json, lists) until the new run's first checkpoint (put back if the new run fails before).
inline constexpr const char* kRunLockName = ".medfast-train.lock";
inline constexpr const char* kOverwrittenName = ".medfast-overwritten-run";
/// `train --dataset`'s plan in its run_dir.
inline constexpr const char* kRunPlanName = "plan.yaml";

/// Makes `run_dir` a run folder before `train --dataset` writes its plan there (as the trainer
/// would: a non-empty folder medfast did not make is refused, naming what it holds; a folder
/// that holds a run is refused unless `resume` or `overwrite`), records the plan in its mark,
/// and returns the plan's path. ValueError naming the folder; nothing is written when it throws.
std::string claim_run_folder_for_plan(const std::string& run_dir, bool resume, bool overwrite);

class Trainer {
 public:
  /// `config` is the whole run config; `path` names it in messages and its folder
  /// anchors relative paths ("" for the built-in default: the working directory).
  /// Reads it (load_run_config: no effect); a data.synth dataset must be written before
  /// (prepare_run, the step the CLI and medfast.train.run take first).
  Trainer(nlohmann::json config, std::string path, const Settings& settings);
  ~Trainer();
  /// Under DDP: the process group (set before run()).
  void set_collective(std::shared_ptr<Collective> collective);
  /// Trains; with `resume`, continues from run_dir/last.ckpt. A fresh run refuses a
  /// run_dir that already holds a run (last.ckpt) unless `overwrite`, which first
  /// removes that run's checkpoints and metrics.
  TrainResult run(bool resume, const TrainCallbacks& callbacks = {}, bool overwrite = false);
  const TrainOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace medfast::train
