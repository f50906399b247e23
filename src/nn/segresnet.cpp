#include "medfast/nn/segresnet.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/norm.hpp"
#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include "medfast/core/error.hpp"

namespace medfast::nn {

void SegResNetOptions::validate() const {
  if (spatial_dims != 3)
    throw ValueError(str("SegResNet: argument spatial_dims ", spatial_dims, " is not supported (3)"));
  if (init_filters < 1) throw ValueError(str("SegResNet: argument init_filters ", init_filters, " must be >= 1"));
  if (in_channels < 1) throw ValueError(str("SegResNet: argument in_channels ", in_channels, " must be >= 1"));
  if (out_channels < 1) throw ValueError(str("SegResNet: argument out_channels ", out_channels, " must be >= 1"));
  if (!(dropout_prob >= 0 && dropout_prob < 1)) {
    throw ValueError(str("SegResNet: argument dropout_prob ", dropout_prob, " is outside [0, 1)"));
  }
  if (norm == SegResNetNorm::group && (num_groups < 1 || init_filters % num_groups != 0)) {
    throw ValueError(
        str("SegResNet: argument num_groups ", num_groups, " must be >= 1 and divide init_filters ", init_filters));
  }
  if (blocks_down.empty()) throw ValueError("SegResNet: argument blocks_down needs at least 1 level");
  for (auto b : blocks_down) {
    if (b < 0) throw ValueError(str("SegResNet: argument blocks_down has a negative entry ", b));
  }
  for (auto b : blocks_up) {
    if (b < 0) throw ValueError(str("SegResNet: argument blocks_up has a negative entry ", b));
  }
  if (blocks_up.size() + 1 != blocks_down.size()) {
    throw ValueError(str("SegResNet: argument blocks_up has ", blocks_up.size(), " entries; blocks_down has ",
                         blocks_down.size(), " levels, so blocks_up needs ", blocks_down.size() - 1));
  }
}

namespace {

// MONAI's get_conv_layer: a Convolution with conv_only=True, i.e. a Sequential holding "conv".
Block conv_layer(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, bool bias) {
  Block s;
  s->push_back(
      "conv",
      Conv3d(torch::nn::Conv3dOptions(in, out, kernel).stride(stride).padding((kernel - 1) / 2).bias(bias)));
  return s;
}

torch::nn::AnyModule make_norm(const SegResNetOptions& o, std::int64_t channels) {
  if (o.norm == SegResNetNorm::group)
    return torch::nn::AnyModule(GroupNorm(torch::nn::GroupNormOptions(o.num_groups, channels)));
  if (o.norm == SegResNetNorm::batch) return torch::nn::AnyModule(torch::nn::BatchNorm3d(channels));
  return torch::nn::AnyModule(InstanceNorm3d(channels));  // affine=False, as MONAI
}

torch::nn::AnyModule make_act(const SegResNetOptions& o) {
  if (o.act == SegResNetAct::leakyrelu)
    return torch::nn::AnyModule(torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.01)));
  return torch::nn::AnyModule(torch::nn::ReLU());
}

// MONAI's segresnet_block.ResBlock: pre-activation, two 3x3x3 convs without bias, identity skip.
class ResBlockImpl : public torch::nn::Module {
 public:
  ResBlockImpl(const SegResNetOptions& o, std::int64_t channels)
      : norm1_(make_norm(o, channels)), norm2_(make_norm(o, channels)), act_(make_act(o)) {
    register_module("norm1", norm1_.ptr());
    register_module("norm2", norm2_.ptr());
    register_module("act", act_.ptr());
    conv1_ = register_module("conv1", conv_layer(channels, channels, 3, 1, false));
    conv2_ = register_module("conv2", conv_layer(channels, channels, 3, 1, false));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = conv1_->forward(act_.forward(norm1_.forward(x)));
    y = conv2_->forward(act_.forward(norm2_.forward(y)));
    return y + x;
  }

