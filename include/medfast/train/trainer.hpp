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
///   train:       {run_dir, epochs, seed, device, amp, target_dice, threads, image_key, label_key, deterministic}
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
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "medfast/core/settings.hpp"
#include "medfast/train/collective.hpp"

namespace medfast::train {

/// The built-in default run: a small synthetic spleen-like dataset written by
/// `data synth` into data/synth-small, cached in memory, and a small UNet trained on CPU.
nlohmann::json default_run_config();

/// Applies "a.b.c=value" (value parsed as YAML: numbers, booleans, lists, strings).
/// Throws ValueError naming the key when it does not have the form key=value.
void apply_override(nlohmann::json& config, const std::string& assignment);

struct TrainOptions {
  std::string run_dir = "runs/default";
  int epochs = 10;
  int val_interval = 1;
  std::uint64_t seed = 0;
  std::string device = "cpu";      ///< cpu | cuda | cuda:N
  nlohmann::json amp = false;       ///< false | true | fp16 | bf16 (true: fp16 on CUDA, bf16 on CPU)
  double target_dice = 0;           ///< stop when the validation mean Dice reaches it (0: never)
  int threads = 0;                  ///< libtorch intra-op threads for the network (0: the cores the loader leaves)
  std::string image_key = "image", label_key = "label";
  /// CUDA: deterministic cuDNN algorithms (no autotuning), so that resume is bit-identical
  /// there too (MONAI's set_determinism does the same); false lets cuDNN pick the fastest.
  bool deterministic = true;
  void validate() const;
};

/// Wall-clock seconds per stage, summed over an epoch's steps.
struct StageTimes {
  double data_wait = 0, copy = 0, forward = 0, backward = 0, optimizer = 0, validation = 0;
  nlohmann::json to_json() const;
};

struct EpochRecord {
  int epoch = 0;          ///< 1-based
  int steps = 0, skipped_steps = 0;
  double loss = 0;        ///< mean training loss
  double lr = 0;
  std::optional<double> dice;            ///< mean validation Dice (validation epochs)
  std::vector<double> dice_per_class;
  std::optional<double> hd95;
  StageTimes times;
  double seconds = 0;     ///< this epoch
  double elapsed = 0;     ///< since the run started (cumulative over resumes)
  nlohmann::json to_json() const;
  static EpochRecord from_json(const nlohmann::json& j);
};

struct TrainResult {
  std::vector<EpochRecord> history;
  double best_dice = -1;
  int best_epoch = 0;
  bool reached_target = false;
  std::optional<double> time_to_target;  ///< seconds from the run's start
  double seconds = 0;                    ///< this invocation
  double prepare_seconds = 0;            ///< dataset + cache fill
  std::string run_dir;
  nlohmann::json to_json() const;
};

/// What the run reports as it goes (the CLI prints these; the library never does).
struct TrainCallbacks {
  std::function<void(const std::string&)> message;
  std::function<void(const EpochRecord&)> epoch;
  /// After each training step: epoch (1-based), step (1-based), steps per epoch, the step's loss.
  std::function<void(int epoch, int step, int steps, double loss)> step;
};

class Trainer {
 public:
  /// `config` is the whole run config; `path` names it in messages and its folder
  /// anchors relative paths ("" for the built-in default: the working directory).
  Trainer(nlohmann::json config, std::string path, Settings settings);
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
  double mean_dice = 0;
  std::optional<double> mean_hd95;
  nlohmann::json to_json() const;
};
struct EvalOptions {
  std::string device = "cpu";   ///< cpu | cuda | cuda:N
  nlohmann::json amp = false;   ///< as train.amp
  bool hd95 = false;
  std::string section;          ///< evaluate every item of this dataset section instead
};
/// `config` null: the config stored in the checkpoint (paths relative to where it was trained).
EvalResult evaluate(const std::string& checkpoint, nlohmann::json config, const std::string& path,
                    const Settings& settings, const EvalOptions& options = {});

/// `infer`: runs a checkpoint's network over NIfTI files with the deterministic chain
/// the checkpoint was trained with (without its label steps), sliding-window, argmax,
/// and writes each prediction (uint8 labels) with the input's own grid and affine to
/// `output_dir/<name>` (written atomically). Returns the files written.
struct InferOptions {
  std::string device = "cpu";
  nlohmann::json amp = false;
  nlohmann::json sliding_window;  ///< overrides of the checkpoint's validation.sliding_window
  std::string suffix = "_seg";
};
std::vector<std::string> infer(const std::string& checkpoint, const std::vector<std::string>& inputs,
                               const std::string& output_dir, const InferOptions& options, const Settings& settings,
                               const std::function<void(const std::string&)>& message = {});

}  // namespace medfast::train
