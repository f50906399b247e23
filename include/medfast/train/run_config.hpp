#pragma once
/// \file
/// A training run's config, read and checked in one place (see trainer.hpp for
/// the sections). Every error names the config and the key.
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/core/choices.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/train/profiler.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/train/collective.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/optim.hpp"

namespace medfast::train {

/// The built-in default run: a small synthetic spleen-like dataset written by `data synth`
/// into data/synth-small and a small UNet trained to a validation Dice of 0.85, on the device
/// auto chooses (train.device: auto), with the settings for `device`: on the CPU fp32 and the
/// memory cache; on a GPU mixed precision (bf16 where the GPU computes it, else fp16) and the
/// device cache. Without an argument: the CPU's.
nlohmann::json default_run_config(c10::Device device = c10::Device(c10::kCPU), bool bf16 = true);

/// Applies "a.b.c=value" (value parsed as YAML: numbers, booleans, lists, strings).
/// Throws ValueError naming the key when it does not have the form key=value.
void apply_override(nlohmann::json& config, const std::string& assignment);

/// train.memory_format: the layout the network runs in (nn/layout.hpp).
enum class MemoryFormatChoice { automatic, channels_last, contiguous };
constexpr std::array<Choice<MemoryFormatChoice>, 3> choices(MemoryFormatChoice) {
  return {{{MemoryFormatChoice::automatic, "auto"},
           {MemoryFormatChoice::channels_last, "channels_last"},
           {MemoryFormatChoice::contiguous, "contiguous"}}};
}
/// The layout a network runs in on `device`: auto is channels-last (NDHWC) on CUDA, where
/// cuDNN's half-precision 3D kernels want it, and contiguous on the CPU, where medfast's
/// direct convolution declines channels-last input and docs/benchmarks.md measured no gain.
at::MemoryFormat resolve_memory_format(MemoryFormatChoice choice, c10::Device device);
/// The same for a config's train section as a checkpoint keeps it (eval, infer): its
/// memory_format, auto where absent. ValueError naming `where` for another value.
at::MemoryFormat memory_format_of(const nlohmann::json& train_section, c10::Device device, const std::string& where);
/// A config's train.deterministic as a checkpoint keeps it (eval, infer): true where absent;
/// ValueError naming `where` for a value that is not true or false.
bool deterministic_of(const nlohmann::json& train_section, const std::string& where);
/// On CUDA, train.deterministic for the whole process: true, deterministic cuDNN algorithms
/// (no autotuning) and deterministic kernels where torch has them (a warning names any op
/// without one); false, cudnn.benchmark (each shape's fastest algorithm, timed once).
/// Training, its validation, eval and infer all run this way. Nothing on the CPU.
void apply_cuda_determinism(c10::Device device, bool deterministic);

/// train.cuda_graph: the training step captured as a CUDA graph and replayed (step.hpp).
enum class CudaGraph { off, on };
constexpr std::array<Choice<CudaGraph>, 2> choices(CudaGraph) { return {{{CudaGraph::off, "off"}, {CudaGraph::on, "on"}}}; }

struct TrainOptions {
  std::string run_dir = "runs/default";
  int epochs = 10;
  std::uint64_t seed = 0;
  std::string device = "auto";     ///< auto | cpu | cuda | cuda:N (train/placement.hpp)
  nlohmann::json amp = false;       ///< false | true | fp16 | bf16 (true: fp16 on CUDA, bf16 on CPU)
  double target_dice = 0;           ///< stop when the validation mean Dice reaches it (0: never)
  int threads = 0;                  ///< libtorch intra-op threads for the network (0: the cores the loader leaves)
  std::string image_key = "image", label_key = "label";
  /// CUDA: deterministic cuDNN algorithms (no autotuning), so that resume is bit-identical
  /// there too (MONAI's set_determinism does the same); false lets cuDNN pick the fastest.
  bool deterministic = true;
  /// Bad steps in a row (non-finite loss or gradients; fp16: steps the loss scaler skipped)
  /// that stop the run; -1: kDefaultMaxNonfiniteSteps, fp16 kDefaultMaxNonfiniteStepsFp16
  /// (train/nonfinite.hpp); 0: never stop.
  int max_nonfinite_steps = -1;
  /// TensorBoard event files in run_dir (rank 0; flushed each epoch): profile/events.hpp.
  bool tensorboard = true;
  /// The network's layout: auto (channels-last on CUDA, contiguous on the CPU), channels_last
  /// or contiguous (resolve_memory_format).
  MemoryFormatChoice memory_format = MemoryFormatChoice::automatic;
  /// Capture the training step as a CUDA graph and replay it each step (step.hpp): CUDA, one
  /// process (no DDP), no profiling, batches of one shape. Off until measured.
  CudaGraph cuda_graph = CudaGraph::off;
  /// train.profile: traces of scheduled steps into run_dir/profiler (off by default).
  ProfileOptions profile;

