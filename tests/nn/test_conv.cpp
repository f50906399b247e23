// nn/conv: medfast's Conv3d and ConvTranspose3d against libtorch's modules with the same
// weights: the same outputs, the same gradients up to float rounding, the custom backward
// taken exactly where conv.hpp says, libtorch's own everywhere else.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend_check.hpp"
#include "op_recorder.hpp"
#include "medfast/core/error.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/train/amp.hpp"

namespace medfast::nn {
namespace {

struct Grads {
  at::Tensor y, dx, dw, db;
  std::string node;  // the output's grad_fn
};

template <typename Module>
Grads run(Module& m, const at::Tensor& input, bool input_grad, const at::Tensor& dy_seed) {
  at::Tensor x = input.detach().clone().set_requires_grad(input_grad);
  for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
  Grads g;
  g.y = m->forward(x);
  g.node = g.y.grad_fn() ? g.y.grad_fn()->name() : "";
  const at::Tensor dy = dy_seed.defined() ? dy_seed : at::randn_like(g.y);
  g.y.backward(dy);
  g.dx = input_grad ? x.grad() : at::Tensor();
  g.dw = m->weight.grad();
  g.db = m->bias.defined() ? m->bias.grad() : at::Tensor();
  return g;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what, double relative = 1e-5) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double scale = b.abs().max().item<double>();
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, relative * scale + 1e-6) << what << ": max |diff| " << diff << " of max " << scale;
}

void expect_same_gradients(const Grads& ours, const Grads& ref, const std::string& what) {
  expect_close(ours.y, ref.y, what + " output");
  expect_close(ours.dx, ref.dx, what + " input gradient");
  expect_close(ours.dw, ref.dw, what + " weight gradient");
  expect_close(ours.db, ref.db, what + " bias gradient");
}

struct ConvCase {
  std::int64_t in, out;
  std::vector<std::int64_t> kernel, stride, padding;
  bool bias;
};

std::string describe(const ConvCase& c) {
  return str(c.in, "->", c.out, " kernel ", at::IntArrayRef(c.kernel), " stride ", at::IntArrayRef(c.stride),
             " padding ", at::IntArrayRef(c.padding), c.bias ? " bias" : " no bias");
}

std::pair<Conv3d, torch::nn::Conv3d> conv_pair(const ConvCase& c) {
  const auto o = torch::nn::Conv3dOptions(c.in, c.out, c.kernel).stride(c.stride).padding(c.padding).bias(c.bias);
  Conv3d ours(o);
  torch::nn::Conv3d ref(o);
  torch::NoGradGuard no_grad;
  ref->weight.copy_(ours->weight);
  if (c.bias) ref->bias.copy_(ours->bias);
  return {ours, ref};
}

TEST(Conv, Conv3dGradientsEqualLibtorch) {
  torch::manual_seed(1);
  const std::vector<ConvCase> cases = {
      {2, 2, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true},   {1, 8, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true},
      {16, 2, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, false}, {4, 6, {3, 3, 1}, {1, 1, 1}, {1, 1, 0}, true},
      {5, 3, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, true},   {3, 4, {3, 3, 3}, {1, 1, 1}, {0, 0, 0}, false},
      {3, 4, {3, 1, 3}, {1, 1, 1}, {2, 0, 1}, true},   {3, 4, {1, 1, 1}, {1, 1, 1}, {1, 0, 0}, true},
      {4, 16, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true},
  };
  for (const ConvCase& c : cases) {
    auto [ours, ref] = conv_pair(c);
    const at::Tensor x = at::randn({2, c.in, 9, 8, 7});
    for (const bool input_grad : {true, false}) {
      const std::string what = describe(c) + (input_grad ? "" : ", input without gradient");
      const at::Tensor dy = at::randn_like(ref->forward(x));  // the same output gradient on both sides
      const Grads a = run(ours, x, input_grad, dy), b = run(ref, x, input_grad, dy);
      expect_same_gradients(a, b, what);
      const bool custom = c.padding[0] <= c.kernel[0] - 1 && c.padding[1] <= c.kernel[1] - 1 &&
                          c.padding[2] <= c.kernel[2] - 1 && c.out <= kCustomBackwardMaxOutChannels;
      EXPECT_EQ(a.node.find("Conv3dStride1") != std::string::npos, custom) << what << ": " << a.node;
    }
  }
}

