#pragma once
/// \file
/// SwinUNETR (v1 and v2) with MONAI 1.3's architecture and arguments
/// (monai.networks.nets.SwinUNETR, Hatamizadeh et al. 2022), 3D only.
///
/// Encoder (`swinViT`): 2x2x2 patch embedding, then four stages of Swin Transformer blocks
/// (window 7, alternately unshifted and shifted by 3, relative position bias tables, masks
/// between the regions a cyclic shift brings together), each ending in patch merging
/// (`merging`: MONAI's v0.9 slice order, kept for weight compatibility; `mergingv2`: the
/// itertools.product order). v2 (`use_v2`) puts a residual conv block (UnetrBasicBlock) at
/// the start of each stage. The five stage outputs are layer-normalised over channels
/// (`normalize`) and feed a UNETR decoder (UnetrBasicBlock / UnetrUpBlock / UnetOutBlock).
///
/// MONAI's window rule, reproduced exactly: in a dimension where a stage's input is no
/// larger than the window, the window shrinks to the input size and the shift there is 0;
/// the bias of a shrunk window of n voxels is read from the first n x n entries of the
/// full window's relative position index (MONAI's indexing, so that weights transfer).
///
/// Attention runs through at::scaled_dot_product_attention where libtorch has it
/// (TORCH_VERSION_MAJOR >= 2), with bias + mask as a float attn_mask; otherwise through
/// matmul-softmax-matmul. detail::window_attention_plain is the latter, exposed for tests.
///
/// Module names follow MONAI's state_dict keys (`swinViT.layers1.0.blocks.1.attn.qkv.weight`,
/// `decoder5.transp_conv.conv.weight`, ...). Parameter counts equal MONAI's (tested against
/// ../shared/reference/monai_param_counts.json).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "medfast/nn/unet.hpp"
#include "medfast/core/fields.hpp"

namespace medfast::nn {

enum class SwinNorm { instance, batch };
constexpr std::array<Choice<SwinNorm>, 2> choices(SwinNorm) {
  return {{{SwinNorm::instance, "instance"}, {SwinNorm::batch, "batch"}}};
}
enum class SwinDownsample { merging, mergingv2 };
constexpr std::array<Choice<SwinDownsample>, 2> choices(SwinDownsample) {
  return {{{SwinDownsample::merging, "merging"}, {SwinDownsample::mergingv2, "mergingv2"}}};
}

struct SwinUNETROptions {
  /// The size the network is configured for; each entry must be divisible by 32 (2^5:
  /// the patch embedding and four mergings). forward() accepts any such size.
  std::vector<std::int64_t> img_size{96, 96, 96};
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 2;
  std::vector<std::int64_t> depths{2, 2, 2, 2};
  std::vector<std::int64_t> num_heads{3, 6, 12, 24};
  std::int64_t feature_size = 48;      ///< divisible by 12
  SwinNorm norm_name = SwinNorm::instance;  ///< of the decoder conv blocks
  double drop_rate = 0.0;
  double attn_drop_rate = 0.0;
  double dropout_path_rate = 0.0;
  bool normalize = true;
  int spatial_dims = 3;                ///< only 3 is supported
  SwinDownsample downsample = SwinDownsample::merging;
  bool use_v2 = false;

  static constexpr std::int64_t kWindowSize = 7;  ///< MONAI's window
  static constexpr std::int64_t kPatchSize = 2;

  /// Throws ValueError naming the bad argument and its value.
  void validate() const;

  static constexpr auto fields() {
    using O = SwinUNETROptions;
    return std::make_tuple(
        field("img_size", &O::img_size, "the size the network is built for (each divisible by 32), or one number")
            .repeats(3),
        field("in_channels", &O::in_channels, "input channels"),
        field("out_channels", &O::out_channels, "output channels (classes)"),
        field("depths", &O::depths, "Swin blocks per stage"),
        field("num_heads", &O::num_heads, "attention heads per stage"),
        field("feature_size", &O::feature_size, "embedding size (divisible by 12)"),
        field("norm_name", &O::norm_name, "normalisation of the convolution blocks"),
        field("drop_rate", &O::drop_rate, "dropout"),
        field("attn_drop_rate", &O::attn_drop_rate, "attention dropout"),
        field("dropout_path_rate", &O::dropout_path_rate, "stochastic depth"),
        field("normalize", &O::normalize, "layer-normalise the stage outputs"),
        field("spatial_dims", &O::spatial_dims, "spatial dimensions (3)"),
        field("downsample", &O::downsample, "patch merging between stages"),
        field("use_v2", &O::use_v2, "SwinUNETR v2 (a residual convolution block per stage)"));
  }
};

namespace detail {

/// Window attention by matmul and softmax: softmax(q k^T / sqrt(head_dim) + bias) v.
/// q, k, v: (B*nW, heads, n, head_dim), windows ordered batch-major; bias: (nW, heads, n, n)
/// (relative position bias plus shift mask; nW = 1 when the same bias applies to all).
torch::Tensor window_attention_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& bias, double dropout_p, bool training);

/// The same through at::scaled_dot_product_attention where libtorch has it, else the plain path.
torch::Tensor window_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& bias, double dropout_p, bool training);

/// True when window_attention uses libtorch's fused scaled-dot-product attention.
bool has_fused_attention();

/// MONAI's compute_mask: (nW, n, n) with 0 between voxels of the same shifted region and
/// -100 between voxels of different ones. dims: padded spatial size (multiples of window).
torch::Tensor shifted_window_mask(const std::array<std::int64_t, 3>& dims, const std::array<std::int64_t, 3>& window,
                                  const std::array<std::int64_t, 3>& shift, const torch::Device& device);

/// (B, D, H, W, C) -> (B*nW, wd*wh*ww, C), windows ordered batch-major then d, h, w.
torch::Tensor window_partition(const torch::Tensor& x, const std::array<std::int64_t, 3>& window);

}  // namespace detail

class SwinTransformerImpl;

class SwinUNETRImpl : public torch::nn::Module {
 public:
  explicit SwinUNETRImpl(SwinUNETROptions options);
  /// x: (N, in_channels, D, H, W) with D, H, W divisible by 32; returns (N, out_channels, D, H, W).
  /// Throws ValueError for other shapes.
  torch::Tensor forward(torch::Tensor x);
  const SwinUNETROptions& options() const { return options_; }

 private:
  SwinUNETROptions options_;
  std::shared_ptr<SwinTransformerImpl> swin_;
  std::vector<torch::nn::AnyModule> encoders_;  // encoder1, 2, 3, 4, 10
  std::vector<torch::nn::AnyModule> decoders_;  // decoder5, 4, 3, 2, 1
  torch::nn::AnyModule out_;
};
TORCH_MODULE(SwinUNETR);

}  // namespace medfast::nn
