#pragma once
/// \file
/// UNet with MONAI's architecture and arguments (monai.networks.nets.UNet):
/// recursive down / skip-concatenate / up blocks, ResidualUnits when
/// num_res_units > 0, Convolution + ADN (norm, dropout, PReLU) otherwise.
/// Parameter counts equal MONAI's for the same arguments (tested against
/// ../shared/reference/monai_param_counts.json).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"

namespace medfast::nn {

/// UNet's normalisation after each convolution (MONAI's norm: INSTANCE, BATCH or None).
enum class UNetNorm { instance, batch, none };
constexpr std::array<Choice<UNetNorm>, 3> choices(UNetNorm) {
  return {{{UNetNorm::instance, "instance"}, {UNetNorm::batch, "batch"}, {UNetNorm::none, "none"}}};
}

struct UNetOptions {
  int spatial_dims = 3;
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 2;
  std::vector<std::int64_t> channels{16, 32, 64, 128, 256};
  std::vector<std::int64_t> strides{2, 2, 2, 2};
  std::int64_t kernel_size = 3;
  std::int64_t up_kernel_size = 3;
  int num_res_units = 0;
  UNetNorm norm = UNetNorm::instance;
  double dropout = 0.0;

  /// Throws ValueError naming the bad argument (channels/strides lengths...).
  void validate() const;

  static constexpr auto fields() {
    using O = UNetOptions;
    return std::make_tuple(
        field("spatial_dims", &O::spatial_dims, "spatial dimensions (3)"),
        field("in_channels", &O::in_channels, "input channels"),
        field("out_channels", &O::out_channels, "output channels (classes, background included)"),
        field("channels", &O::channels, "channels per level, top to bottom"),
        field("strides", &O::strides, "downsampling stride after each level but the last"),
        field("kernel_size", &O::kernel_size, "convolution kernel size"),
        field("up_kernel_size", &O::up_kernel_size, "transposed-convolution kernel size"),
        field("num_res_units", &O::num_res_units, "residual units per level (0: plain convolutions)"),
        field("norm", &O::norm, "normalisation after each convolution"),
        field("dropout", &O::dropout, "dropout probability"));
  }
};

/// A Sequential with a concrete forward, so that blocks can nest (libtorch's
/// Sequential cannot hold another Sequential).
class BlockImpl : public torch::nn::SequentialImpl {
 public:
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(x); }
};
TORCH_MODULE(Block);

class UNetImpl : public torch::nn::Module {
 public:
  explicit UNetImpl(UNetOptions options);
  torch::Tensor forward(torch::Tensor x);
  const UNetOptions& options() const { return options_; }

 private:
  UNetOptions options_;
  Block model_{nullptr};
};
TORCH_MODULE(UNet);

/// The trained UNet's eval-mode function with each batch norm folded into the convolution
/// before it (batch norm's eval step is an affine map per channel): a UNet with norm none
/// whose convolution weights are scaled by gamma / sqrt(running_var + eps) per output
/// channel and whose biases are (bias - running_mean) * scale + beta, computed in float64
/// and stored in the parameters' dtype, on the trained network's device, in eval mode,
/// without gradients. Outputs equal the trained network's eval outputs up to rounding.
/// ValueError if `trained` does not have norm batch with running statistics.
UNet fold_batch_norm(UNetImpl& trained);

/// Trainable parameters of a module.
std::int64_t count_parameters(const torch::nn::Module& module);

}  // namespace medfast::nn