TEST(Conv, Conv3dTakesLibtorchsBackwardOutsideItsCase) {
  torch::manual_seed(2);
  // libtorch's own forward too (the oneDNN forward below records its own node).
  set_onednn_conv_forward(false);
  struct Restore {
    ~Restore() { set_onednn_conv_forward(true); }
  } restore;
  // Strided, dilated, grouped, float64: libtorch's own backward, the same numbers.
  struct Other {
    torch::nn::Conv3dOptions options;
    at::ScalarType dtype;
  };
  const std::vector<Other> others = {
      {torch::nn::Conv3dOptions(4, 4, 3).stride(2).padding(1), at::kFloat},
      {torch::nn::Conv3dOptions(4, 4, 3).dilation(2).padding(2), at::kFloat},
      {torch::nn::Conv3dOptions(4, 4, 3).groups(2).padding(1), at::kFloat},
      {torch::nn::Conv3dOptions(4, 4, 3).padding(1).padding_mode(torch::kReplicate), at::kFloat},
      {torch::nn::Conv3dOptions(4, 4, 3).padding(torch::kSame), at::kFloat},
      {torch::nn::Conv3dOptions(4, 4, 3).padding(1), at::kDouble},
  };
  for (const Other& c : others) {
    Conv3d ours(c.options);
    torch::nn::Conv3d ref(c.options);
    ours->to(c.dtype);
    ref->to(c.dtype);
    {
      torch::NoGradGuard no_grad;
      ref->weight.copy_(ours->weight);
      ref->bias.copy_(ours->bias);
    }
    const at::Tensor x = at::randn({2, 4, 9, 8, 7}, at::TensorOptions().dtype(c.dtype));
    const at::Tensor dy = at::randn_like(ref->forward(x));
    const Grads a = run(ours, x, true, dy), b = run(ref, x, true, dy);
    EXPECT_EQ(a.node, b.node);
    EXPECT_TRUE(a.y.equal(b.y));
    EXPECT_TRUE(a.dx.equal(b.dx));
    EXPECT_TRUE(a.dw.equal(b.dw));
  }
  // No gradient wanted: no graph (the forward is medfast's direct kernel for so few output
  // channels, test_direct_conv.cpp, else libtorch's).
  Conv3d ours(torch::nn::Conv3dOptions(2, 2, 3).padding(1));
  torch::NoGradGuard no_grad;
  const at::Tensor y = ours->forward(at::randn({1, 2, 5, 5, 5}));
  EXPECT_FALSE(y.requires_grad());
}

