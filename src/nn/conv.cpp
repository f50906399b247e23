#include "medfast/nn/conv.hpp"

#include <ATen/Context.h>
#include <ATen/ops/mkldnn_convolution.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/accumulate.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <variant>
#include <vector>

#include "medfast/nn/direct_conv.hpp"
#include "medfast/nn/layout.hpp"

// ConvTranspose3d's custom backward (ConvTranspose3dByConv): libtorch 1.x only. The one
// definition behind transposed_conv_custom_backward() and the code that is compiled for it.
#define MEDFAST_TRANSPOSED_CONV_CUSTOM_BACKWARD (TORCH_VERSION_MAJOR < 2)

namespace medfast::nn {

namespace {

// CPU autocast on (its dispatch key not excluded: libtorch 1.13's and 2.x's is_cpu_enabled()).
bool cpu_autocast() {
  return !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutocastCPU);
}

// The direct kernel (direct_conv.hpp) where it is measured faster than libtorch's: float32 on
// the CPU outside autocast, where it is enabled (on a CPU with AVX2 or AVX-512), stride 1, at most
// kDirectMaxOutChannels output channels; groups, dilation and padding mode are the caller's.
bool direct_applies(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride) {
  if (!direct_conv_enabled()) return false;
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat) return false;
  if (x.dim() != 5 || w.size(0) > kDirectMaxOutChannels || cpu_autocast()) return false;
  // Channels-last stays libtorch's: it keeps that layout for the layers after (the kernel's
  // output is contiguous).
  if (x.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d) return false;
  for (const std::int64_t s : stride) {
    if (s != 1) return false;
  }
  return true;
}

std::atomic<bool> onednn_forward_on{true};

// oneDNN's forward kernel for a float32 CPU convolution whose kernel is more than one voxel, where
// oneDNN is built and enabled (the self-check switches a faulty one off) and the input and
// weight are not channels-last (a channels-last network stays libtorch's choice). libtorch 1.13's and 2.x's own choice
// (ConvParams::use_mkldnn) takes its im2col kernel for one sample when N*C*D*H <= 20480, a size
// rule written for 2-D images that leaves out a volume's last axis: every layer of a 48x48x32
// crop at batch 1 with up to 8 channels, where oneDNN is 5-10x faster (docs/benchmarks.md,
// "oneDNN for one small volume"). A 1x1x1 kernel stays libtorch's (a matrix product there,
// faster than oneDNN's).
bool onednn_forward_applies(const at::Tensor& x, const at::Tensor& w) {
  if (!onednn_conv_forward_enabled()) return false;
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat) return false;
  if (x.dim() != 5 || w.dim() != 5 || cpu_autocast()) return false;
  if (x.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d || !w.is_contiguous()) return false;
  return w.size(2) * w.size(3) * w.size(4) > 1;
}

// A forward convolution with dilation 1, groups 1 and numeric zero padding by libtorch's kernels:
// oneDNN's where onednn_forward_applies, else libtorch's own choice. Under autograd oneDNN's
// records libtorch's convolution backward, as at::conv3d does.
at::Tensor libtorch_conv3d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, at::IntArrayRef stride,
                           at::IntArrayRef padding) {
  if (onednn_forward_applies(x, w)) {
    return at::mkldnn_convolution(x.contiguous(), w, bias, padding, stride, /*dilation=*/{1, 1, 1},
                                  /*groups=*/1);
  }
  return at::conv3d(x, w, bias, stride, padding);
}

