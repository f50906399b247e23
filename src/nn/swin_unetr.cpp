#include "medfast/nn/swin_unetr.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/norm.hpp"
#include "medfast/nn/network.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <utility>

#include "medfast/core/error.hpp"

namespace medfast::nn {

using Arr3 = std::array<std::int64_t, 3>;
using torch::indexing::None;
using torch::indexing::Slice;

void SwinUNETROptions::validate() const {
  if (spatial_dims != 3)
    throw ValueError(str("SwinUNETR: argument spatial_dims ", spatial_dims, " is not supported (3)"));
  if (img_size.size() != 3)
    throw ValueError(str("SwinUNETR: argument img_size needs 3 entries, got ", img_size.size()));
  for (auto s : img_size) {
    if (s < 1 || s % 32 != 0) {
      throw ValueError(str("SwinUNETR: argument img_size entry ", s, " is not a positive multiple of 32 (2^5)"));
    }
  }
  if (in_channels < 1) throw ValueError(str("SwinUNETR: argument in_channels ", in_channels, " must be >= 1"));
  if (out_channels < 1) throw ValueError(str("SwinUNETR: argument out_channels ", out_channels, " must be >= 1"));
  if (feature_size < 12 || feature_size % 12 != 0) {
    throw ValueError(str("SwinUNETR: argument feature_size ", feature_size, " is not a positive multiple of 12"));
  }
  // MONAI's forward wires exactly four stages (layers1..layers4).
  if (depths.size() != 4) throw ValueError(str("SwinUNETR: argument depths needs 4 stages, got ", depths.size()));
  if (num_heads.size() != 4)
    throw ValueError(str("SwinUNETR: argument num_heads needs 4 stages, got ", num_heads.size()));
  for (std::size_t i = 0; i < 4; ++i) {
    if (depths[i] < 0) throw ValueError(str("SwinUNETR: argument depths entry ", depths[i], " is negative"));
    const std::int64_t dim = feature_size << i;
    if (num_heads[i] < 1 || dim % num_heads[i] != 0) {
      throw ValueError(str("SwinUNETR: argument num_heads entry ", num_heads[i], " does not divide stage ", i + 1,
                           "'s ", dim, " channels"));
    }
  }
  const std::pair<const char*, double> rates[] = {
      {"drop_rate", drop_rate}, {"attn_drop_rate", attn_drop_rate}, {"dropout_path_rate", dropout_path_rate}};
  for (const auto& [name, r] : rates) {
    if (!(r >= 0 && r <= 1)) throw ValueError(str("SwinUNETR: argument ", name, " ", r, " is outside [0, 1]"));
  }
}

// ---------------------------------------------------------------------------------------------
// Attention and window helpers

namespace detail {

torch::Tensor window_attention_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& bias, double dropout_p, bool training) {
  const std::int64_t b = q.size(0), heads = q.size(1), n = q.size(2), nw = bias.size(0);
  MEDFAST_CHECK(b % nw == 0, "window attention: ", b, " windows are not a multiple of the mask's ", nw);
  const double scale = std::pow(static_cast<double>(q.size(3)), -0.5);
  torch::Tensor attn = torch::matmul(q * scale, k.transpose(-2, -1));
  attn = (attn.view({b / nw, nw, heads, n, n}) + bias.unsqueeze(0)).view({b, heads, n, n});
  attn = torch::softmax(attn, -1);
  if (training && dropout_p > 0) attn = torch::dropout(attn, dropout_p, true);
  return torch::matmul(attn, v);
}

torch::Tensor window_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& bias, double dropout_p, bool training) {
#if TORCH_VERSION_MAJOR >= 2
  const std::int64_t b = q.size(0), heads = q.size(1), n = q.size(2), nw = bias.size(0);
  MEDFAST_CHECK(b % nw == 0, "window attention: ", b, " windows are not a multiple of the mask's ", nw);
  torch::Tensor mask = bias.to(q.scalar_type());
  if (nw > 1) mask = mask.unsqueeze(0).expand({b / nw, nw, heads, n, n}).reshape({b, heads, n, n});
  // The default scale is head_dim^-0.5, as MONAI's.
  return at::scaled_dot_product_attention(q, k, v, mask, training ? dropout_p : 0.0, false);
#else
  return window_attention_plain(q, k, v, bias, dropout_p, training);
#endif
}

