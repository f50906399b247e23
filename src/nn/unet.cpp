#include "medfast/nn/unet.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/norm.hpp"
#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include <map>

#include "medfast/core/error.hpp"

namespace medfast::nn {

void UNetOptions::validate() const {
  if (spatial_dims != 3) throw ValueError(str("UNet: spatial_dims ", spatial_dims, " is not supported (3)"));
  if (in_channels < 1) throw ValueError(str("UNet: argument in_channels ", in_channels, " must be >= 1"));
  if (out_channels < 1) throw ValueError(str("UNet: argument out_channels ", out_channels, " must be >= 1"));
  if (channels.size() < 2) throw ValueError("UNet: argument channels needs at least 2 levels");
  for (const std::int64_t c : channels) {
    if (c < 1) throw ValueError(str("UNet: argument channels entry ", c, " must be >= 1"));
  }
  for (const std::int64_t s : strides) {
    if (s < 1) throw ValueError(str("UNet: argument strides entry ", s, " must be >= 1"));
  }
  if (strides.size() != channels.size() - 1) {
    throw ValueError(str("UNet: argument strides has ", strides.size(), " entries; channels has ", channels.size(),
                         " levels, so strides needs ", channels.size() - 1));
  }
  if (kernel_size < 1 || up_kernel_size < 1 || kernel_size % 2 == 0 || up_kernel_size % 2 == 0) {
    throw ValueError(str("UNet: arguments kernel_size ", kernel_size, " and up_kernel_size ", up_kernel_size,
                         " must be odd and >= 1"));
  }
  if (dropout < 0 || dropout >= 1) throw ValueError(str("UNet: argument dropout ", dropout, " is outside [0, 1)"));
  if (num_res_units < 0) throw ValueError("UNet: argument num_res_units must be >= 0");
}

namespace {

// Module names are MONAI's (`model.0.conv.unit0.adn.N.weight`, `model.1.submodule.2.0.conv.weight`,
// ...), so a state_dict of MONAI's UNet with the same arguments loads by name (nn/pretrained).

// MONAI's Convolution: `conv` (or a transposed conv), then `adn` = N (norm), D (dropout), A (PReLU).
Block convolution(const UNetOptions& o, std::int64_t in, std::int64_t out, std::int64_t stride,
                  std::int64_t kernel, bool transposed, bool conv_only) {
  Block s;
  const std::int64_t pad = (kernel - 1) / 2;
  if (transposed) {
    s->push_back("conv", ConvTranspose3d(torch::nn::ConvTranspose3dOptions(in, out, kernel)
                                                        .stride(stride)
                                                        .padding(pad)
                                                        .output_padding(stride - 1)));
  } else {
    s->push_back("conv", Conv3d(torch::nn::Conv3dOptions(in, out, kernel).stride(stride).padding(pad)));
  }
  if (conv_only) return s;
  Block adn;
  if (o.norm == UNetNorm::batch) adn->push_back("N", torch::nn::BatchNorm3d(out));
  if (o.norm == UNetNorm::instance) adn->push_back("N", InstanceNorm3d(out));  // affine=False, as MONAI
  if (o.dropout > 0) adn->push_back("D", torch::nn::Dropout(o.dropout));
  adn->push_back("A", torch::nn::PReLU());
  s->push_back("adn", adn);
  return s;
}

// MONAI's ResidualUnit: `subunits` Convolutions (conv.unit0, conv.unit1, ...) plus a residual
// path that adapts channels/size (1x1 conv if only channels change).
class ResidualUnitImpl : public torch::nn::Module {
 public:
  ResidualUnitImpl(const UNetOptions& o, std::int64_t in, std::int64_t out, std::int64_t stride, int subunits,
                   bool last_conv_only) {
    conv_ = register_module("conv", Block());
    std::int64_t c = in, s = stride;
    subunits = std::max(1, subunits);
    for (int su = 0; su < subunits; ++su) {
      conv_->push_back(str("unit", su),
                       convolution(o, c, out, s, o.kernel_size, false, last_conv_only && su == subunits - 1));
      c = out;
      s = 1;
    }
    if (stride != 1 || in != out) {
      const std::int64_t k = stride == 1 ? 1 : o.kernel_size, p = stride == 1 ? 0 : (o.kernel_size - 1) / 2;
      residual_ = register_module("residual",
                                  Conv3d(torch::nn::Conv3dOptions(in, out, k).stride(stride).padding(p)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor res = residual_ ? residual_->forward(x) : x;
    return conv_->forward(x) + res;
  }

 private:
  Block conv_{nullptr};
  Conv3d residual_{nullptr};
};
TORCH_MODULE(ResidualUnit);

// SkipConnection: cat([x, submodule(x)], dim=1).
class SkipImpl : public torch::nn::Module {
 public:
  explicit SkipImpl(torch::nn::AnyModule sub) : sub_(std::move(sub)) { register_module("submodule", sub_.ptr()); }
  torch::Tensor forward(torch::Tensor x) { return torch::cat({x, sub_.forward(x)}, 1); }

 private:
  torch::nn::AnyModule sub_;
};
TORCH_MODULE(Skip);

// A ResidualUnit, else a Convolution (MONAI's _get_down_layer; the bottom layer is one with stride 1).
torch::nn::AnyModule down_layer(const UNetOptions& o, std::int64_t in, std::int64_t out, std::int64_t stride) {
  if (o.num_res_units > 0) return torch::nn::AnyModule(ResidualUnit(o, in, out, stride, o.num_res_units, false));
  return torch::nn::AnyModule(convolution(o, in, out, stride, o.kernel_size, false, false));
}

// A transposed Convolution, followed by a one-subunit ResidualUnit when num_res_units > 0.
torch::nn::AnyModule up_layer(const UNetOptions& o, std::int64_t in, std::int64_t out, std::int64_t stride,
                              bool is_top) {
  Block conv = convolution(o, in, out, stride, o.up_kernel_size, true, is_top && o.num_res_units == 0);
  if (o.num_res_units == 0) return torch::nn::AnyModule(conv);
  Block s;
  s->push_back(conv);
  s->push_back(ResidualUnit(o, out, out, 1, 1, is_top));
  return torch::nn::AnyModule(s);
}

Block block(const UNetOptions& o, std::int64_t in, std::int64_t out, std::size_t level, bool is_top) {
  const std::int64_t c = o.channels[level], s = o.strides[level];
  torch::nn::AnyModule sub;
  std::int64_t up_in;
  if (o.channels.size() - level > 2) {
    sub = torch::nn::AnyModule(block(o, c, c, level + 1, false));
    up_in = c * 2;
  } else {
    sub = down_layer(o, c, o.channels[level + 1], 1);  // the bottom layer
    up_in = c + o.channels[level + 1];
  }
  Block seq;
  seq->push_back(down_layer(o, in, c, s));
  seq->push_back(Skip(std::move(sub)));
  seq->push_back(up_layer(o, up_in, out, s, is_top));
  return seq;
}

}  // namespace

UNetImpl::UNetImpl(UNetOptions options) : options_(std::move(options)) {
  options_.validate();
  model_ = register_module("model", block(options_, options_.in_channels, options_.out_channels, 0, true));
}

torch::Tensor UNetImpl::forward(torch::Tensor x) { return model_->forward(x); }

UNet fold_batch_norm(UNetImpl& trained) {
  if (trained.options().norm != UNetNorm::batch) throw ValueError("UNet: only a network with norm batch can be folded");
  // MONAI's Convolution P holds P.conv then P.adn.N: the norm after that convolution.
  struct Norm {
    at::Tensor scale, shift;  // float64: y = conv(x) * scale + shift, per output channel
    bool transposed = false;
  };
  std::map<std::string, Norm> norms;  // by P
  const auto modules = trained.named_modules("", /*include_self=*/false);
  const std::string suffix = ".adn.N";
  for (const auto& m : modules) {
    const auto* bn = m.value()->as<torch::nn::BatchNorm3dImpl>();
    if (bn == nullptr) continue;
    const std::string& name = m.key();
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0 ||
        !bn->running_var.defined() || !bn->weight.defined()) {
      throw ValueError(str("UNet: batch norm ", name, " cannot be folded (not after a convolution, or no running "
                           "statistics or affine parameters)"));
    }
    const std::string prefix = name.substr(0, name.size() - suffix.size());
    const auto conv = modules.find(prefix + ".conv");
    if (conv == nullptr) throw ValueError(str("UNet: batch norm ", name, " has no convolution ", prefix, ".conv"));
    Norm n;
    n.transposed = (*conv)->as<torch::nn::ConvTranspose3dImpl>() != nullptr;
    const at::Tensor var = bn->running_var.to(at::kDouble), mean = bn->running_mean.to(at::kDouble);
    n.scale = bn->weight.to(at::kDouble) / (var + bn->options.eps()).sqrt();
    n.shift = bn->bias.to(at::kDouble) - mean * n.scale;
    norms.emplace(prefix, std::move(n));
  }
  UNetOptions o = trained.options();
  o.norm = UNetNorm::none;
  UNet folded(o);
  const auto source = trained.named_parameters(/*recurse=*/true);
  if (!source.is_empty()) folded->to(source.front().value().device());
  torch::NoGradGuard no_grad;
  for (auto& p : folded->named_parameters(/*recurse=*/true)) {
    const std::string& name = p.key();
    const at::Tensor* from = source.find(name);
    if (from == nullptr) throw ValueError(str("UNet: folding found no trained parameter ", name));
    at::Tensor value = *from;
    for (const char* end : {".conv.weight", ".conv.bias"}) {
      const std::string e = end;
      if (name.size() <= e.size() || name.compare(name.size() - e.size(), e.size(), e) != 0) continue;
      const auto it = norms.find(name.substr(0, name.size() - e.size()));
      if (it == norms.end()) continue;
      const Norm& n = it->second;
      const at::Tensor v = value.to(at::kDouble);
      if (e == ".conv.bias") {
        value = (v * n.scale + n.shift).to(value.scalar_type());
      } else {  // weight [out, in, k...], transposed [in, out, k...]: scale each output channel
        std::vector<std::int64_t> shape(static_cast<std::size_t>(v.dim()), 1);
        shape[n.transposed ? 1 : 0] = -1;
        value = (v * n.scale.reshape(shape)).to(value.scalar_type());
      }
    }
    p.value().copy_(value);
    p.value().set_requires_grad(false);
  }
  folded->eval();
  return folded;
}

std::int64_t count_parameters(const torch::nn::Module& module) {
  std::int64_t n = 0;
  for (const auto& p : unique_tensors(module.parameters())) {
    if (p.requires_grad()) n += p.numel();
  }
  return n;
}

// The entry of network.cpp's table.
NetworkSpec unet_network(ConfigReader& arguments, const std::string& where) {
  NetworkSpec spec = detail::network_spec<UNetOptions, UNet>(arguments, "UNet", where);
  if (spec.arguments.value("norm", "") == "batch") {
    spec.for_inference = [](const torch::nn::AnyModule& trained) {
      const auto unet = std::dynamic_pointer_cast<UNetImpl>(trained.ptr());
      if (!unet) throw ValueError("UNet: inference_network was given another network");
      return torch::nn::AnyModule(fold_batch_norm(*unet));
    };
  }
  return spec;
}

}  // namespace medfast::nn
