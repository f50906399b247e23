#pragma once
/// \file
/// Instance and group normalisation for channels-last networks: torch::nn::InstanceNorm3d and
/// GroupNorm with the same options, parameters, buffers and state_dict names, whose forward
/// keeps a channels-last input channels-last.
///
/// libtorch's instance norm makes its input contiguous (NCDHW) and normalises that (its
/// batch-norm implementation over a [1, N*C, ...] view), and its CUDA group norm does the
/// same: in a channels-last network each norm would turn the activations round to NCDHW
/// and back (pytorch issue 59168: an nnU-Net network 24% slower channels-last on an A100).
/// Here a channels-last [N, C, D, H, W] tensor is viewed (no copy) as [N, DHW, G, C/G],
/// its mean and variance taken over the voxels and the group's channels (in float32 for
/// half-precision inputs, as libtorch's kernels accumulate), and the normalised, affine
/// result written in the input's dtype and layout: ATen operations, so CPU, CUDA and ROCm
/// alike, with autograd's backward. Instance norm is the group norm with one channel per
/// group. Contiguous inputs, and instance norms that track running statistics, take
/// libtorch's own forward. Equal to libtorch's within float rounding (tests/nn/test_layout.cpp).
#include <ATen/ATen.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>

namespace medfast::nn {

/// Group normalisation of a channels-last 5-D tensor over each sample's groups of
/// channels (weight and bias per channel, or undefined); the result is channels-last.
at::Tensor channels_last_group_norm(const at::Tensor& x, std::int64_t groups, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps);

/// torch::nn::InstanceNorm3d's options, parameters (weight, bias where affine) and buffers
/// (running_mean, running_var, num_batches_tracked where it tracks running statistics). A
/// module of its own rather than a subclass: libtorch does not export the pieces of its
/// InstanceNormImpl template a subclass's virtual table needs.
class InstanceNorm3dImpl : public torch::nn::Cloneable<InstanceNorm3dImpl> {
 public:
  explicit InstanceNorm3dImpl(std::int64_t num_features)
      : InstanceNorm3dImpl(torch::nn::InstanceNorm3dOptions(num_features)) {}
  explicit InstanceNorm3dImpl(const torch::nn::InstanceNorm3dOptions& options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);

  torch::nn::InstanceNorm3dOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(InstanceNorm3d);

class GroupNormImpl : public torch::nn::GroupNormImpl {
 public:
  using torch::nn::GroupNormImpl::GroupNormImpl;
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(GroupNorm);

}  // namespace medfast::nn
