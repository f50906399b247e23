#include "medfast/nn/dynunet.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/norm.hpp"
#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include "medfast/core/error.hpp"

namespace medfast::nn {

namespace {

using Triple = std::array<std::int64_t, 3>;

std::string triple_text(const Triple& t) { return str("[", t[0], ", ", t[1], ", ", t[2], "]"); }

// A per-level argument: each entry an integer (every axis) or [x, y, z], all >= 1.
std::vector<Triple> per_level(const nlohmann::json& j, const char* name) {
  if (!j.is_array()) throw ValueError(str("DynUNet: argument ", name, " must be a list (one entry per level), got ", j.dump()));
  std::vector<Triple> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    Triple t{};
    if (e.is_number_integer()) {
      t.fill(e.get<std::int64_t>());
    } else if (e.is_array() && e.size() == 3 && e[0].is_number_integer() && e[1].is_number_integer() &&
               e[2].is_number_integer()) {
      t = {e[0].get<std::int64_t>(), e[1].get<std::int64_t>(), e[2].get<std::int64_t>()};
    } else {
      throw ValueError(str("DynUNet: argument ", name, "[", i, "] must be an integer or [x, y, z], got ", e.dump()));
    }
    for (const std::int64_t v : t) {
      if (v < 1) throw ValueError(str("DynUNet: argument ", name, "[", i, "] ", e.dump(), " must be >= 1"));
    }
    out.push_back(t);
  }
  return out;
}

// MONAI's get_padding: floor((kernel - stride + 1) / 2), which must not be negative.
Triple padding_of(const Triple& kernel, const Triple& stride) {
  Triple p{};
  for (int d = 0; d < 3; ++d) {
    const std::int64_t twice = kernel[d] - stride[d] + 1;
    if (twice < 0) {
      throw ValueError(str("DynUNet: kernel ", triple_text(kernel), " with stride ", triple_text(stride),
                           " needs negative padding (MONAI's get_padding): make the kernel at least stride - 1"));
    }
    p[d] = twice / 2;
  }
  return p;
}

std::vector<std::int64_t> vec(const Triple& t) { return {t[0], t[1], t[2]}; }

// MONAI's get_conv_layer(conv_only=False, act=None, norm=None): a Convolution holding `conv`
// and, with dropout, `adn.D`.
Block conv_layer(const DynUNetOptions& o, std::int64_t in, std::int64_t out, const Triple& kernel,
                 const Triple& stride, bool bias, bool transposed) {
  Block s;
  const Triple pad = padding_of(kernel, stride);
  if (transposed) {
    Triple out_pad{};
    for (int d = 0; d < 3; ++d) {
      out_pad[d] = 2 * pad[d] + stride[d] - kernel[d];
      if (out_pad[d] < 0) {
        throw ValueError(str("DynUNet: upsample kernel ", triple_text(kernel), " with stride ", triple_text(stride),
                             " needs a negative output padding (MONAI's get_output_padding)"));
      }
    }
    s->push_back("conv", ConvTranspose3d(torch::nn::ConvTranspose3dOptions(in, out, vec(kernel))
                                                        .stride(vec(stride))
                                                        .padding(vec(pad))
                                                        .output_padding(vec(out_pad))
                                                        .bias(bias)));
  } else {
    s->push_back("conv", Conv3d(
                             torch::nn::Conv3dOptions(in, out, vec(kernel)).stride(vec(stride)).padding(vec(pad)).bias(bias)));
  }
  if (o.dropout > 0) {
    Block adn;
    adn->push_back("D", torch::nn::Dropout(o.dropout));
    s->push_back("adn", adn);
  }
  return s;
}

torch::nn::AnyModule norm_layer(const DynUNetOptions& o, std::int64_t channels) {
  if (o.norm_name == DynUNetNorm::batch) return torch::nn::AnyModule(torch::nn::BatchNorm3d(channels));
  return torch::nn::AnyModule(InstanceNorm3d(torch::nn::InstanceNorm3dOptions(channels).affine(true)));
}

// UnetBasicBlock (conv1, conv2, lrelu, norm1, norm2) or, with `residual`, UnetResBlock (plus
// conv3 and norm3 where the channels or the size change): MONAI's registration order.
class ConvBlockImpl : public torch::nn::Module {
 public:
  ConvBlockImpl(const DynUNetOptions& o, std::int64_t in, std::int64_t out, const Triple& kernel, const Triple& stride,
                bool residual) {
    conv1_ = register_module("conv1", conv_layer(o, in, out, kernel, stride, false, false));
    conv2_ = register_module("conv2", conv_layer(o, out, out, kernel, {1, 1, 1}, false, false));
    lrelu_ = register_module("lrelu", torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.01)));
    norm1_ = norm_layer(o, out);
    register_module("norm1", norm1_.ptr());
    norm2_ = norm_layer(o, out);
    register_module("norm2", norm2_.ptr());
    const bool strided = stride != Triple{1, 1, 1};
    if (residual && (in != out || strided)) {
      conv3_ = register_module("conv3", conv_layer(o, in, out, {1, 1, 1}, stride, false, false));
      norm3_ = norm_layer(o, out);
      register_module("norm3", norm3_.ptr());
    }
    residual_ = residual;
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor out = lrelu_->forward(norm1_.forward(conv1_->forward(x)));
    out = norm2_.forward(conv2_->forward(out));
    if (!residual_) return lrelu_->forward(out);
    const torch::Tensor res = conv3_ ? norm3_.forward(conv3_->forward(x)) : x;
    return lrelu_->forward(out + res);
  }

 private:
  Block conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::LeakyReLU lrelu_{nullptr};
  torch::nn::AnyModule norm1_, norm2_, norm3_;
  bool residual_ = false;
};
TORCH_MODULE(ConvBlock);