 private:
  torch::nn::AnyModule norm1_, norm2_, act_;
  Block conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(ResBlock);

// MONAI's UpSample: a Sequential holding "deconv" (kernel = stride = 2, with bias) or
// "upsample_non_trainable" (trilinear, align_corners=False).
Block upsample_layer(const SegResNetOptions& o, std::int64_t channels) {
  Block s;
  if (o.upsample_mode == UpsampleMode::deconv) {
    s->push_back("deconv",
                 ConvTranspose3d(torch::nn::ConvTranspose3dOptions(channels, channels, 2).stride(2)));
  } else {
    s->push_back("upsample_non_trainable", torch::nn::Upsample(torch::nn::UpsampleOptions()
                                                                   .scale_factor(std::vector<double>{2, 2, 2})
                                                                   .mode(torch::kTrilinear)
                                                                   .align_corners(false)));
  }
  return s;
}

}  // namespace

SegResNetImpl::SegResNetImpl(SegResNetOptions options) : options_(std::move(options)) {
  options_.validate();
  const auto& o = options_;
  conv_init_ = register_module("convInit", conv_layer(o.in_channels, o.init_filters, 3, 1, false));

  auto down_layers = register_module("down_layers", torch::nn::ModuleList());
  for (std::size_t i = 0; i < o.blocks_down.size(); ++i) {
    const std::int64_t c = o.init_filters << i;
    Block level;
    if (i == 0)
      level->push_back(torch::nn::Identity());
    else
      level->push_back(conv_layer(c / 2, c, 3, 2, false));
    for (std::int64_t b = 0; b < o.blocks_down[i]; ++b) level->push_back(ResBlock(o, c));
    down_layers->push_back(level);
    down_.push_back(level);
  }

  auto up_layers = register_module("up_layers", torch::nn::ModuleList());
  auto up_samples = register_module("up_samples", torch::nn::ModuleList());
  const std::size_t n_up = o.blocks_up.size();
  for (std::size_t i = 0; i < n_up; ++i) {
    const std::int64_t c = o.init_filters << (n_up - i);
    Block layer;
    for (std::int64_t b = 0; b < o.blocks_up[i]; ++b) layer->push_back(ResBlock(o, c / 2));
    up_layers->push_back(layer);
    up_layers_.push_back(layer);
    Block sample;
    sample->push_back(conv_layer(c, c / 2, 1, 1, false));
    sample->push_back(upsample_layer(o, c / 2));
    up_samples->push_back(sample);
    up_samples_.push_back(sample);
  }

  conv_final_ = Block();
  conv_final_->push_back(make_norm(o, o.init_filters));
  conv_final_->push_back(make_act(o));
  conv_final_->push_back(conv_layer(o.init_filters, o.out_channels, 1, 1, true));
  register_module("conv_final", conv_final_);

  if (o.dropout_prob > 0) dropout_ = register_module("dropout", torch::nn::Dropout3d(o.dropout_prob));
}

torch::Tensor SegResNetImpl::forward(torch::Tensor x) {
  const std::int64_t factor = std::int64_t{1} << (options_.blocks_down.size() - 1);
  if (x.dim() != 5 || x.size(1) != options_.in_channels || x.size(2) % factor || x.size(3) % factor ||
      x.size(4) % factor) {
    throw ValueError(str("SegResNet: input of shape ", x.sizes(), " is not (N, ", options_.in_channels,
                         ", D, H, W) with D, H, W divisible by ", factor));
  }
  x = conv_init_->forward(x);
  if (dropout_) x = dropout_->forward(x);
  std::vector<torch::Tensor> skips;
  for (auto& level : down_) {
    x = level->forward(x);
    skips.push_back(x);
  }
  for (std::size_t i = 0; i < up_samples_.size(); ++i) {
    x = up_samples_[i]->forward(x) + skips[skips.size() - 2 - i];
    if (!up_layers_[i]->is_empty()) x = up_layers_[i]->forward(x);
  }
  return conv_final_->forward(x);
}

// The entry of network.cpp's table.
NetworkSpec segresnet_network(ConfigReader& arguments, const std::string& where) {
  return detail::network_spec<SegResNetOptions, SegResNet>(arguments, "SegResNet", where);
}

}  // namespace medfast::nn
