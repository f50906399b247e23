#pragma once
/// \file
/// The optimizer update of a training step over all parameters at once.
///
/// torch::optim's step() updates one parameter at a time: for the spleen UNet that is a
/// few hundred small kernels per step on a GPU, and it has no way to skip itself on the
/// device, so a step whose gradients are not finite needs the host to look first (a
/// synchronisation every step). ParameterUpdate applies the same arithmetic as SGD, Adam,
/// AdamW (libtorch's) and Novograd (MONAI's, optim.hpp) to every parameter of a group with
/// one launch per operation:
///
///   fused    libtorch's fused optimizer kernels (_fused_sgd_, _fused_adam_, _fused_adamw_:
///            one kernel for the whole update) where this libtorch has them for the
///            parameters' device (libtorch 2.x: CUDA, and the CPU from 2.4); the kernel
///            itself skips the step when the skip flag is 1.
///   foreach  the multi-tensor ops (at::_foreach_*: libtorch 1.13 and 2.x, every device),
///            everywhere else and for Novograd; a step to skip is put back on the device
///            (each tensor it wrote takes its old value where the flag is 1), or, where the
///            parameters live on the CPU and no device waits, not taken after reading the flag.
///
/// The state is the optimizer's own per-parameter state (momentum buffers, moments, step
/// counts), created as torch::optim creates it: checkpoints (torch::save of the optimizer),
/// Optimizer::step() and this update are interchangeable at any step. Tested against the
/// per-parameter step() over the golden trajectories (tests/train/test_update.cpp).
///
/// The host learns a step later whether a flagged step was skipped (the training step reads
/// its outcome while the next one runs, train/step.hpp); it must call skipped() before the
/// next apply(), which puts back what the host keeps itself: step counts (Adam's bias
/// correction) and whether SGD's momentum buffers hold a first step yet.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "medfast/train/optim.hpp"

namespace medfast::train {

enum class UpdateKernel { per_parameter, foreach, fused };

/// "per_parameter", "foreach" or "fused".
const char* update_kernel_name(UpdateKernel k);

class ParameterUpdate {
 public:
  /// `optimizer`: one make_optimizer made, `name` its kind (SGD, Adam, AdamW, Novograd).
  /// `preferred`: fused (the default: fused where available, else foreach), foreach, or
  /// per_parameter (optimizer.step(), for comparison; it cannot skip on the device).
  ParameterUpdate(torch::optim::Optimizer& optimizer, std::string name, UpdateKernel preferred = UpdateKernel::fused);

  /// One update of every parameter that has a gradient, at each group's learning rate.
  /// `skip`: float32 [1] on the parameters' device, 1 where this step must change nothing
  /// (non-finite gradients), 0 where it applies; undefined: it applies. Nothing waits for
  /// the device unless the parameters are on the CPU.
  void apply(const at::Tensor& skip = {});
  /// The last apply() was skipped on the device (its flag was 1): the host's own records
  /// go back. At most once per apply(), before the next.
  void skipped();

  /// What the last apply() ran (per group: the last group's).
  UpdateKernel kernel() const { return last_; }

  /// Tests: on CPU parameters, skip as on a GPU (put the old values back where the flag is
  /// 1) instead of reading the flag first.
  void set_device_skip_on_cpu(bool on) { device_skip_on_cpu_ = on; }

  // CUDA graphs (train.cuda_graph, step.hpp): an update captured once and replayed each step
  // runs its kernels again but none of the host's code.
  /// Whether the last apply() can be replayed as captured: its arithmetic takes nothing from
  /// the host that changes from step to step. The fused kernels and the multi-tensor SGD and
  /// Novograd can; the multi-tensor Adam and AdamW cannot (their bias corrections are host
  /// numbers of the step count).
  bool capturable() const;
  /// Before a capture: the fused Adam's step counts become device tensors (from the host's
  /// counts) that the captured update advances itself and puts back where it skips, so that
  /// each replay sees its own count. The learning rate is captured as it is now.
  void prepare_capture();
  /// A replay of the captured update took place: the host's records advance as the captured
  /// apply()'s did (skipped() puts them back as for an apply()).
  void replayed();

 private:
  struct Group;
  void sgd(Group& g, const at::Tensor& skip);
  void adam(Group& g, const at::Tensor& skip, bool decoupled);
  void novograd(Group& g, const at::Tensor& skip);
  /// The fused kernels where this libtorch and device have them; false where not (nothing ran).
  bool fused_sgd(Group& g, const at::Tensor& skip, const std::vector<std::size_t>& older,
                 const std::vector<std::size_t>& fresh);
  bool fused_adam(Group& g, const at::Tensor& skip, bool decoupled);

  torch::optim::Optimizer& optimizer_;
  std::string name_;
  UpdateKernel preferred_;
  UpdateKernel last_ = UpdateKernel::foreach;
  bool fused_unavailable_ = false;  // the first fused call found no kernel for this device
  bool device_skip_on_cpu_ = false;
  /// What the last apply() did that skipped() puts back: whether it ran at all (not read
  /// as skipped on the host), whose step counts went up (Adam, AdamW, Novograd), whose
  /// momentum buffers it wrote first (SGD).
  bool applied_ = false;
  std::vector<OptimizerStateKey> stepped_, first_momentum_;
  /// prepare_capture(): the fused Adam's step counts on the device, per parameter.
  std::map<OptimizerStateKey, at::Tensor> device_steps_;
};

}  // namespace medfast::train