bool has_fused_attention() {
#if TORCH_VERSION_MAJOR >= 2
  return true;
#else
  return false;
#endif
}

torch::Tensor window_partition(const torch::Tensor& x, const Arr3& w) {
  const std::int64_t b = x.size(0), d = x.size(1), h = x.size(2), wd = x.size(3), c = x.size(4);
  return x.reshape({b, d / w[0], w[0], h / w[1], w[1], wd / w[2], w[2], c})
      .permute({0, 1, 3, 5, 2, 4, 6, 7})
      .reshape({-1, w[0] * w[1] * w[2], c});
}

torch::Tensor shifted_window_mask(const Arr3& dims, const Arr3& window, const Arr3& shift,
                                  const torch::Device& device) {
  // MONAI labels regions with the Python slices [:-w], [-w:-s], [-s:] per dimension. Where s is
  // 0, [-w:-0] is empty and [-0:] is the whole axis, so that axis does not split regions.
  auto ranges = [](std::int64_t len, std::int64_t w, std::int64_t s) {
    const std::int64_t lw = std::max<std::int64_t>(0, len - w);
    return std::array<std::pair<std::int64_t, std::int64_t>, 3>{
        {{0, lw}, {lw, s == 0 ? 0 : len - s}, {s == 0 ? 0 : len - s, len}}};
  };
  torch::Tensor img = torch::zeros({1, dims[0], dims[1], dims[2], 1}, torch::TensorOptions().device(device));
  const auto rd = ranges(dims[0], window[0], shift[0]), rh = ranges(dims[1], window[1], shift[1]),
             rw = ranges(dims[2], window[2], shift[2]);
  double cnt = 0;
  for (const auto& d : rd) {
    for (const auto& h : rh) {
      for (const auto& w : rw) {
        if (d.first < d.second && h.first < h.second && w.first < w.second) {
          img.index_put_({Slice(), Slice(d.first, d.second), Slice(h.first, h.second), Slice(w.first, w.second)}, cnt);
        }
        cnt += 1;
      }
    }
  }
  const torch::Tensor windows = window_partition(img, window).squeeze(-1);  // (nW, n)
  const torch::Tensor diff = windows.unsqueeze(1) - windows.unsqueeze(2);
  return torch::zeros_like(diff).masked_fill(diff != 0, -100.0);
}

}  // namespace detail