// conv3d with stride 1, dilation 1, groups 1, numeric zero padding: the direct kernel where it
// applies, else libtorch's.
at::Tensor conv3d_stride1(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::IntArrayRef padding) {
  const at::Tensor bias = b.defined() && b.numel() > 0 ? b : at::Tensor();
  if (direct_applies(x, w, {1, 1, 1})) return direct_conv3d(x, w, bias, {1, 1, 1}, padding);
  return libtorch_conv3d(x, w, bias, /*stride=*/{1, 1, 1}, padding);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Under autocast (bfloat16 on the CPU) the forward computed in the gradient's dtype from float
// tensors: the backward computes in it too, as libtorch's would (the autograd engine casts each
// returned gradient to its input's dtype).
at::Tensor in_dtype_of(const at::Tensor& t, const at::Tensor& g) {
  return t.scalar_type() == g.scalar_type() ? t : t.to(g.scalar_type());
}

// y = conv3d(x, w, b), stride 1, dilation 1, groups 1. dx is dy convolved with w flipped in
// space and with its channel axes swapped ([out, in, k] -> [in, out, k]), padded by k - 1 - p:
// a forward convolution, where libtorch's backward-data kernel is the slow part. dw is
// libtorch's weight gradient, db the sum of dy.
struct Conv3dStride1 : torch::autograd::Function<Conv3dStride1> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            std::vector<std::int64_t> padding) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["bias"] = b.numel() > 0;
    return conv3d_stride1(x, w, b, padding);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = grad[0];
    const at::Tensor x = in_dtype_of(saved[0], g), w = in_dtype_of(saved[1], g);
    const std::vector<std::int64_t> padding = ctx->saved_data["padding"].toIntVector();
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      std::vector<std::int64_t> full(3);
      for (std::size_t i = 0; i < 3; ++i) full[i] = w.size(static_cast<std::int64_t>(i) + 2) - 1 - padding[i];
      const at::Tensor flipped = w.flip({2, 3, 4}).transpose(0, 1).contiguous();
      // Under create_graph the gradient needs a graph of its own: libtorch's convolution.
      dx = at::GradMode::is_enabled() ? at::conv3d(g, flipped, {}, /*stride=*/1, full)
                                      : conv3d_stride1(g, flipped, {}, full);
    }
    if (ctx->needs_input_grad(1)) {
      dw = std::get<1>(at::convolution_backward(g, x, w, c10::nullopt, {1, 1, 1}, padding, {1, 1, 1},
                                                /*transposed=*/false, {0, 0, 0}, /*groups=*/1, {false, true, false}));
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) db = g.sum({0, 2, 3, 4});
    return {dx, dw, db, at::Tensor()};
  }
};

// y = conv_transpose3d(x, w, b): the adjoint of z = conv3d(y', w, stride, padding). So dx is
// that strided forward convolution of dy, and dw is the weight gradient of that convolution
// with dy as its input and x as its output's gradient (output_padding < stride makes the
// shapes agree). libtorch 1.13 computes both through im2col loops on the CPU.
struct ConvTranspose3dByConv : torch::autograd::Function<ConvTranspose3dByConv> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                            std::vector<std::int64_t> output_padding) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["bias"] = b.numel() > 0;
    return at::conv_transpose3d(x, w, b.numel() > 0 ? b : at::Tensor(), stride, padding, output_padding, /*groups=*/1,
                                /*dilation=*/1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = grad[0];
    const at::Tensor x = in_dtype_of(saved[0], g), w = in_dtype_of(saved[1], g);
    const std::vector<std::int64_t> stride = ctx->saved_data["stride"].toIntVector();
    const std::vector<std::int64_t> padding = ctx->saved_data["padding"].toIntVector();
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::conv3d(g, w, {}, stride, padding);
    if (ctx->needs_input_grad(1)) {
      dw = std::get<1>(at::convolution_backward(x, g, w, c10::nullopt, stride, padding, {1, 1, 1},
                                                /*transposed=*/false, {0, 0, 0}, /*groups=*/1, {false, true, false}));
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) db = g.sum({0, 2, 3, 4});
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The bias argument of the functions above: libtorch 1.13's custom functions take no undefined
// tensor, so a convolution without bias passes an empty one.
at::Tensor bias_argument(const at::Tensor& bias) {
  return bias.defined() ? bias : at::empty({0});
}

std::atomic<bool> custom_backward_on{true};

// A gradient to compute: grad mode on and a tensor that requires one.
bool needs_grad(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  return at::GradMode::is_enabled() &&
         (input.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
}

// Float32 on the CPU, with a gradient to compute.
bool wants_custom_backward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  if (!custom_backward_on.load(std::memory_order_relaxed) || !needs_grad(input, weight, bias)) return false;
  return input.device().is_cpu() && input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat;
}

template <typename Options>
bool plain_geometry(const Options& o) {
  using std::get_if;  // 1.13 holds c10::variant, 2.x std::variant: argument-dependent lookup picks
  if (get_if<torch::enumtype::kZeros>(&o.padding_mode()) == nullptr) return false;
  if (o.groups() != 1) return false;
  for (const std::int64_t d : *o.dilation()) {
    if (d != 1) return false;
  }
  return true;
}

template <typename Options>
const torch::ExpandingArray<3>* numeric_padding(const Options& o) {
  using std::get_if;
  return get_if<torch::ExpandingArray<3>>(&o.padding());
}

thread_local MacCounter* innermost_counter = nullptr;

}  // namespace