  /// train's keys (profile, a mapping of its own, is read by ProfileOptions).
  static constexpr auto fields() {
    using O = TrainOptions;
    return std::make_tuple(
        field("run_dir", &O::run_dir, "folder of checkpoints and metrics (relative: to the config's folder)"),
        field("epochs", &O::epochs, "epochs to train"), field("seed", &O::seed, "seed of the weights and the network's randomness"),
        field("device", &O::device, "auto (a GPU where this build has CUDA and one is visible, else the CPU) | cpu | cuda | cuda:N"),
        field("amp", &O::amp, "mixed precision: false | true | fp16 | bf16 (true: fp16 on CUDA, bf16 on CPU)"),
        field("target_dice", &O::target_dice, "stop when the validation mean Dice reaches it (0: never)"),
        field("threads", &O::threads, "libtorch threads of the network (0: the threads setting)"),
        field("image_key", &O::image_key, "the batches' input key"), field("label_key", &O::label_key, "the batches' label key"),
        field("deterministic", &O::deterministic, "CUDA: deterministic cuDNN algorithms (bit-identical resume); false: cudnn.benchmark (training, validation, eval and infer)"),
        field("max_nonfinite_steps", &O::max_nonfinite_steps,
              "bad steps in a row that stop the run (-1: 1, or 20 with fp16; 0: never stop)"),
        field("tensorboard", &O::tensorboard,
              "write TensorBoard event files into run_dir (tensorboard --logdir runs), flushed each epoch"),
        field("memory_format", &O::memory_format,
              "the network's layout: auto (channels_last on CUDA, contiguous on the CPU), channels_last (NDHWC) or "
              "contiguous (NCDHW)"),
        field("cuda_graph", &O::cuda_graph,
              "capture the training step as a CUDA graph and replay it (CUDA, no DDP, no profiling, batches of one "
              "shape)"));
  }
  void validate() const;
};

/// The validation section's own keys (sliding_window, a mapping, is SlidingWindowOptions).
struct ValidationOptions {
  int interval = 1;   ///< validate every `interval` epochs (and after the last)
  bool hd95 = false;  ///< also the 95th-percentile Hausdorff distance per class
  Tta tta = Tta::none;  ///< test-time augmentation of validation, eval and (by default) infer
  static constexpr auto fields() {
    using O = ValidationOptions;
    return std::make_tuple(field("interval", &O::interval, "validate every N epochs, and after the last"),
                           field("hd95", &O::hd95, "also the 95th-percentile Hausdorff distance per class (mm)"),
                           field("tta", &O::tta,
                                 "test-time augmentation for validation, eval and infer: flips averages the "
                                 "logits of each window's 8 mirror images (nnU-Net's mirroring; 8 forwards "
                                 "per window, each flip one more)"));
  }
  /// Throws ValueError naming the key: an interval below 1.
  void validate() const;
};


struct RunConfig {
  std::string path;      ///< the config file, or "built-in default config"
  std::string base_dir;  ///< absolute folder that relative paths start from
  nlohmann::json root;   ///< the whole config, as resolved (relative paths kept)
  data::PipelineConfig data;
  nlohmann::json model;
  LossOptions loss;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  SlidingWindowOptions sliding_window;
  ValidationOptions validation;
  TrainOptions train;
  /// The caller's settings with the config's `settings:` map below flags and the
  /// environment (what the run uses; the caller's own are not changed).
  Settings settings;
  std::shared_ptr<Collective> collective;  ///< set by the caller under DDP
};

/// A config `path` in angle brackets names where a config came from that is no file (the
/// dict given to medfast.train.run): messages name it, relative paths start at the working
/// directory, as for the built-in default (path "").
inline bool is_config_name(const std::string& path) { return !path.empty() && path.front() == '<'; }

/// The names of the classes a run's metrics report, in order: softmax, the foreground classes
/// 1..classes-1; sigmoid (or one output channel), every channel. data.class_names where
/// given (ConfigError naming it when its count differs); else from the label chain and the
/// dataset list's "labels": ConvertToMultiChannelBasedOnBratsClasses gives TC, WT and ET;
/// LabelToRegions a region's name from the list (nnU-Net's region labels) or its labels'
/// names joined with "+"; plain labels their names; else class_K, K the label value
/// (softmax) or the channel (sigmoid), as before names existed.
std::vector<std::string> metric_class_names(const RunConfig& c, std::int64_t classes);
/// A name as a TensorBoard tag's last part: letters, digits, '-', '_' and '.' kept, others '_'.
std::string tag_name(const std::string& name);

/// libtorch's intra-op threads for the network: `train_threads` (train.threads)
/// when positive, else the threads setting. Sets them and returns the number:
/// the one place training, eval and infer decide it (the CLI sets the threads
/// setting at start-up for everything else).
int apply_network_threads(int train_threads, const Settings& settings);
/// With the host_memory_reuse setting on (the default), has the C library keep freed
/// memory for reuse (os::keep_freed_memory): a process-wide step, taken by train, eval
/// and infer before their first forward. Returns whether it took effect.
bool apply_host_memory_reuse(const Settings& settings);

/// The conv_backward setting made effective for the process (nn::set_custom_conv_backward):
/// taken by train and bench step before their first forward. Returns whether the custom
/// convolution backward is on.
bool apply_conv_backward(const Settings& settings);
/// The conv_forward setting made effective for the process (nn::set_direct_conv,
/// nn::set_onednn_conv_forward): whether few-channel convolutions run medfast's direct kernel
/// and the others oneDNN's where libtorch would take im2col. Train, eval and infer call it.
bool apply_conv_forward(const Settings& settings);

/// Reads `root` (from `path`, "" for the built-in default: paths relative to the
/// working directory). Pure: it writes nothing and changes no process state; the
/// config's `settings:` map applies to RunConfig::settings, a copy of `settings`.
/// `base_dir` overrides the folder relative paths start from (a checkpoint's config).
/// A data.synth whose dataset is not written yet is a ConfigError: prepare_run first.
RunConfig load_run_config(nlohmann::json root, std::string path, const Settings& settings, std::string base_dir = "");

/// The explicit step before a run reads its data, taken once by the CLI and the Python
/// API: checks every section but data's lists (a typo anywhere is an error before any
/// data is written), then writes data.synth's dataset when its list does not exist
/// (data::prepare_dataset). True when it wrote one.
bool prepare_run(const nlohmann::json& root, const std::string& path, const Settings& settings,
                 std::string base_dir = "");

}  // namespace medfast::train