namespace {

torch::Tensor window_reverse(const torch::Tensor& windows, const Arr3& w, std::int64_t b, const Arr3& dims) {
  return windows.reshape({b, dims[0] / w[0], dims[1] / w[1], dims[2] / w[2], w[0], w[1], w[2], -1})
      .permute({0, 1, 4, 2, 5, 3, 6, 7})
      .reshape({b, dims[0], dims[1], dims[2], -1});
}

// MONAI's get_window_size: where the input is no larger than the window, the window shrinks to
// the input and that dimension is not shifted.
std::pair<Arr3, Arr3> effective_window(const Arr3& size, const Arr3& window, const Arr3& shift) {
  Arr3 w = window, s = shift;
  for (int i = 0; i < 3; ++i) {
    if (size[i] <= window[i]) {
      w[i] = size[i];
      s[i] = 0;
    }
  }
  return {w, s};
}

bool any_positive(const Arr3& a) {
  return a[0] > 0 || a[1] > 0 || a[2] > 0;
}

// Stochastic depth, per sample, scaled by the keep probability (MONAI's DropPath).
torch::Tensor drop_path(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  const double keep = 1.0 - p;
  std::vector<std::int64_t> shape(x.dim(), 1);
  shape[0] = x.size(0);
  torch::Tensor r = torch::empty(shape, x.options()).bernoulli_(keep);
  if (keep > 0) r.div_(keep);
  return x * r;
}

// dynunet_block.get_conv_layer with conv_only=True: a Sequential holding "conv", no bias.
Block dynunet_conv_layer(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, bool bias = false) {
  Block s;
  // MONAI's get_padding: int((kernel - stride + 1) / 2).
  const std::int64_t pad = (kernel - stride + 1) / 2;
  s->push_back("conv",
               Conv3d(torch::nn::Conv3dOptions(in, out, kernel).stride(stride).padding(pad).bias(bias)));
  return s;
}

torch::nn::AnyModule make_norm(SwinNorm name, std::int64_t channels) {
  if (name == SwinNorm::batch) return torch::nn::AnyModule(torch::nn::BatchNorm3d(channels));
  return torch::nn::AnyModule(InstanceNorm3d(channels));  // affine=False, as MONAI
}

// MONAI's UnetResBlock: conv-norm-lrelu-conv-norm, plus the input (through a 1x1x1 conv and
// norm when channels or stride change), then lrelu.
class UnetResBlockImpl : public torch::nn::Module {
 public:
  UnetResBlockImpl(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, SwinNorm norm)
      : lrelu_(torch::nn::LeakyReLUOptions().negative_slope(0.01)) {
    conv1_ = register_module("conv1", dynunet_conv_layer(in, out, kernel, stride));
    conv2_ = register_module("conv2", dynunet_conv_layer(out, out, kernel, 1));
    register_module("lrelu", lrelu_);
    norm1_ = make_norm(norm, out);
    norm2_ = make_norm(norm, out);
    register_module("norm1", norm1_.ptr());
    register_module("norm2", norm2_.ptr());
    if (in != out || stride != 1) {
      conv3_ = register_module("conv3", dynunet_conv_layer(in, out, 1, stride));
      norm3_ = make_norm(norm, out);
      register_module("norm3", norm3_.ptr());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = lrelu_->forward(norm1_.forward(conv1_->forward(x)));
    y = norm2_.forward(conv2_->forward(y));
    const torch::Tensor res = conv3_ ? norm3_.forward(conv3_->forward(x)) : x;
    return lrelu_->forward(y + res);
  }

 private:
  Block conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::LeakyReLU lrelu_;
  torch::nn::AnyModule norm1_, norm2_, norm3_;
};
TORCH_MODULE(UnetResBlock);

// UnetrBasicBlock(res_block=True): a UnetResBlock named "layer".
class UnetrBasicBlockImpl : public torch::nn::Module {
 public:
  UnetrBasicBlockImpl(std::int64_t in, std::int64_t out, SwinNorm norm)
      : layer_(register_module("layer", UnetResBlock(in, out, 3, 1, norm))) {}
  torch::Tensor forward(torch::Tensor x) { return layer_->forward(x); }

 private:
  UnetResBlock layer_;
};
TORCH_MODULE(UnetrBasicBlock);

// UnetrUpBlock(res_block=True): 2x2x2 transposed conv (no bias), concatenate the skip, UnetResBlock.
class UnetrUpBlockImpl : public torch::nn::Module {
 public:
  UnetrUpBlockImpl(std::int64_t in, std::int64_t out, SwinNorm norm) {
    transp_conv_ = Block();
    transp_conv_->push_back(
        "conv", ConvTranspose3d(torch::nn::ConvTranspose3dOptions(in, out, 2).stride(2).bias(false)));
    register_module("transp_conv", transp_conv_);
    conv_block_ = register_module("conv_block", UnetResBlock(2 * out, out, 3, 1, norm));
  }
  torch::Tensor forward(torch::Tensor x, torch::Tensor skip) {
    return conv_block_->forward(torch::cat({transp_conv_->forward(x), skip}, 1));
  }

 private:
  Block transp_conv_{nullptr};
  UnetResBlock conv_block_{nullptr};
};
TORCH_MODULE(UnetrUpBlock);

// UnetOutBlock: a 1x1x1 conv with bias.
class UnetOutBlockImpl : public torch::nn::Module {
 public:
  UnetOutBlockImpl(std::int64_t in, std::int64_t out)
      : conv_(register_module("conv", dynunet_conv_layer(in, out, 1, 1, true))) {}
  torch::Tensor forward(torch::Tensor x) { return conv_->forward(x); }

