#pragma once
/// \file
/// Pieces the trainer, `eval` and `infer` share (private to src/train/).
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "device.hpp"
#include "medfast/image/sample.hpp"
#include "medfast/core/error.hpp"
#include "medfast/profile/events.hpp"
#include "medfast/train/amp.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/train/trainer.hpp"

namespace medfast::train::detail {

/// JSON for a metric: null where it is NaN or infinite (JSON has no NaN).
inline nlohmann::json nan_to_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

/// A trained network loaded from a checkpoint, with the checkpoint's JSON document.
struct Loaded {
  nlohmann::json meta;
  torch::nn::AnyModule any;
  std::shared_ptr<torch::nn::Module> module;
};

/// The model section without `pretrained`: a checkpoint's own weights replace those.
nlohmann::json without_pretrained(nlohmann::json model);

/// A medfast training checkpoint's network (its config's model section, its weights) on
/// `device` in eval mode; FormatError naming the file when it is not such a checkpoint
/// (evaluate.cpp).
Loaded load_network(const std::string& checkpoint, c10::Device device);

/// The predictor validation, eval and infer run: nn::inference_network of `trained` (a UNet
/// with batch norm folded into its convolutions; `trained` itself where the fold_batch_norm
/// setting is off), autocast to `precision` on `device`, with test-time augmentation `tta`,
/// the network and its input windows laid out in `memory_format` (nn/layout.hpp; `trained`
/// is laid out so too). `model`: the config's model section `trained` was built from. The
/// predictor holds the network it runs.
Predictor inference_predictor(const nlohmann::json& model, const torch::nn::AnyModule& trained,
                              const Settings& settings, const std::string& where, c10::Device device,
                              Precision precision, Tta tta, at::MemoryFormat memory_format);

/// An epoch's TensorBoard scalars at step = its (1-based) epoch (records.cpp; tags in
/// docs/training.md, "TensorBoard"); `first_class`: the label of dice_per_class[0] (0 or 1).
void epoch_events(profile::EventWriter& events, const EpochRecord& rec, std::int64_t first_class);

/// The CUDA caching allocator's peak allocated and reserved bytes on `device` since
/// the last reset; nullopt on the CPU or where this libtorch has no CUDA.
std::optional<std::pair<std::uint64_t, std::uint64_t>> cuda_memory_peaks(c10::Device device);
void reset_cuda_memory_peaks(c10::Device device);
/// The CUDA caching allocator's history (every allocation and free, with its size and
/// stream) on or off, through libtorch's torch::cuda::_record_memory_history (libtorch
/// >= 2.1 with CUDA); false with the reason in `why` where this libtorch cannot.
bool record_cuda_memory_history(bool on, std::string& why);
/// The allocator's state and recorded history, pickled as torch.cuda.memory._snapshot()
/// is dumped (what PyTorch's memory_viz opens); "" where record_cuda_memory_history cannot.
std::string cuda_memory_snapshot_pickled();
/// The PCI bus id of a CUDA device ("00000000:3B:00.0", NVML's form), so NVML samples
/// the same GPU whatever CUDA_VISIBLE_DEVICES says; empty where unknown.
std::string cuda_pci_bus_id(c10::Device device);

/// The stage times of training steps without host syncs of their own. On CUDA each
/// boundary records a timing event on the current (consumer) stream, and a step's times
/// are added once its events have passed: at the next step's host read, or at flush().
/// Events on one stream never wait for the others (the loader's side-stream copies of
/// future batches, which a device-wide synchronize would wait for). The host clock elsewhere.
class StageClock {
 public:
  explicit StageClock(c10::Device device);
  ~StageClock();
  StageClock(const StageClock&) = delete;
  StageClock& operator=(const StageClock&) = delete;
  /// A step begins: its first boundary.
  void start();
  /// `stage` of the current step ends here (and the next one begins).
  void lap(double StageTimes::*stage);
  /// Adds to `times` the stages of earlier steps whose events have passed; never waits.
  void collect(StageTimes& times);
  /// Waits for the current stream to pass every boundary recorded, then adds them all.
  void flush(StageTimes& times);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One validation case: sliding-window inference of its image, post-processing as the
/// loss implies (metric_inputs), and Dice per class, [1, C'] (HD95 in mm too with `hd95`).
struct CaseScores {
  at::Tensor dice;
  at::Tensor hd95;  ///< undefined unless asked for
  /// The logits held NaN or infinity: dice (and hd95) are NaN, whatever argmax made of them.
  bool nonfinite_logits = false;
};
CaseScores score_case(const Sample& sample, const RunConfig& config, const Predictor& predict, c10::Device device,
                      bool hd95, const std::string& where);

/// The deterministic chain restricted to the image key: steps that do not touch the image
/// are dropped (FgBgToIndices too), per-key argument lists keep the image's entry (infer's
/// chain, and the exported bundle's preprocessing).
nlohmann::json image_only_chain(const nlohmann::json& chain, const std::string& image_key);

}  // namespace medfast::train::detail