MacCounter::MacCounter() : outer_(innermost_counter) {
  innermost_counter = this;
}
MacCounter::~MacCounter() {
  innermost_counter = outer_;
}
void count_macs(double macs) {
  for (MacCounter* c = innermost_counter; c != nullptr; c = c->outer_) c->macs_ += macs;
}

void set_onednn_conv_forward(bool on) {
  onednn_forward_on.store(on);
}
bool onednn_conv_forward_enabled() {
  return onednn_forward_on.load(std::memory_order_relaxed) && at::hasMKLDNN() &&
         at::globalContext().userEnabledMkldnn();
}

void set_custom_conv_backward(bool on) {
  custom_backward_on.store(on);
}

bool transposed_conv_custom_backward() {
  return MEDFAST_TRANSPOSED_CONV_CUSTOM_BACKWARD;
}

at::Tensor Conv3dImpl::forward(const at::Tensor& input) {
  at::Tensor y = keep_channels_last(input, weight, run(input));
  if (innermost_counter != nullptr) {
    count_macs(static_cast<double>(y.numel()) * static_cast<double>(options.in_channels() / options.groups()) *
               static_cast<double>(c10::multiply_integers(*options.kernel_size())));
  }
  return y;
}

at::Tensor Conv3dImpl::run(const at::Tensor& input) {
  const auto* pad = numeric_padding(options);
  if (pad == nullptr || !plain_geometry(options)) return torch::nn::Conv3dImpl::forward(input);
  const std::vector<std::int64_t> padding = at::IntArrayRef(*pad).vec();
  bool stride1 = true, inner_padding = true;
  for (std::size_t i = 0; i < 3; ++i) {
    stride1 = stride1 && (*options.stride())[i] == 1;
    inner_padding = inner_padding && padding[i] <= (*options.kernel_size())[i] - 1;
  }
  if (wants_custom_backward(input, weight, bias)) {
    if (stride1 && inner_padding && options.out_channels() <= kCustomBackwardMaxOutChannels) {
      return Conv3dStride1::apply(input, weight, bias_argument(bias), padding);
    }
    return libtorch_conv3d(input, weight, bias, *options.stride(), padding);
  }
  // No gradient to compute (validation, inference), or libtorch's backward asked for: the
  // direct kernel only where nothing needs a gradient.
  if (!needs_grad(input, weight, bias) && stride1 && direct_applies(input, weight, *options.stride())) {
    return direct_conv3d(input, weight, bias, {1, 1, 1}, padding);
  }
  return libtorch_conv3d(input, weight, bias, *options.stride(), padding);
}

at::Tensor ConvTranspose3dImpl::forward(const at::Tensor& input, const c10::optional<at::IntArrayRef>& output_size) {
  if (innermost_counter != nullptr) {
    const std::int64_t out_per_group = options.out_channels() / options.groups();
    count_macs(static_cast<double>(input.numel()) * static_cast<double>(out_per_group) *
               static_cast<double>(c10::multiply_integers(*options.kernel_size())));
  }
  return keep_channels_last(input, weight, run(input, output_size));
}

at::Tensor ConvTranspose3dImpl::run(const at::Tensor& input, const c10::optional<at::IntArrayRef>& output_size) {
#if MEDFAST_TRANSPOSED_CONV_CUSTOM_BACKWARD  // not instantiated where unused
  const auto* pad = numeric_padding(options);
  if (!output_size.has_value() && pad != nullptr && plain_geometry(options) &&
      wants_custom_backward(input, weight, bias)) {
    return ConvTranspose3dByConv::apply(input, weight, bias_argument(bias), at::IntArrayRef(options.stride()).vec(),
                                        at::IntArrayRef(*pad).vec(), at::IntArrayRef(options.output_padding()).vec());
  }
#endif
  return torch::nn::ConvTranspose3dImpl::forward(input, output_size);
}

}  // namespace medfast::nn