 private:
  Block conv_;
};
TORCH_MODULE(UnetOutBlock);

// MONAI's MLPBlock in "swin" dropout mode: linear1 -> GELU -> dropout -> linear2 -> dropout.
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(std::int64_t dim, std::int64_t hidden, double drop)
      : linear1_(register_module("linear1", torch::nn::Linear(dim, hidden))),
        linear2_(register_module("linear2", torch::nn::Linear(hidden, dim))),
        drop_(drop) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::dropout(torch::gelu(linear1_->forward(x)), drop_, is_training());
    return torch::dropout(linear2_->forward(x), drop_, is_training());
  }

 private:
  torch::nn::Linear linear1_, linear2_;
  double drop_;
};
TORCH_MODULE(Mlp);

class WindowAttentionImpl : public torch::nn::Module {
 public:
  WindowAttentionImpl(std::int64_t dim, std::int64_t heads, const Arr3& w, bool qkv_bias, double attn_drop,
                      double proj_drop)
      : heads_(heads), attn_drop_(attn_drop), proj_drop_(proj_drop) {
    const std::int64_t td = 2 * w[0] - 1, th = 2 * w[1] - 1, tw = 2 * w[2] - 1;
    table_ = register_parameter("relative_position_bias_table", torch::zeros({td * th * tw, heads}));
    {
      // MONAI's trunc_normal_(std=0.02) truncates at +-2 (absolute), i.e. 100 standard deviations.
      torch::NoGradGuard no_grad;
      table_.normal_(0.0, 0.02).clamp_(-2.0, 2.0);
    }
    // Index of the bias of voxel j seen from voxel i of a window (both flattened d-major).
    const std::int64_t n = w[0] * w[1] * w[2];
    torch::Tensor index = torch::empty({n, n}, torch::kLong);
    auto acc = index.accessor<std::int64_t, 2>();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t di = i / (w[1] * w[2]), hi = (i / w[2]) % w[1], wi = i % w[2];
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t dj = j / (w[1] * w[2]), hj = (j / w[2]) % w[1], wj = j % w[2];
        acc[i][j] = (di - dj + w[0] - 1) * th * tw + (hi - hj + w[1] - 1) * tw + (wi - wj + w[2] - 1);
      }
    }
    index_ = register_buffer("relative_position_index", index);
    qkv_ = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim).bias(qkv_bias)));
    proj_ = register_module("proj", torch::nn::Linear(dim, dim));
  }

  /// x: (B*nW, n, C); mask: (nW, n, n) or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const std::int64_t b = x.size(0), n = x.size(1), c = x.size(2);
    const torch::Tensor qkv = qkv_->forward(x).reshape({b, n, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4});
    // A shrunk window of n voxels reads the first n x n entries of the full window's index (MONAI).
    const torch::Tensor idx = index_.index({Slice(0, n), Slice(0, n)}).reshape({-1});
    torch::Tensor bias = table_.index_select(0, idx).reshape({n, n, heads_}).permute({2, 0, 1}).unsqueeze(0);
    if (mask.defined()) bias = bias + mask.unsqueeze(1);
    torch::Tensor y = detail::window_attention(qkv[0], qkv[1], qkv[2], bias, attn_drop_, is_training());
    y = proj_->forward(y.transpose(1, 2).reshape({b, n, c}));
    return torch::dropout(y, proj_drop_, is_training());
  }

 private:
  std::int64_t heads_;
  double attn_drop_, proj_drop_;
  torch::Tensor table_, index_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(WindowAttention);

struct StageConfig {
  std::int64_t dim, heads;
  Arr3 window;
  double mlp_ratio, drop, attn_drop;
  bool qkv_bias;
};

