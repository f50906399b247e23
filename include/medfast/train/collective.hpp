#pragma once
/// \file
/// What the trainer needs from a process group (implemented above it, in dist/):
/// the trainer only talks to this interface, so training code does not depend on
/// c10d and single-process runs need none.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace medfast::train {

/// Gradient averaging overlapped with backward, as torch's DistributedDataParallel
/// does it: the parameters' gradients are gathered into buckets of about the
/// process group's bucket size (parameters in reverse order, roughly the order
/// backward produces them), and each bucket's all-reduce starts as soon as all
/// its gradients have arrived, while backward goes on. One backward per step,
/// after the gradients were zeroed (no gradient accumulation across backwards).
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  /// Before each backward.
  virtual void prepare() = 0;
  /// After backward: starts the buckets whose gradients did not all arrive (a
  /// parameter unused on this rank counts as zero), waits for every bucket and
  /// leaves each gradient the mean over ranks; a parameter that no rank had a
  /// gradient for keeps none.
  virtual void finish() = 0;
  /// Buckets whose all-reduce started during backward in the last step (the rest
  /// started in finish()).
  virtual int buckets_started_in_backward() const = 0;
  virtual int buckets() const = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// In place, summed over ranks.
  virtual void allreduce_sum(at::Tensor& tensor) = 0;
  /// Every parameter's gradient becomes the mean over ranks, now (after backward).
  virtual void allreduce_mean_gradients(const std::vector<at::Tensor>& parameters) = 0;
  /// Hooks on `parameters` (kept until the returned object is destroyed) that
  /// average their gradients while backward runs (see GradientSync).
  virtual std::unique_ptr<GradientSync> gradient_sync(const std::vector<at::Tensor>& parameters) = 0;
  /// In place, rank `root`'s value.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  /// Every tensor in place, rank `root`'s values, in one collective per dtype.
  virtual void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root) = 0;
  /// The process group's backend: "gloo" or "nccl".
  virtual const char* backend() const = 0;
  /// Leaves this rank's error where its peers find it, so that their own failure
  /// (a collective this rank never joins) names this rank and its error. Best effort.
  virtual void announce_failure(const std::string& message) = 0;
};

}  // namespace medfast::train
