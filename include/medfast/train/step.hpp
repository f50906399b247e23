#pragma once
/// \file
/// One training step, apart from the run folder and the epoch loop (trainer.cpp): the batch to
/// the device in the network's memory format, forward and loss under autocast, backward (the
/// gradients averaged across ranks while it runs, under DDP), unscale, the non-finite check
/// and the update.
///
/// The step never waits for the device in steady state. Its outcome (the loss, whether the
/// update was applied, the labels' range) is copied to the host as the step ends and read
/// one step later, when the next step's forward and backward are queued behind it: a GPU
/// always has a step's work in hand. So that nothing non-finite reaches the weights in the
/// meantime, the update reads its skip flag on the device (non-finite gradients, and in
/// fp32 and bf16 a non-finite loss; fp16's loss scaler finds the first itself) and skips
/// itself there (ParameterUpdate, update.hpp); the loss scaler's scale and growth live on
/// the device already (amp.hpp). Labels outside the network's classes are found on the
/// device too (the step's update skipped) and reported with the step's items when its
/// outcome is read. Gradients are set to none, not zeroed, before each backward.
///
/// On the CPU, where nothing runs ahead of the host, the outcome is there as soon as it is
/// copied; it is still handed back a step later, so that the loop is the same everywhere.
///
/// With `cuda_graph` (train.cuda_graph: on) the step, from the forward to the update and the
/// loss scaler's update, is captured once as a CUDA graph, after a few eager steps (cuDNN's
/// autotuning, the optimizer's state) and again when the learning rate changes, and each
/// step replays it on the batch copied into the captured input tensors: one launch for the
/// whole step. Its batches must all have the captured shape (a ValueError names the step
/// otherwise); the update must take nothing from the host per step (ParameterUpdate::
/// capturable: the fused kernels, SGD, Novograd). The replayed step's stage times are counted
/// as forward.
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "medfast/train/amp.hpp"
#include "medfast/train/collective.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/trainer.hpp"
#include "medfast/train/update.hpp"

namespace medfast::train {

/// Where a step's batch comes from (1-based epoch and step), for its messages.
struct StepLabel {
  int epoch = 0, step = 0;
  std::vector<std::size_t> items;  ///< the dataset items of the batch
  std::vector<std::string> files;  ///< per item its files, where known (data::Batch::files)
  /// "epoch E, step S (items a, b)", with the files where known: "(items a: image=..., label=...; b: ...)"
  std::string text() const;
};

/// A step as the device finished it, read back on the host.
struct StepOutcome {
  StepLabel label;
  double loss = 0;       ///< as computed: NaN or infinite where it was
  bool applied = false;  ///< the update changed the weights (false: skipped, non-finite)
};

struct StepOptions {
  c10::Device device{c10::kCPU};
  Precision precision = Precision::fp32;
  /// The layout of the network's input (its weights' is the caller's: nn/memory_format.hpp).
  at::MemoryFormat memory_format = at::MemoryFormat::Contiguous;
  /// fused where available, else foreach (update.hpp); per_parameter: torch::optim's step().
  UpdateKernel update = UpdateKernel::fused;
  /// Capture the step as a CUDA graph and replay it (CUDA only; see above).
  bool cuda_graph = false;
  /// With cuda_graph: eager steps before the first capture (at least one of them applied).
  int eager_before_capture = 3;
};

struct Computed;  // what a step computed on the device (step.cpp)

class TrainingStep {
 public:
  /// What a step works with; the caller keeps them alive while the step lives.
  struct Parts {
    torch::nn::AnyModule model;
    std::vector<at::Tensor> params;   ///< each once (nn::unique_tensors)
    std::vector<at::Tensor> buffers;  ///< broadcast from rank 0 before each forward under DDP (BatchNorm)
    torch::optim::Optimizer* optimizer = nullptr;
    std::string optimizer_name;  ///< SGD | Adam | AdamW | Novograd
    GradScaler* scaler = nullptr;
    const Loss* loss = nullptr;
    std::vector<double> supervision_weights;  ///< deep supervision (empty: one output)
    Collective* comm = nullptr;               ///< under DDP
    GradientSync* grad_sync = nullptr;        ///< under DDP
    /// Tests: sees each step's loss (epoch and step 1-based) before backward and may replace it.
    std::function<at::Tensor(int epoch, int step, const at::Tensor& loss)> loss_filter;
  };

  TrainingStep(Parts parts, StepOptions options);
  ~TrainingStep();
  TrainingStep(const TrainingStep&) = delete;
  TrainingStep& operator=(const TrainingStep&) = delete;

  /// Runs a step on a batch (image [N, C, spatial...], label as the loss takes it), adding
  /// its stage times to `times` once the device has passed them. Returns the outcome of the
  /// step before it (nullopt for the first). Errors of the forward and backward name the
  /// step; labels outside [0, classes) found in the previous step are a ValueError naming it.
  std::optional<StepOutcome> run(const at::Tensor& image, const at::Tensor& label, const StepLabel& where,
                                 StageTimes& times);
  /// The outcome of the last step run() has not returned yet (waits for the device), its
  /// times added; nullopt when there is none.
  std::optional<StepOutcome> finish(StageTimes& times);

  /// What the update ran (update.hpp).
  UpdateKernel update_kernel() const;
  /// With cuda_graph: how many times the step was captured (0 before the first capture).
  int captures() const;

 private:
  struct Impl;
  std::optional<StepOutcome> run_graphed(const at::Tensor& image, const at::Tensor& label, const StepLabel& where,
                                         StageTimes& times);
  void capture(const at::Tensor& x, const at::Tensor& y, const StepLabel& where, StageTimes& times, double lr);
  Computed compute(const at::Tensor& x, const at::Tensor& y, const StepLabel& where, StageTimes& times,
                          bool clock, bool read_previous);
  std::unique_ptr<Impl> impl_;
};

}  // namespace medfast::train