class SwinTransformerBlockImpl : public torch::nn::Module {
 public:
  SwinTransformerBlockImpl(const StageConfig& s, const Arr3& shift, double drop_path)
      : window_(s.window), shift_(shift), drop_path_(drop_path) {
    norm1_ = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.dim})));
    attn_ = register_module("attn", WindowAttention(s.dim, s.heads, s.window, s.qkv_bias, s.attn_drop, s.drop));
    norm2_ = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.dim})));
    mlp_ = register_module("mlp", Mlp(s.dim, static_cast<std::int64_t>(s.dim * s.mlp_ratio), s.drop));
  }

  /// x: (B, D, H, W, C); mask: the stage's shifted-window mask, or undefined when it has none.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const std::int64_t b = x.size(0);
    const Arr3 size{x.size(1), x.size(2), x.size(3)};
    const auto [w, s] = effective_window(size, window_, shift_);
    torch::Tensor y = norm1_->forward(x);
    Arr3 padded;
    for (int i = 0; i < 3; ++i) padded[i] = size[i] + (w[i] - size[i] % w[i]) % w[i];
    const bool pad = padded != size;
    if (pad)
      y = torch::constant_pad_nd(y, {0, 0, 0, padded[2] - size[2], 0, padded[1] - size[1], 0, padded[0] - size[0]});
    const bool shifted = any_positive(s);
    if (shifted) y = torch::roll(y, {-s[0], -s[1], -s[2]}, {1, 2, 3});
    y = attn_->forward(detail::window_partition(y, w), shifted ? mask : torch::Tensor());
    y = window_reverse(y, w, b, padded);
    if (shifted) y = torch::roll(y, {s[0], s[1], s[2]}, {1, 2, 3});
    if (pad) y = y.index({Slice(), Slice(0, size[0]), Slice(0, size[1]), Slice(0, size[2])}).contiguous();
    torch::Tensor out = x + drop_path(y, drop_path_, is_training());
    return out + drop_path(mlp_->forward(norm2_->forward(out)), drop_path_, is_training());
  }

 private:
  Arr3 window_, shift_;
  double drop_path_;
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  WindowAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(SwinTransformerBlock);

// Patch merging: the 8 voxels of each 2x2x2 cell concatenated (C -> 8C), LayerNorm, linear to 2C.
class PatchMergingImpl : public torch::nn::Module {
 public:
  PatchMergingImpl(std::int64_t dim, bool v2) : v2_(v2) {
    reduction_ =
        register_module("reduction", torch::nn::Linear(torch::nn::LinearOptions(8 * dim, 2 * dim).bias(false)));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8 * dim})));
  }
  torch::Tensor forward(torch::Tensor x) {  // (B, D, H, W, C)
    const std::int64_t d = x.size(1), h = x.size(2), w = x.size(3);
    if (d % 2 || h % 2 || w % 2) x = torch::constant_pad_nd(x, {0, 0, 0, w % 2, 0, h % 2, 0, d % 2});
    // "merging" is MONAI's v0.9 PatchMerging, whose list repeats two offsets and skips two
    // ((1,1,0), (0,1,1)); kept as is so that MONAI weights give MONAI's results.
    static const int kV1[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1},
                                  {1, 0, 1}, {0, 1, 0}, {0, 0, 1}, {1, 1, 1}};
    static const int kV2[8][3] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                                  {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
    const auto& offsets = v2_ ? kV2 : kV1;
    std::vector<torch::Tensor> parts;
    for (const auto& o : offsets) {
      parts.push_back(x.index({Slice(), Slice(o[0], None, 2), Slice(o[1], None, 2), Slice(o[2], None, 2)}));
    }
    return reduction_->forward(norm_->forward(torch::cat(parts, -1)));
  }

 private:
  bool v2_;
  torch::nn::Linear reduction_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
};
TORCH_MODULE(PatchMerging);