// One small volume (N*C*D*H <= 20480), where libtorch's own rule takes its im2col kernel: a
// forward convolution whose kernel is more than one voxel runs oneDNN's, in training (with the
// custom backward, with libtorch's, strided) and without gradients; the same outputs and
// gradients as libtorch's up to float rounding; a 1x1x1 kernel, channels-last input and
// conv_forward: libtorch keep libtorch's choice.
TEST(Conv, Conv3dTakesOneDnnWhereLibtorchWouldTakeIm2col) {
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) {
    GTEST_SKIP() << "libtorch is built without oneDNN (or it is switched off): nothing to choose";
  }
  ASSERT_TRUE(onednn_conv_forward_enabled());
  torch::manual_seed(3);
  struct Case {
    ConvCase conv;
    bool onednn;
  };
  const std::vector<Case> cases = {
      {{8, 8, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true}, true},     // the custom backward's case
      {{8, 16, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true}, true},    // libtorch's backward
      {{8, 16, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, false}, true},   // strided
      {{8, 16, {3, 3, 1}, {1, 1, 1}, {1, 1, 0}, true}, true},    // anisotropic
      {{8, 16, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, true}, false},   // 1x1x1: libtorch's matrix product
  };
  const auto ran = [](const std::vector<test::OpRecorder::Op>& ops, const std::string& name) {
    return std::any_of(ops.begin(), ops.end(), [&](const auto& op) { return op.name == name; });
  };
  for (const Case& c : cases) {
    auto [ours, ref] = conv_pair(c.conv);
    const at::Tensor x = at::randn({1, c.conv.in, 12, 12, 10});
    const std::string what = describe(c.conv);
    const at::Tensor dy = at::randn_like(ref->forward(x));
    std::vector<test::OpRecorder::Op> ops;
    Grads a;
    {
      test::OpRecorder recorder;
      a = run(ours, x, true, dy);
      ops = recorder.ops();
    }
    const Grads b = run(ref, x, true, dy);
    expect_same_gradients(a, b, what);
    EXPECT_EQ(ran(ops, "aten::mkldnn_convolution"), c.onednn) << what;
    if (c.onednn) EXPECT_FALSE(ran(ops, "aten::slow_conv3d_forward")) << what;
    {  // without gradients
      torch::NoGradGuard no_grad;
      test::OpRecorder recorder;
      const at::Tensor y = ours->forward(x);
      EXPECT_EQ(ran(recorder.ops(), "aten::mkldnn_convolution"), c.onednn) << what << ", no gradient";
      expect_close(y, b.y, what + ", no gradient");
    }
  }
  // Channels-last input, and the setting off: libtorch's own choice (its im2col kernel here).
  auto [ours, ref] = conv_pair({8, 16, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true});
  const at::Tensor x = at::randn({1, 8, 12, 12, 10});
  torch::NoGradGuard no_grad;
  {
    test::OpRecorder recorder;
    (void)ours->forward(x.contiguous(at::MemoryFormat::ChannelsLast3d));
    EXPECT_FALSE(ran(recorder.ops(), "aten::mkldnn_convolution")) << "channels-last";
  }
  set_onednn_conv_forward(false);
  {
    test::OpRecorder recorder;
    const at::Tensor y = ours->forward(x);
    set_onednn_conv_forward(true);
    EXPECT_FALSE(ran(recorder.ops(), "aten::mkldnn_convolution")) << "conv_forward: libtorch";
    EXPECT_TRUE(y.equal(ref->forward(x))) << "conv_forward: libtorch";
  }
}

