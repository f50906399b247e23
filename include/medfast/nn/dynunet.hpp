#pragma once
/// \file
/// DynUNet with MONAI 1.3's architecture and arguments (monai.networks.nets.DynUNet, the
/// network nnU-Net plans): per-level kernel sizes and strides (anisotropic allowed), blocks of
/// conv -> norm -> leaky ReLU twice (UnetBasicBlock) or with a residual path (UnetResBlock),
/// transposed-convolution upsampling with skip concatenation, a 1x1x1 output convolution, and
/// optional deep-supervision heads.
///
///   input_block (kernel_size[0], strides[0]) -> downsamples (levels 1 .. n-2) -> bottleneck
///   (the last level) -> upsamples (bottom up: transposed conv by strides[i], concat the skip,
///   a basic block) -> output_block
///
/// Module names are MONAI's state_dict keys, shared modules included: MONAI registers each
/// block twice (`input_block.conv1.conv.weight` and `skip_layers.downsample.conv1.conv.weight`
/// name one tensor), and so does medfast, so a MONAI state_dict loads by name and an exported
/// one has MONAI's keys in MONAI's order. Weights start as MONAI's: Kaiming-normal
/// (negative slope 0.01) convolutions, zero biases.
///
/// Deep supervision: in training mode the forward returns [N, 1 + deep_supr_num, C, X, Y, Z],
/// the output first, then each head's output (levels 1 .. deep_supr_num, highest first)
/// resized to the output's size by nearest interpolation (MONAI's stacking); in eval mode the
/// output alone. The loss weights of that stack are nnU-Net's (deep_supervision_weights).
#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"
#include "medfast/nn/unet.hpp"

namespace medfast::nn {

/// DynUNet's normalisation (MONAI's norm_name): instance (affine, MONAI's default) or batch.
enum class DynUNetNorm { instance, batch };
constexpr std::array<Choice<DynUNetNorm>, 2> choices(DynUNetNorm) {
  return {{{DynUNetNorm::instance, "instance"}, {DynUNetNorm::batch, "batch"}}};
}

struct DynUNetOptions {
  int spatial_dims = 3;
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 2;
  /// Per level: an integer (every axis) or [x, y, z]. At least 3 levels.
  nlohmann::json kernel_size = nlohmann::json::array({3, 3, 3, 3, 3});
  nlohmann::json strides = nlohmann::json::array({1, 2, 2, 2, 2});
  /// Per upsampling level (levels 1 .. n-1); MONAI expects strides[1:].
  nlohmann::json upsample_kernel_size = nlohmann::json::array({2, 2, 2, 2});
  /// Channels per level; empty: nnU-Net's min(32 * 2^i, 320).
  std::vector<std::int64_t> filters;
  double dropout = 0.0;
  DynUNetNorm norm_name = DynUNetNorm::instance;
  bool deep_supervision = false;
  std::int64_t deep_supr_num = 1;
  bool res_block = false;
  bool trans_bias = false;

  /// Throws ValueError naming the bad argument and its value (level counts, kernel and stride
  /// combinations MONAI cannot pad, deep_supr_num out of range).
  void validate() const;
  /// kernel_size, strides, upsample_kernel_size per level, each [x, y, z] (validated).
  std::vector<std::array<std::int64_t, 3>> kernels() const;
  std::vector<std::array<std::int64_t, 3>> stride_list() const;
  std::vector<std::array<std::int64_t, 3>> upsample_kernels() const;
  /// filters, or nnU-Net's default for the number of levels.
  std::vector<std::int64_t> level_filters() const;

  static constexpr auto fields() {
    using O = DynUNetOptions;
    return std::make_tuple(
        field("spatial_dims", &O::spatial_dims, "spatial dimensions (3)"),
        field("in_channels", &O::in_channels, "input channels"),
        field("out_channels", &O::out_channels, "output channels (classes, background included)"),
        field("kernel_size", &O::kernel_size, "convolution kernel per level: an integer or [x, y, z] each"),
        field("strides", &O::strides, "stride per level (the first: the input block's): an integer or [x, y, z]"),
        field("upsample_kernel_size", &O::upsample_kernel_size,
              "transposed-convolution kernel (and stride) per upsampling level: strides[1:]"),
        field("filters", &O::filters, "channels per level (empty: nnU-Net's min(32 * 2^level, 320))"),
        field("dropout", &O::dropout, "dropout after each convolution (0: none)"),
        field("norm_name", &O::norm_name, "normalisation (instance: with affine parameters, MONAI's default)"),
        field("deep_supervision", &O::deep_supervision,
              "train on the output and deep_supr_num upper levels' heads (nnU-Net's loss weights)"),
        field("deep_supr_num", &O::deep_supr_num, "deep-supervision heads (1 .. levels - 2)"),
        field("res_block", &O::res_block, "residual blocks (UnetResBlock) instead of plain ones"),
        field("trans_bias", &O::trans_bias, "bias in the transposed convolutions"));
  }
};

class DynUNetImpl : public torch::nn::Module {
 public:
  explicit DynUNetImpl(DynUNetOptions options);
  /// x: (N, in_channels, X, Y, Z), each spatial size divisible by the product of the strides
  /// along it; see the file comment for the output. Throws ValueError for other shapes.
  torch::Tensor forward(torch::Tensor x);
  const DynUNetOptions& options() const { return options_; }

 private:
  DynUNetOptions options_;
  std::shared_ptr<torch::nn::Module> skip_layers_;
  Block output_block_{nullptr};
  std::shared_ptr<std::vector<torch::Tensor>> heads_;
};
TORCH_MODULE(DynUNet);

/// nnU-Net v2's deep-supervision loss weights for `outputs` stacked outputs (the full-size
/// output first): 1 / 2^i, normalised to sum 1, with the last (lowest-resolution) output's
/// weight 0 when `drop_lowest`: nnU-Net drops its lowest decoder output, which a DynUNet's
/// stack holds when deep_supr_num = levels - 2 (every decoder level). ValueError for < 1.
std::vector<double> deep_supervision_weights(std::int64_t outputs, bool drop_lowest);

}  // namespace medfast::nn