// One stage: `depth` blocks, alternately unshifted and shifted by half a window, then merging.
class BasicLayerImpl : public torch::nn::Module {
 public:
  BasicLayerImpl(const StageConfig& s, std::int64_t depth, const std::vector<double>& drop_paths, bool merging_v2)
      : window_(s.window), shift_{s.window[0] / 2, s.window[1] / 2, s.window[2] / 2} {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < depth; ++i) {
      blocks_.push_back(SwinTransformerBlock(s, i % 2 == 0 ? Arr3{0, 0, 0} : shift_, drop_paths[i]));
      list->push_back(blocks_.back());
    }
    downsample_ = register_module("downsample", PatchMerging(s.dim, merging_v2));
  }
  torch::Tensor forward(torch::Tensor x) {  // (B, C, D, H, W)
    const Arr3 size{x.size(2), x.size(3), x.size(4)};
    const auto [w, s] = effective_window(size, window_, shift_);
    x = x.permute({0, 2, 3, 4, 1});
    torch::Tensor mask;
    if (any_positive(s)) {
      Arr3 padded;
      for (int i = 0; i < 3; ++i) padded[i] = (size[i] + w[i] - 1) / w[i] * w[i];
      mask = detail::shifted_window_mask(padded, w, s, x.device()).to(x.scalar_type());
    }
    for (auto& blk : blocks_) x = blk->forward(x, mask);
    return downsample_->forward(x).permute({0, 4, 1, 2, 3});
  }

 private:
  Arr3 window_, shift_;
  std::vector<SwinTransformerBlock> blocks_;
  PatchMerging downsample_{nullptr};
};
TORCH_MODULE(BasicLayer);

// MONAI's PatchEmbed: a 2x2x2 stride-2 conv, after zero padding to a multiple of the patch.
class PatchEmbedImpl : public torch::nn::Module {
 public:
  PatchEmbedImpl(std::int64_t in, std::int64_t dim, std::int64_t patch) : patch_(patch) {
    proj_ = register_module("proj", Conv3d(torch::nn::Conv3dOptions(in, dim, patch).stride(patch)));
  }
  torch::Tensor forward(torch::Tensor x) {
    const std::int64_t p = patch_, d = x.size(2), h = x.size(3), w = x.size(4);
    if (d % p || h % p || w % p) {
      x = torch::constant_pad_nd(x, {0, (p - w % p) % p, 0, (p - h % p) % p, 0, (p - d % p) % p});
    }
    return proj_->forward(x);
  }

 private:
  std::int64_t patch_;
  Conv3d proj_{nullptr};
};
TORCH_MODULE(PatchEmbed);

// Layer norm over channels without affine parameters (MONAI's proj_out).
torch::Tensor channel_layer_norm(const torch::Tensor& x) {
  return torch::layer_norm(x.permute({0, 2, 3, 4, 1}), {x.size(1)}).permute({0, 4, 1, 2, 3});
}

}  // namespace

// MONAI's SwinTransformer (the `swinViT` encoder), with layers1..4 (and layers1c..4c for v2).
class SwinTransformerImpl : public torch::nn::Module {
 public:
  explicit SwinTransformerImpl(const SwinUNETROptions& o) : drop_(o.drop_rate) {
    const std::int64_t window = SwinUNETROptions::kWindowSize;
    patch_embed_ =
        register_module("patch_embed", PatchEmbed(o.in_channels, o.feature_size, SwinUNETROptions::kPatchSize));
    std::int64_t total = 0;
    for (auto d : o.depths) total += d;
    const torch::Tensor dpr = torch::linspace(0.0, o.dropout_path_rate, total);  // float32, as MONAI
    std::vector<torch::nn::ModuleList> lists, clists;
    for (int i = 1; i <= 4; ++i) lists.push_back(register_module(str("layers", i), torch::nn::ModuleList()));
    if (o.use_v2) {
      for (int i = 1; i <= 4; ++i) clists.push_back(register_module(str("layers", i, "c"), torch::nn::ModuleList()));
    }
    std::int64_t first = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      StageConfig s{
          o.feature_size << i, o.num_heads[i], {window, window, window}, 4.0, o.drop_rate, o.attn_drop_rate, true};
      std::vector<double> rates;
      for (std::int64_t j = 0; j < o.depths[i]; ++j) rates.push_back(dpr[first + j].item<double>());
      first += o.depths[i];
      layers_.push_back(BasicLayer(s, o.depths[i], rates, o.downsample == SwinDownsample::mergingv2));
      lists[i]->push_back(layers_.back());
      if (o.use_v2) {
        // v2's residual conv block always uses instance norm (MONAI hard-codes it).
        convs_.push_back(UnetrBasicBlock(s.dim, s.dim, SwinNorm::instance));
        clists[i]->push_back(convs_.back());
      }
    }
  }

  /// The five feature maps: patch embedding and the four stage outputs, (B, C_i, ...).
  std::vector<torch::Tensor> forward(const torch::Tensor& x, bool normalize) {
    auto out = [normalize](const torch::Tensor& t) { return normalize ? channel_layer_norm(t) : t; };
    torch::Tensor h = torch::dropout(patch_embed_->forward(x), drop_, is_training());
    std::vector<torch::Tensor> hidden{out(h)};
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      // MONAI's .contiguous(): dense memory, here in the layout the network runs in.
      if (!convs_.empty()) h = convs_[i]->forward(h.contiguous(h.suggest_memory_format()));
      h = layers_[i]->forward(h.contiguous(h.suggest_memory_format()));
      hidden.push_back(out(h));
    }
    return hidden;
  }

 private:
  double drop_;
  PatchEmbed patch_embed_{nullptr};
  std::vector<BasicLayer> layers_;
  std::vector<UnetrBasicBlock> convs_;
};

