// nn/direct_conv: medfast's direct convolution for few channels against libtorch's in float64,
// on every instruction set this CPU runs (generic everywhere; AVX2 and AVX-512 where the CPU
// has them), and where the networks' Conv3d takes it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/direct_conv.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/train/amp.hpp"
#include "test_util.hpp"

namespace medfast::nn {
namespace {

/// Leaves the instruction set and the on/off switch at their defaults (auto, on), which
/// tests change.
class DirectConv : public ::testing::Test {
 protected:
  void TearDown() override {
    set_direct_conv_isa("auto");
    set_direct_conv(true);
  }
  static std::vector<std::string> isas() {
    std::vector<std::string> out;
    for (const char* i : {"generic", "avx2", "avx512"}) {
      if (direct_conv_isa_available(i)) out.emplace_back(i);
    }
    return out;
  }
};

struct Case {
  std::vector<std::int64_t> input;  // N, Cin, D, H, W
  std::int64_t cout;
  std::vector<std::int64_t> kernel, stride, padding;
  bool bias;
};

std::string describe(const Case& c) {
  return str("input ", at::IntArrayRef(c.input), " -> ", c.cout, " kernel ", at::IntArrayRef(c.kernel), " stride ",
             at::IntArrayRef(c.stride), " padding ", at::IntArrayRef(c.padding), c.bias ? " bias" : "");
}

TEST_F(DirectConv, EqualsFloat64ConvolutionOnEveryInstructionSet) {
  // Widths that are a whole row chunk (16), less, and one more; channel counts that fill the
  // output blocks of 4 and leave 1-3 over; kernels 3, 1, 2 and mixed; padding 0..k-1 and past
  // it; the last axis's stride 2.
  const std::vector<Case> cases = {
      {{2, 2, 8, 9, 16}, 2, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true},
      {{1, 1, 5, 6, 17}, 8, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true},
      {{3, 16, 4, 5, 5}, 2, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, false},
      {{1, 3, 6, 6, 33}, 5, {3, 3, 1}, {1, 1, 1}, {1, 1, 0}, true},
      {{2, 4, 5, 4, 7}, 7, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, true},
      {{1, 2, 7, 7, 20}, 3, {2, 2, 2}, {1, 1, 1}, {0, 1, 1}, false},
      {{1, 2, 6, 6, 12}, 4, {3, 3, 3}, {1, 1, 1}, {2, 0, 3}, true},
      {{2, 1, 9, 8, 40}, 4, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, true},
      {{1, 2, 5, 5, 3}, 1, {3, 3, 3}, {1, 1, 1}, {0, 0, 0}, true},
      {{1, 2, 7, 8, 19}, 3, {5, 5, 5}, {1, 1, 1}, {2, 2, 2}, true},
      {{1, 3, 6, 6, 21}, 2, {3, 3, 3}, {2, 1, 2}, {1, 1, 1}, false},
  };
  torch::manual_seed(3);
  for (const std::string& isa : isas()) {
    set_direct_conv_isa(isa);
    ASSERT_EQ(direct_conv_isa(), isa);
    for (const Case& c : cases) {
      const at::Tensor x = at::randn(c.input);
      const at::Tensor w = at::randn({c.cout, c.input[1], c.kernel[0], c.kernel[1], c.kernel[2]});
      const at::Tensor b = c.bias ? at::randn({c.cout}) : at::Tensor();
      const at::Tensor y = direct_conv3d(x, w, b, c.stride, c.padding);
      const at::Tensor ref = at::conv3d(x.to(at::kDouble), w.to(at::kDouble), c.bias ? b.to(at::kDouble) : at::Tensor(),
                                        c.stride, c.padding);
      ASSERT_EQ(y.sizes(), ref.sizes()) << isa << " " << describe(c);
      ASSERT_EQ(y.scalar_type(), at::kFloat);
      // float32 sums of products of N(0, 1) values: within a few roundings of the sum of
      // magnitudes.
      const at::Tensor magnitude = at::conv3d(x.abs().to(at::kDouble), w.abs().to(at::kDouble),
                                              c.bias ? b.abs().to(at::kDouble) : at::Tensor(), c.stride, c.padding);
      const double worst = ((y.to(at::kDouble) - ref).abs() / (magnitude * 1e-6 + 1e-30)).max().item<double>();
      EXPECT_LE(worst, 1.0) << isa << " " << describe(c);
    }
  }
}

TEST_F(DirectConv, NonFiniteInputsReachExactlyTheOutputsTheyShould) {
  // A NaN and an inf in the input: the outputs whose windows hold them are NaN/inf, as
  // libtorch's, and no other (the sums past a row's end, which the kernel discards, read the
  // next row).
  for (const std::string& isa : isas()) {
    set_direct_conv_isa(isa);
    at::Tensor x = at::randn({1, 2, 4, 5, 18});
    x[0][0][1][2][17] = std::numeric_limits<float>::quiet_NaN();
    x[0][1][3][0][0] = std::numeric_limits<float>::infinity();
    const at::Tensor w = at::rand({2, 2, 3, 3, 3}) + 0.1;  // positive: inf stays inf where no NaN meets it
    const at::Tensor y = direct_conv3d(x, w, {}, {1, 1, 1}, {1, 1, 1});
    const at::Tensor ref = at::conv3d(x.to(at::kDouble), w.to(at::kDouble), {}, 1, 1).to(at::kFloat);
    EXPECT_TRUE(at::equal(at::isnan(y), at::isnan(ref))) << isa;
    EXPECT_TRUE(at::equal(at::isinf(y), at::isinf(ref))) << isa;
    EXPECT_GT(at::isnan(y).sum().item<std::int64_t>(), 0) << isa;
  }
}

TEST_F(DirectConv, SameBitsWithAnyThreadCountAndInputLayout) {
  const int threads = at::get_num_threads();
  const at::Tensor x = at::randn({2, 3, 10, 12, 16});
  const at::Tensor w = at::randn({4, 3, 3, 3, 3}), b = at::randn({4});
  at::set_num_threads(1);
  const at::Tensor one = direct_conv3d(x, w, b, {1, 1, 1}, {1, 1, 1});
  at::set_num_threads(3);
  const at::Tensor three = direct_conv3d(x, w, b, {1, 1, 1}, {1, 1, 1});
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one, three));
  // Channels-last and a strided view: read as the same values.
  const at::Tensor cl = x.contiguous(at::MemoryFormat::ChannelsLast3d);
  EXPECT_TRUE(at::equal(direct_conv3d(cl, w, b, {1, 1, 1}, {1, 1, 1}), one));
  const at::Tensor wide = at::randn({2, 3, 10, 12, 32});
  const at::Tensor view = wide.narrow(4, 8, 16);
  EXPECT_TRUE(at::equal(direct_conv3d(view, w, b, {1, 1, 1}, {1, 1, 1}),
                        direct_conv3d(view.contiguous(), w, b, {1, 1, 1}, {1, 1, 1})));
}

