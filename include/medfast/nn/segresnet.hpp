#pragma once
/// \file
/// SegResNet with MONAI 1.3's architecture and arguments (monai.networks.nets.SegResNet,
/// Myronenko 2018, without the VAE branch):
///
///   convInit (3x3x3, no bias) -> [dropout] -> down_layers: level i = [stride-2 conv] + blocks_down[i] ResBlocks
///   up: 1x1x1 conv halving channels -> x2 upsampling (trilinear or transposed conv) -> + skip -> ResBlocks
///   conv_final: norm -> act -> 1x1x1 conv with bias
///
/// ResBlock = norm -> act -> conv -> norm -> act -> conv, plus the identity. Module names follow
/// MONAI's state_dict keys (`down_layers.1.0.conv.weight`, `up_samples.0.1.deconv.weight`, ...).
/// Parameter counts equal MONAI's for the same arguments (tested against
/// ../shared/reference/monai_param_counts.json).

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/nn/unet.hpp"
#include "medfast/core/fields.hpp"

namespace medfast::nn {

enum class SegResNetAct { relu, leakyrelu };
constexpr std::array<Choice<SegResNetAct>, 2> choices(SegResNetAct) {
  return {{{SegResNetAct::relu, "relu"}, {SegResNetAct::leakyrelu, "leakyrelu"}}};
}
enum class SegResNetNorm { group, batch, instance };
constexpr std::array<Choice<SegResNetNorm>, 3> choices(SegResNetNorm) {
  return {{{SegResNetNorm::group, "group"}, {SegResNetNorm::batch, "batch"}, {SegResNetNorm::instance, "instance"}}};
}
enum class UpsampleMode { nontrainable, deconv };
constexpr std::array<Choice<UpsampleMode>, 2> choices(UpsampleMode) {
  return {{{UpsampleMode::nontrainable, "nontrainable"}, {UpsampleMode::deconv, "deconv"}}};
}

struct SegResNetOptions {
  int spatial_dims = 3;  ///< only 3 is supported
  std::int64_t init_filters = 8;
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 2;
  double dropout_prob = 0.0;    ///< 0 = no dropout (MONAI's None); Dropout3d after convInit
  SegResNetAct act = SegResNetAct::relu;
  SegResNetNorm norm = SegResNetNorm::group;
  std::int64_t num_groups = 8;  ///< for norm == group
  std::vector<std::int64_t> blocks_down{1, 2, 2, 4};
  std::vector<std::int64_t> blocks_up{1, 1, 1};
  UpsampleMode upsample_mode = UpsampleMode::nontrainable;

  /// Throws ValueError naming the bad argument and its value.
  void validate() const;

  static constexpr auto fields() {
    using O = SegResNetOptions;
    return std::make_tuple(
        field("spatial_dims", &O::spatial_dims, "spatial dimensions (3)"),
        field("init_filters", &O::init_filters, "channels of the first level"),
        field("in_channels", &O::in_channels, "input channels"),
        field("out_channels", &O::out_channels, "output channels (classes)"),
        field("dropout_prob", &O::dropout_prob, "dropout after the first convolution (null or 0: none)"),
        field("act", &O::act, "activation (leakyrelu: negative slope 0.01)"),
        field("norm", &O::norm, "normalisation"),
        field("num_groups", &O::num_groups, "groups of the group norm"),
        field("blocks_down", &O::blocks_down, "residual blocks per encoder level"),
        field("blocks_up", &O::blocks_up, "residual blocks per decoder level"),
        field("upsample_mode", &O::upsample_mode, "decoder upsampling (nontrainable: trilinear)"));
  }
};

class SegResNetImpl : public torch::nn::Module {
 public:
  explicit SegResNetImpl(SegResNetOptions options);
  /// x: (N, in_channels, D, H, W), each spatial size divisible by 2^(levels-1); returns
  /// (N, out_channels, D, H, W). Throws ValueError for other shapes.
  torch::Tensor forward(torch::Tensor x);
  const SegResNetOptions& options() const { return options_; }

 private:
  SegResNetOptions options_;
  Block conv_init_{nullptr};
  torch::nn::Dropout3d dropout_{nullptr};
  std::vector<Block> down_, up_layers_, up_samples_;
  Block conv_final_{nullptr};
};
TORCH_MODULE(SegResNet);

}  // namespace medfast::nn