// UnetUpBlock: transp_conv (kernel = stride = upsample kernel), cat with the skip, a basic block.
class UpBlockImpl : public torch::nn::Module {
 public:
  UpBlockImpl(const DynUNetOptions& o, std::int64_t in, std::int64_t out, const Triple& kernel, const Triple& up_kernel) {
    transp_conv_ = register_module("transp_conv", conv_layer(o, in, out, up_kernel, up_kernel, o.trans_bias, true));
    conv_block_ = register_module("conv_block", ConvBlock(o, 2 * out, out, kernel, Triple{1, 1, 1}, false));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& skip) {
    return conv_block_->forward(torch::cat({transp_conv_->forward(x), skip}, 1));
  }

 private:
  Block transp_conv_{nullptr};
  ConvBlock conv_block_{nullptr};
};
TORCH_MODULE(UpBlock);

// UnetOutBlock: a 1x1x1 convolution with bias, `conv.conv`.
Block out_block(const DynUNetOptions& o, std::int64_t in) {
  Block b;
  b->push_back("conv", conv_layer(o, in, o.out_channels, {1, 1, 1}, {1, 1, 1}, true, false));
  return b;
}

// DynUNetSkipLayer: downsample -> next_layer -> upsample(next, down), and at levels 1 .. a
// supervision head's output kept in heads[index - 1] (in training mode: only then are they
// used). The modules are shared with the network's own lists, as in MONAI (hence the second
// set of names under skip_layers).
class SkipLayerImpl : public torch::nn::Module {
 public:
  SkipLayerImpl(std::int64_t index, ConvBlock down, std::shared_ptr<torch::nn::Module> next, UpBlock up, Block head,
                std::shared_ptr<std::vector<torch::Tensor>> heads)
      : index_(index), down_(std::move(down)), up_(std::move(up)), head_(std::move(head)), heads_(std::move(heads)) {
    register_module("downsample", down_);
    next_ = register_module("next_layer", std::move(next));
    register_module("upsample", up_);
    if (head_) register_module("super_head", head_);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor down = down_->forward(x);
    torch::Tensor next;
    if (auto* layer = dynamic_cast<SkipLayerImpl*>(next_.get())) {
      next = layer->forward(down);
    } else {
      next = static_cast<ConvBlockImpl*>(next_.get())->forward(down);  // the bottleneck
    }
    torch::Tensor up = up_->forward(next, down);
    // MONAI computes the heads in eval mode too, where its forward returns without them.
    if (head_ && index_ > 0 && is_training()) (*heads_)[static_cast<std::size_t>(index_ - 1)] = head_->forward(up);
    return up;
  }