TEST_F(DirectConv, Conv3dTakesItForFewOutputChannelsWithoutGradients) {
  if (direct_conv_isa() == "generic") {
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: Conv3d keeps libtorch's kernels";
  }
  torch::manual_seed(4);
  const at::Tensor x = at::randn({2, 3, 6, 7, 20});
  for (const std::int64_t out : {1, 2, 4, 5, 8}) {
    Conv3d conv(torch::nn::Conv3dOptions(3, out, 3).padding(1));
    conv->eval();
    const at::Tensor direct = direct_conv3d(x, conv->weight, conv->bias, {1, 1, 1}, {1, 1, 1});
    const at::Tensor libtorch = at::conv3d(x, conv->weight, conv->bias, 1, 1);
    // The two differ in their last bits somewhere (their sums' order), or the checks below
    // could not tell which one ran.
    ASSERT_FALSE(at::equal(direct, libtorch)) << out;
    for (const bool inference : {true, false}) {
      at::Tensor y;
      if (inference) {
        c10::InferenceMode guard;
        y = conv->forward(x);
      } else {
        torch::NoGradGuard guard;
        y = conv->forward(x);
      }
      // Bit for bit one of the two: the direct kernel up to kDirectMaxOutChannels, else libtorch's.
      EXPECT_TRUE(at::equal(y, out <= kDirectMaxOutChannels ? direct : libtorch)) << out << " " << inference;
    }
    // Under the custom backward the forward is the direct kernel's too, the gradients
    // libtorch's up to rounding (test_conv.cpp checks them).
    const at::Tensor trained = conv->forward(x.detach().requires_grad_());
    EXPECT_TRUE(at::equal(trained.detach(), out <= kDirectMaxOutChannels ? direct : libtorch)) << out;
    // Switched off (conv_forward: libtorch): libtorch's everywhere.
    set_direct_conv(false);
    {
      c10::InferenceMode guard;
      EXPECT_TRUE(at::equal(conv->forward(x), libtorch)) << out;
    }
    set_direct_conv(true);
  }
  // With the generic (SSE2) kernels only, the networks keep libtorch's (it was faster).
  set_direct_conv_isa("generic");
  EXPECT_FALSE(direct_conv_enabled());
  {
    Conv3d conv(torch::nn::Conv3dOptions(3, 2, 3).padding(1));
    c10::InferenceMode guard;
    EXPECT_TRUE(at::equal(conv->forward(x), at::conv3d(x, conv->weight, conv->bias, 1, 1)));
  }
  set_direct_conv_isa("auto");
  EXPECT_TRUE(direct_conv_enabled());
  // Channels-last input keeps libtorch's kernel; the output is channels-last for the layers
  // after (nn/layout.hpp: laid out again where this libtorch's kernel writes NCDHW).
  Conv3d two(torch::nn::Conv3dOptions(3, 2, 3).padding(1));
  {
    c10::InferenceMode guard;
    const at::Tensor cl = x.contiguous(at::MemoryFormat::ChannelsLast3d);
    const at::Tensor y = two->forward(cl), ref = at::conv3d(cl, two->weight, two->bias, 1, 1);
    EXPECT_TRUE(is_channels_last(y));
    EXPECT_TRUE(at::equal(y, ref));
  }
  // Under CPU autocast: libtorch's convolution in bfloat16, as autocast asks.
  {
    c10::InferenceMode guard;
    train::AutocastGuard autocast(c10::DeviceType::CPU, train::Precision::bf16);
    EXPECT_EQ(two->forward(x).scalar_type(), at::kBFloat16);
  }
  // A strided convolution, and a float64 one: libtorch's.
  Conv3d strided(torch::nn::Conv3dOptions(3, 2, 3).stride(2).padding(1));
  c10::InferenceMode guard;
  EXPECT_TRUE(at::equal(strided->forward(x), at::conv3d(x, strided->weight, strided->bias, 2, 1)));
  Conv3d wide(torch::nn::Conv3dOptions(3, 2, 3).padding(1));
  wide->to(at::kDouble);
  const at::Tensor x64 = x.to(at::kDouble);
  EXPECT_TRUE(at::equal(wide->forward(x64), at::conv3d(x64, wide->weight, wide->bias, 1, 1)));
}

