#pragma once
/// \file
/// What the trainer needs from a process group (implemented above it, in dist/):
/// the trainer only talks to this interface, so training code does not depend on
/// c10d and single-process runs need none.
#include <ATen/core/Tensor.h>

#include <vector>

namespace medfast::train {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// In place, summed over ranks.
  virtual void allreduce_sum(at::Tensor& tensor) = 0;
  /// Every parameter's gradient becomes the mean over ranks (coalesced).
  virtual void allreduce_mean_gradients(const std::vector<at::Tensor>& parameters) = 0;
  /// In place, rank `root`'s value.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
};

}  // namespace medfast::train