TEST(Conv, ConvTranspose3dGradientsEqualLibtorch) {
  torch::manual_seed(3);
  struct Case {
    ConvCase c;
    std::vector<std::int64_t> output_padding;
  };
  const std::vector<Case> cases = {
      {{16, 2, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, true}, {1, 1, 1}},  // MONAI UNet's up convolution
      {{8, 4, {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, false}, {0, 0, 0}},  // DynUNet's, SegResNet's
      {{3, 5, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true}, {0, 0, 0}},
      {{4, 4, {3, 3, 1}, {2, 2, 1}, {1, 1, 0}, true}, {1, 0, 0}},
  };
  for (const Case& k : cases) {
    const ConvCase& c = k.c;
    const auto o = torch::nn::ConvTranspose3dOptions(c.in, c.out, c.kernel)
                       .stride(c.stride)
                       .padding(c.padding)
                       .output_padding(k.output_padding)
                       .bias(c.bias);
    ConvTranspose3d ours(o);
    torch::nn::ConvTranspose3d ref(o);
    {
      torch::NoGradGuard no_grad;
      ref->weight.copy_(ours->weight);
      if (c.bias) ref->bias.copy_(ours->bias);
    }
    const at::Tensor x = at::randn({2, c.in, 6, 5, 4});
    for (const bool input_grad : {true, false}) {
      const std::string what = "transposed " + describe(c) + (input_grad ? "" : ", input without gradient");
      const at::Tensor dy = at::randn_like(ref->forward(x));
      const Grads a = run(ours, x, input_grad, dy), b = run(ref, x, input_grad, dy);
      expect_same_gradients(a, b, what);
      EXPECT_EQ(a.node.find("ConvTranspose3dByConv") != std::string::npos, transposed_conv_custom_backward())
          << what << ": " << a.node;
    }
  }
}

TEST(Conv, GradientsUnderCpuAutocastEqualLibtorch) {
  // bfloat16 autocast (amp on the CPU): where autocast runs the op in bfloat16 from float
  // parameters (libtorch 1.13: the transposed convolution), so does the backward; the
  // gradients come back in float32 as libtorch's do.
  torch::manual_seed(5);
  Conv3d ours(torch::nn::Conv3dOptions(4, 3, 3).padding(1));
  torch::nn::Conv3d ref(torch::nn::Conv3dOptions(4, 3, 3).padding(1));
  ConvTranspose3d ours_t(torch::nn::ConvTranspose3dOptions(4, 3, 3).stride(2).padding(1).output_padding(1));
  torch::nn::ConvTranspose3d ref_t(torch::nn::ConvTranspose3dOptions(4, 3, 3).stride(2).padding(1).output_padding(1));
  {
    torch::NoGradGuard no_grad;
    ref->weight.copy_(ours->weight);
    ref->bias.copy_(ours->bias);
    ref_t->weight.copy_(ours_t->weight);
    ref_t->bias.copy_(ours_t->bias);
  }
  const at::Tensor x = at::randn({2, 4, 6, 5, 4});
  const auto check = [&](auto& a_module, auto& b_module, const std::string& what) {
    Grads a, b;
    at::Tensor dy;
    {
      train::AutocastGuard autocast(c10::DeviceType::CPU, train::Precision::bf16);
      dy = at::randn_like(b_module->forward(x));
      a = run(a_module, x, true, dy);
      b = run(b_module, x, true, dy);
    }
    EXPECT_EQ(a.y.scalar_type(), b.y.scalar_type()) << what;  // autocast's choice for the op
    EXPECT_EQ(a.dx.scalar_type(), at::kFloat) << what;
    EXPECT_EQ(a.dw.scalar_type(), at::kFloat) << what;
    // bfloat16 keeps 8 bits: the same sums in another order differ by its rounding.
    expect_close(a.y.to(at::kFloat), b.y.to(at::kFloat), what + " output", 0.02);
    expect_close(a.dx, b.dx, what + " input gradient", 0.02);
    expect_close(a.dw, b.dw, what + " weight gradient", 0.02);
  };
  check(ours, ref, "conv");
  check(ours_t, ref_t, "transposed conv");
}

TEST(Conv, ConvTranspose3dOutputSizeAndSequential) {
  torch::manual_seed(4);
  const auto o = torch::nn::ConvTranspose3dOptions(3, 2, 3).stride(2).padding(1);
  ConvTranspose3d ours(o);
  torch::nn::ConvTranspose3d ref(o);
  {
    torch::NoGradGuard no_grad;
    ref->weight.copy_(ours->weight);
    ref->bias.copy_(ours->bias);
  }
  const at::Tensor x = at::randn({1, 3, 4, 5, 6}).set_requires_grad(true);
  const std::vector<std::int64_t> size = {8, 10, 11};  // output_padding 1, 1, 0 from the size
  const at::Tensor a = ours->forward(x, at::IntArrayRef(size)), b = ref->forward(x, at::IntArrayRef(size));
  EXPECT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(a.equal(b));  // an output size: libtorch's module, whose output padding follows from it
  // In a Sequential (the networks' containers) with the one-argument call.
  torch::nn::Sequential seq(ours);
  EXPECT_EQ(seq->forward(x).sizes(), (std::vector<std::int64_t>{1, 2, 7, 9, 11}));
  // The parameters keep libtorch's names (state_dict keys; MONAI's checkpoints load).
  std::vector<std::string> names;
  for (const auto& p : ours->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
}

TEST(Conv, MacCounterCountsEachConvolutionOnce) {
  Conv3d conv(torch::nn::Conv3dOptions(2, 3, 3).padding(1));
  ConvTranspose3d up(torch::nn::ConvTranspose3dOptions(4, 2, 2).stride(2));
  torch::NoGradGuard no_grad;
  nn::MacCounter outer;
  {
    nn::MacCounter inner;
    (void)conv->forward(at::randn({1, 2, 4, 5, 6}));  // 3 x 120 outputs, 2 x 27 each
    EXPECT_DOUBLE_EQ(inner.macs(), 3.0 * 120 * 2 * 27);
  }
  (void)up->forward(at::randn({1, 4, 3, 3, 3}));  // 4 x 27 inputs, each to 2 x 8 outputs
  EXPECT_DOUBLE_EQ(outer.macs(), 3.0 * 120 * 2 * 27 + 4.0 * 27 * 2 * 8);
}

}  // namespace
}  // namespace medfast::nn