TEST_F(DirectConv, UnknownOrMissingInstructionSetsAndBadShapesAreRefused) {
  const std::string m = test::error_of<ValueError>([] { set_direct_conv_isa("sse9"); });
  EXPECT_NE(m.find("'sse9'"), std::string::npos) << m;
  EXPECT_NE(m.find("expected auto, generic, avx2, avx512"), std::string::npos) << m;
  for (const char* i : {"avx2", "avx512"}) {
    if (!direct_conv_isa_available(i)) {
      const std::string e = test::error_of<ValueError>([i] { set_direct_conv_isa(i); });
      EXPECT_NE(e.find(str("this CPU has no ", i)), std::string::npos) << e;
    }
  }
  const at::Tensor x = at::randn({1, 3, 4, 4, 4});
  EXPECT_THROW(direct_conv3d(x, at::randn({2, 4, 3, 3, 3}), {}, {1, 1, 1}, {1, 1, 1}), c10::Error);  // channels
  EXPECT_THROW(direct_conv3d(x.to(at::kDouble), at::randn({2, 3, 3, 3, 3}), {}, {1, 1, 1}, {1, 1, 1}), c10::Error);
  EXPECT_THROW(direct_conv3d(x, at::randn({2, 3, 3, 3, 3}), {}, {1, 1, 3}, {1, 1, 1}), c10::Error);  // stride 3
  EXPECT_THROW(direct_conv3d(x, at::randn({2, 3, 7, 3, 3}), {}, {1, 1, 1}, {1, 1, 1}), c10::Error);  // kernel > input
  EXPECT_THROW(direct_conv3d(x, at::randn({2, 3, 3, 3, 3}), at::randn({3}), {1, 1, 1}, {1, 1, 1}), c10::Error);
  EXPECT_THROW(direct_conv3d(x, at::randn({2, 3, 3, 3, 3}), {}, {0, 1, 1}, {1, 1, 1}), c10::Error);   // stride 0
  EXPECT_THROW(direct_conv3d(x, at::randn({2, 3, 3, 3, 3}), {}, {1, 1, 1}, {1, -1, 1}), c10::Error);  // padding
  EXPECT_THROW(direct_conv3d(x, at::randn({0, 3, 3, 3, 3}), {}, {1, 1, 1}, {1, 1, 1}), c10::Error);   // no outputs
}

}  // namespace
}  // namespace medfast::nn