 private:
  std::int64_t index_;
  ConvBlock down_;
  std::shared_ptr<torch::nn::Module> next_;
  UpBlock up_;
  Block head_{nullptr};
  std::shared_ptr<std::vector<torch::Tensor>> heads_;
};
TORCH_MODULE(SkipLayer);

}  // namespace

std::vector<Triple> DynUNetOptions::kernels() const { return per_level(kernel_size, "kernel_size"); }
std::vector<Triple> DynUNetOptions::stride_list() const { return per_level(strides, "strides"); }
std::vector<Triple> DynUNetOptions::upsample_kernels() const {
  return per_level(upsample_kernel_size, "upsample_kernel_size");
}

std::vector<std::int64_t> DynUNetOptions::level_filters() const {
  const std::size_t levels = strides.is_array() ? strides.size() : 0;
  if (!filters.empty()) return std::vector<std::int64_t>(filters.begin(), filters.begin() + std::min(levels, filters.size()));
  std::vector<std::int64_t> f;
  for (std::size_t i = 0; i < levels; ++i) f.push_back(std::min<std::int64_t>(std::int64_t{32} << i, 320));
  return f;
}

void DynUNetOptions::validate() const {
  if (spatial_dims != 3) throw ValueError(str("DynUNet: spatial_dims ", spatial_dims, " is not supported (3)"));
  if (in_channels < 1 || out_channels < 1) throw ValueError("DynUNet: in_channels and out_channels must be >= 1");
  const auto k = kernels(), s = stride_list(), u = upsample_kernels();
  if (k.size() != s.size() || k.size() < 3) {
    throw ValueError(str("DynUNet: kernel_size has ", k.size(), " levels and strides ", s.size(),
                         "; they must have the same length, at least 3"));
  }
  if (u.size() != s.size() - 1) {
    throw ValueError(str("DynUNet: upsample_kernel_size has ", u.size(), " entries; with ", s.size(),
                         " levels it needs ", s.size() - 1, " (strides[1:])"));
  }
  if (!filters.empty() && filters.size() < s.size()) {
    throw ValueError(str("DynUNet: filters has ", filters.size(), " entries; it needs at least one per level (",
                         s.size(), ")"));
  }
  for (const std::int64_t f : filters) {
    if (f < 1) throw ValueError(str("DynUNet: filters entry ", f, " must be >= 1"));
  }
  for (std::size_t i = 0; i < k.size(); ++i) padding_of(k[i], s[i]);
  for (std::size_t i = 0; i < u.size(); ++i) padding_of(u[i], u[i]);
  if (!(dropout >= 0 && dropout < 1)) throw ValueError(str("DynUNet: argument dropout ", dropout, " is outside [0, 1)"));
  if (deep_supervision && (deep_supr_num < 1 || deep_supr_num >= static_cast<std::int64_t>(s.size()) - 1)) {
    throw ValueError(str("DynUNet: argument deep_supr_num ", deep_supr_num, " must be 1 .. ", s.size() - 2,
                         " (fewer than the ", s.size() - 1, " upsampling levels)"));
  }
}

