#pragma once
/// \file
/// `medfast plan`: a dataset fingerprint in, a run config out. nnU-Net v2's rules (rules.hpp)
/// give the target spacing, the normalization per channel and the network's topology; the
/// patch and batch size follow nnU-Net's loop with medfast's own estimate of a training
/// step's memory (training_memory) against a budget: the device's free memory (CUDA) or a
/// stated fraction of RAM (CPU). The run config is the one `medfast train --config` runs,
/// written as YAML with each value's reason beside it (docs/plan.md).
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "medfast/plan/dataset.hpp"
#include "medfast/plan/rules.hpp"

namespace medfast::plan {

/// The network the plan trains (MONAI's DynUNet with nnU-Net's topology).
struct NetworkPlan {
  std::int64_t in_channels = 1, out_channels = 2;
  std::vector<Shape> kernels, strides;  ///< per level (strides[0] is [1, 1, 1])
  std::vector<std::int64_t> filters;    ///< per level: min(32 * 2^level, 320)
  std::int64_t deep_supr_num = 0;       ///< 0: no deep supervision (fewer than 3 levels)
  /// The run config's model section (DynUNet's arguments).
  nlohmann::ordered_json model_json() const;
  /// Parameters (MONAI's count: basic blocks without bias, instance norms with affine, the
  /// output and deep-supervision heads with bias).
  std::int64_t parameters() const;
};

/// medfast's estimate of one training step's memory above what the network's weights and
/// the data held before it (peak resident memory of forward + backward + optimizer step).
struct MemoryEstimate {
  double activations = 0;  ///< saved for backward, all samples
  double transients = 0;   ///< backward's gradient buffers at its widest level, the loss's
  double parameters = 0;   ///< gradients and optimizer state
  double total() const { return activations + transients + parameters; }
};
constexpr double kStepOverheadBytes = 20.0 * (1 << 20);
struct MemoryOptions {
  std::int64_t activation_bytes = 4;  ///< 4: float32; 2: fp16/bf16 autocast (activations of convolutions)
  std::int64_t optimizer_states = 1;  ///< per parameter: SGD with momentum 1, Adam 2
};
/// From the activation sizes of the network's layers, per sample: each convolution block
/// (convolution, instance norm, leaky ReLU, twice) keeps 6 feature maps of its level, each
/// decoder block 8 (its concatenated input too); the output and the loss about 10 maps of
/// classes per output; backward needs about 5 maps of the top level at once. Weights count
/// as their gradients and optimizer state; a step's fixed working memory (autograd, oneDNN)
/// adds kStepOverheadBytes (measured with a patch of a few voxels). Checked against measured
/// peaks by bench/plan_memory_bench.py (docs/benchmarks.md).
MemoryEstimate training_memory(const NetworkPlan& network, const Shape& patch, std::int64_t batch,
                               const MemoryOptions& options = {});

/// Memory of one eval forward of a validation window (batch 1) and of its share of the
/// sliding window's buffers: the encoder's output at each level, kept for the decoder; about
/// 10 maps of the top level at once (the up-convolution, the concatenated input, a block's
/// convolutions, norms and activations, and what the allocator keeps of them); and the
/// probabilities, their sum and the window's weights in float32 (classes per voxel). A
/// 192 x 192 x 80 window of the spleen-like plan's network (8..80 channels): 1.19 GB
/// estimated, about 1.25 GB measured (the peak RSS of `medfast eval` 1.15 GB above that of a
/// run of the patch's windows).
double inference_memory(const NetworkPlan& network, const Shape& window, std::int64_t activation_bytes);

/// Multiply-accumulates of one sample's forward through the network at `patch`: each level's
/// two convolutions, the transposed convolutions and the decoder's two, the output head and,
/// in training, the deep-supervision heads (medfast's DynUNet skips them in eval mode, where
/// they are not used); as nn::MacCounter counts a DynUNet's (tested).
/// Normalisation, activations and interpolation are left out (a few operations per voxel).
double forward_macs(const NetworkPlan& network, const Shape& patch, bool training);
/// A training step's: backward computes the input and the weight gradients, each about a
/// forward's work, so 3 forwards per sample.
inline double training_step_macs(const NetworkPlan& network, const Shape& patch, std::int64_t batch) {
  return 3.0 * static_cast<double>(batch) * forward_macs(network, patch, /*training=*/true);
}

/// A channel's normalization and the step that does it.
struct ChannelNormalization {
  std::string name;  ///< the list's channel name ("" : unnamed)
  Normalization scheme = Normalization::zscore;
  bool use_mask = false;                  ///< z-score over the nonzero region only
  std::optional<IntensityStats> stats;    ///< CT: the dataset's pooled foreground statistics
};

struct PlanOptions {
  std::string device = "cpu";      ///< cpu | cuda | cuda:N
  std::uint64_t memory_bytes = 0;  ///< the training step's budget; 0: the device's default
  std::uint64_t device_free_bytes = 0;   ///< CUDA: free memory (the caller asks the device)
  std::uint64_t host_memory_bytes = 0;   ///< CPU: physical memory (the caller asks the OS)
  int epochs = 100;
  std::string run_dir = "runs/plan";
  /// A training step's multiply-accumulates (training_step_macs); negative: the device's
  /// default (CPU: kCpuStepMacs; CUDA: none); 0: none.
  double step_macs_budget = -1;
  /// Cases that validate (the list's last); -1: a fifth of them (at least 1 of 2 or more).
  /// Less than -1, or all the cases: ValueError.
  int validation_cases = -1;
};
/// The CPU budget's share of physical memory.
constexpr double kCpuMemoryFraction = 0.25;
/// A CPU plan's compute budget per training step: the spleen recipe's own step as it runs
/// (MONAI's UNet 16..256, 2 cases of 4 crops of 96^3 each: about 125 GMAC), what
/// examples/spleen.yaml asks of a CPU.
constexpr double kCpuStepMacs = 128e9;
/// Crops a case gives a step within a compute budget (the spleen recipe's num_samples): an
/// epoch of few cases trains 4x the crops of one crop a case, and a step trains more crops
/// than cases (a budgeted patch is small).
constexpr std::int64_t kCropsPerCase = 4;
/// The channels a compute budget tries, widest first (nnU-Net's 32, then 16 and 8; the
/// widest of each is 10x, as nnU-Net's 320 is of 32): the first whose patch keeps at least
/// half of the memory budget's patch (at full resolution; at a 3d_lowres spacing, of the
/// median case where that is smaller), else the narrowest.
constexpr std::array<std::int64_t, 3> kComputeBaseFeatures{32, 16, 8};
/// nnU-Net's 3d_lowres rule (lowres_creation_threshold, spacing_increase_factor): where the
/// patch holds less than this share of the median case's voxels, the spacing grows by this
/// factor a step (the axes finer than half the coarsest first) until it does. medfast applies
/// it within a compute budget, and trains the low-resolution configuration.
constexpr double kLowresThreshold = 0.25;
constexpr double kLowresSpacingStep = 1.03;

/// SGD's momentum: nnU-Net's 0.99 (an average over about 100 steps, lr 0.01) for a run of at
/// least kLongRunSteps steps; a shorter one takes 0.9 and lr 0.1 (the spleen recipe's), the same
/// step lr / (1 - momentum) over 10 steps, which a run of a few hundred steps warms up.
constexpr std::int64_t kLongRunSteps = 10000;
constexpr double kLongRunMomentum = 0.99, kShortRunMomentum = 0.9;

/// The largest share of a run's time that validation takes (by the MACs of its forwards
/// against the training steps'; on a CPU both run at about the same GMAC/s).
constexpr double kValidationShare = 1.0 / 3;

struct Plan {
  Spacing target_spacing{};        ///< the spacing the run trains at: fullres_spacing, or lowres's
  Spacing median_shape{};          ///< at the target spacing (what the patch is planned for)
  Spacing fullres_spacing{};       ///< nnU-Net's 3d_fullres target spacing (the rules' target_spacing)
  Spacing fullres_median_shape{};  ///< the median case there
  /// Within a compute budget, the patch at fullres_spacing held less than kLowresThreshold of
  /// the median case: the run trains at nnU-Net's 3d_lowres spacing.
  bool lowres = false;
  PatchPlan patch;
  NetworkPlan network;
  std::vector<ChannelNormalization> normalization;
  std::vector<std::int64_t> classes;  ///< label values (0 first)
  /// A sigmoid run, one output per region or label channel (nnU-Net's region-based training):
  /// the list's labels define regions, or its labels have several channels.
  bool sigmoid = false;
  data::DatasetLabels labels;  ///< the list's labels and regions (the run's data.labels)
  std::uint64_t budget_bytes = 0;
  std::string budget_reason;          ///< where the budget came from
  /// Crops each case of a batch gives (RandCropByPosNegLabel's num_samples): kCropsPerCase
  /// where the compute budget narrowed the plan; where the memory budget's plan fits it, as
  /// many up to kCropsPerCase as fit; without a compute budget 1 (nnU-Net's one patch a sample).
  std::int64_t crops_per_case = 1;
  MemoryEstimate memory;              ///< at the planned patch, batch_size * crops_per_case crops
  double step_macs = 0;               ///< training_step_macs at the planned patch, for those crops
  double step_macs_budget = 0;        ///< 0: compute not budgeted
  std::string compute_reason;         ///< where the compute budget came from, and what it changed
  double validation_macs_per_voxel = 0;  ///< an eval forward's, per patch voxel
  /// The validation window: the patch (nnU-Net's; windows the size of a case, tried, scored
  /// lower once trained: instance norm's statistics there are not the training crops').
  Shape validation_window{};
  /// Windows a validation forward (sw_batch_size): min(batch, 4), fewer while
  /// validation_memory would exceed the budget.
  std::int64_t validation_batch = 1;
  /// validation_batch x inference_memory of the window, and the sliding window's case-sized
  /// buffers (3 x classes x float32) for the largest case.
  double validation_memory = 0;
  Shape largest_case{};               ///< resampled_max_shape
  std::size_t validation_cases = 0;   ///< the list's last cases, validated (nnU-Net: one fold of 5)
  bool validation_cases_asked = false;  ///< PlanOptions::validation_cases gave their number
  std::int64_t planned_steps = 0;     ///< epochs * steps an epoch (the training cases in batches)
  double momentum = kLongRunMomentum;  ///< kLongRunMomentum for planned_steps >= kLongRunSteps
  double lr = 0.01;                    ///< 1 - momentum: 0.01 or 0.1
  double validation_overlap = 0.5;     ///< 0.25 within a compute budget (nnU-Net: 0.5)
  double validation_windows = 1;       ///< windows of a median-shaped case
  double validation_epoch_macs = 0;    ///< one validation's forwards (validation_cases cases)
  double epoch_macs = 0;               ///< one epoch's training steps
  /// Epochs between validations: the fewest that keep validation within kValidationShare of
  /// the run's time (validation_epoch_macs against interval * epoch_macs), at most the epochs.
  int validation_interval = 1;
  bool amp = false;
  std::string device;
  int epochs = 0;
  std::string run_dir;
};

/// The plan for a fingerprint (pure). ValueError when no patch fits the budget.
Plan make_plan(const DatasetFingerprint& fingerprint, const PlanOptions& options);

/// The run config (`medfast train --config` runs it as it is). `dataset` is the list the
/// config names (relative paths: to the config's folder).
nlohmann::json run_config(const DatasetFingerprint& fingerprint, const Plan& plan, const std::string& dataset);
/// The same as YAML with each value's reason in a comment.
std::string run_config_yaml(const DatasetFingerprint& fingerprint, const Plan& plan, const std::string& dataset);
/// `medfast plan --json`: the decisions (target_spacing, median_shape, patch_size,
/// batch_size, normalization, network, estimated_memory_bytes, ...) and the fingerprint.
nlohmann::json plan_json(const DatasetFingerprint& fingerprint, const Plan& plan);
/// A short summary (what `train --dataset` prints first).
std::string plan_summary(const DatasetFingerprint& fingerprint, const Plan& plan);

}  // namespace medfast::plan