SwinUNETRImpl::SwinUNETRImpl(SwinUNETROptions options) : options_(std::move(options)) {
  options_.validate();
  const auto& o = options_;
  const std::int64_t f = o.feature_size;
  swin_ = register_module("swinViT", std::make_shared<SwinTransformerImpl>(o));
  auto add = [this](std::vector<torch::nn::AnyModule>& to, const char* name, auto module) {
    to.emplace_back(module);
    register_module(name, to.back().ptr());
  };
  add(encoders_, "encoder1", UnetrBasicBlock(o.in_channels, f, o.norm_name));
  add(encoders_, "encoder2", UnetrBasicBlock(f, f, o.norm_name));
  add(encoders_, "encoder3", UnetrBasicBlock(2 * f, 2 * f, o.norm_name));
  add(encoders_, "encoder4", UnetrBasicBlock(4 * f, 4 * f, o.norm_name));
  add(encoders_, "encoder10", UnetrBasicBlock(16 * f, 16 * f, o.norm_name));
  add(decoders_, "decoder5", UnetrUpBlock(16 * f, 8 * f, o.norm_name));
  add(decoders_, "decoder4", UnetrUpBlock(8 * f, 4 * f, o.norm_name));
  add(decoders_, "decoder3", UnetrUpBlock(4 * f, 2 * f, o.norm_name));
  add(decoders_, "decoder2", UnetrUpBlock(2 * f, f, o.norm_name));
  add(decoders_, "decoder1", UnetrUpBlock(f, f, o.norm_name));
  out_ = torch::nn::AnyModule(UnetOutBlock(f, o.out_channels));
  register_module("out", out_.ptr());
}

torch::Tensor SwinUNETRImpl::forward(torch::Tensor x) {
  if (x.dim() != 5 || x.size(1) != options_.in_channels || x.size(2) % 32 || x.size(3) % 32 || x.size(4) % 32) {
    throw ValueError(str("SwinUNETR: input of shape ", x.sizes(), " is not (N, ", options_.in_channels,
                         ", D, H, W) with D, H, W divisible by 32 (2^5)"));
  }
  const std::vector<torch::Tensor> hidden = swin_->forward(x, options_.normalize);
  const torch::Tensor enc0 = encoders_[0].forward(x);
  const torch::Tensor enc1 = encoders_[1].forward(hidden[0]);
  const torch::Tensor enc2 = encoders_[2].forward(hidden[1]);
  const torch::Tensor enc3 = encoders_[3].forward(hidden[2]);
  const torch::Tensor dec4 = encoders_[4].forward(hidden[4]);
  torch::Tensor y = decoders_[0].forward(dec4, hidden[3]);
  y = decoders_[1].forward(y, enc3);
  y = decoders_[2].forward(y, enc2);
  y = decoders_[3].forward(y, enc1);
  y = decoders_[4].forward(y, enc0);
  return out_.forward(y);
}

// The entry of network.cpp's table.
NetworkSpec swin_unetr_network(ConfigReader& arguments, const std::string& where) {
  return detail::network_spec<SwinUNETROptions, SwinUNETR>(arguments, "SwinUNETR", where);
}

}  // namespace medfast::nn