DynUNetImpl::DynUNetImpl(DynUNetOptions options) : options_(std::move(options)) {
  options_.validate();
  const auto& o = options_;
  const auto k = o.kernels(), s = o.stride_list(), u = o.upsample_kernels();
  const auto f = o.level_filters();
  const std::size_t n = s.size();
  auto input_block = register_module("input_block", ConvBlock(o, o.in_channels, f[0], k[0], s[0], o.res_block));
  auto downsamples = register_module("downsamples", torch::nn::ModuleList());
  std::vector<ConvBlock> downs{input_block};
  for (std::size_t i = 1; i + 1 < n; ++i) {
    ConvBlock b(o, f[i - 1], f[i], k[i], s[i], o.res_block);
    downsamples->push_back(b);
    downs.push_back(b);
  }
  auto bottleneck = register_module("bottleneck", ConvBlock(o, f[n - 2], f[n - 1], k[n - 1], s[n - 1], o.res_block));
  // upsamples, bottom up: level i (n-1 .. 1) from f[i] to f[i-1] channels.
  auto upsamples = register_module("upsamples", torch::nn::ModuleList());
  std::vector<UpBlock> ups(n - 1, UpBlock(nullptr));  // ups[i - 1]: the one joining level i - 1
  for (std::size_t i = n - 1; i >= 1; --i) {
    UpBlock b(o, f[i], f[i - 1], k[i], u[i - 1]);
    upsamples->push_back(b);
    ups[i - 1] = b;
  }
  output_block_ = register_module("output_block", out_block(o, f[0]));
  std::vector<Block> heads;
  if (o.deep_supervision) {
    auto list = register_module("deep_supervision_heads", torch::nn::ModuleList());
    for (std::int64_t h = 0; h < o.deep_supr_num; ++h) {
      heads.push_back(out_block(o, f[static_cast<std::size_t>(h) + 1]));
      list->push_back(heads.back());
    }
  }
  heads_ = std::make_shared<std::vector<torch::Tensor>>(static_cast<std::size_t>(o.deep_supervision ? o.deep_supr_num : 0));
  // The skip layers, built from the bottom: level i joins downs[i] and ups[i]; level i > 0
  // carries head i - 1 when there is one.
  std::shared_ptr<torch::nn::Module> next = bottleneck;
  for (std::size_t i = n - 1; i-- > 0;) {
    Block head{nullptr};
    if (i > 0 && i - 1 < heads.size()) head = heads[i - 1];
    next = SkipLayer(static_cast<std::int64_t>(i), downs[i], next, ups[i], head, heads_).ptr();
  }
  skip_layers_ = register_module("skip_layers", next);

  // MONAI's initialize_weights: Kaiming normal (a = 0.01) convolution weights, zero biases.
  torch::NoGradGuard no_grad;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* c = m->as<torch::nn::Conv3dImpl>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.01);
      if (c->bias.defined()) torch::nn::init::zeros_(c->bias);
    } else if (auto* t = m->as<torch::nn::ConvTranspose3dImpl>()) {
      torch::nn::init::kaiming_normal_(t->weight, 0.01);
      if (t->bias.defined()) torch::nn::init::zeros_(t->bias);
    }
  }
}

torch::Tensor DynUNetImpl::forward(torch::Tensor x) {
  const auto s = options_.stride_list();
  if (x.dim() != 5 || x.size(1) != options_.in_channels) {
    throw ValueError(str("DynUNet: expected input (N, ", options_.in_channels, ", X, Y, Z), got ", x.sizes()));
  }
  for (int d = 0; d < 3; ++d) {
    std::int64_t divisor = 1;
    for (const auto& t : s) divisor *= t[d];
    if (x.size(2 + d) % divisor != 0) {
      throw ValueError(str("DynUNet: spatial size ", x.sizes().slice(2), " must be divisible by the product of the "
                           "strides along each axis, ", divisor, " along axis ", d));
    }
  }
  torch::Tensor out = output_block_->forward(static_cast<SkipLayerImpl*>(skip_layers_.get())->forward(x));
  if (!is_training() || !options_.deep_supervision) return out;
  std::vector<torch::Tensor> all{out};
  for (const auto& h : *heads_) {
    all.push_back(torch::nn::functional::interpolate(
        h, torch::nn::functional::InterpolateFuncOptions().size(out.sizes().slice(2).vec()).mode(torch::kNearest)));
  }
  return torch::stack(all, 1);
}

std::vector<double> deep_supervision_weights(std::int64_t outputs, bool drop_lowest) {
  if (outputs < 1) throw ValueError(str("deep supervision: ", outputs, " outputs"));
  std::vector<double> w;
  for (std::int64_t i = 0; i < outputs; ++i) w.push_back(1.0 / static_cast<double>(std::int64_t{1} << i));
  if (drop_lowest && outputs > 1) w.back() = 0;
  double sum = 0;
  for (const double v : w) sum += v;
  for (double& v : w) v /= sum;
  return w;
}

// The entry of network.cpp's table.
NetworkSpec dynunet_network(ConfigReader& arguments, const std::string& where) {
  NetworkSpec spec = detail::network_spec<DynUNetOptions, DynUNet>(arguments, "DynUNet", where);
  if (spec.arguments.value("deep_supervision", false)) {
    const auto heads = spec.arguments.value("deep_supr_num", std::int64_t{1});
    const auto levels = static_cast<std::int64_t>(spec.arguments["strides"].size());
    spec.deep_supervision_weights = deep_supervision_weights(1 + heads, heads == levels - 2);
  }
  return spec;
}

}  // namespace medfast::nn
