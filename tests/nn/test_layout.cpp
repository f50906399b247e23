// Channels-last networks (nn/layout.hpp, nn/norm.hpp): the norms against libtorch's, every
// network channels-last against itself contiguous (outputs and gradients), and the layout
// at every operator of their forwards.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/nn/norm.hpp"
#include "nn/op_recorder.hpp"

namespace medfast::nn {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast3d;

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Instance and group norm, channels-last, against libtorch's on the same values in NCDHW:
// outputs, and the gradients of the input, weight and bias; the output stays channels-last.
TEST(ChannelsLast, NormsEqualLibtorchsAndKeepTheLayout) {
  torch::manual_seed(0);
  struct Case {
    const char* what;
    std::int64_t groups;  // 0: instance norm
    bool affine;
  };
  for (const Case c : {Case{"instance", 0, false}, Case{"instance affine", 0, true}, Case{"group 3", 3, true},
                       Case{"group 1", 1, true}}) {
    SCOPED_TRACE(c.what);
    const std::int64_t channels = 6;
    torch::nn::AnyModule ours, theirs;
    if (c.groups == 0) {
      const auto o = torch::nn::InstanceNorm3dOptions(channels).affine(c.affine);
      ours = torch::nn::AnyModule(InstanceNorm3d(o));
      theirs = torch::nn::AnyModule(torch::nn::InstanceNorm3d(o));
    } else {
      const auto o = torch::nn::GroupNormOptions(c.groups, channels).affine(c.affine);
      ours = torch::nn::AnyModule(GroupNorm(o));
      theirs = torch::nn::AnyModule(torch::nn::GroupNorm(o));
    }
    {
      torch::NoGradGuard g;
      auto p = ours.ptr()->parameters(), q = theirs.ptr()->parameters();
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i].copy_(torch::randn_like(p[i]) * 0.5 + 1);
        q[i].copy_(p[i]);
      }
    }
    // Values with an offset and spread per channel, as activations have.
    const at::Tensor x = torch::randn({2, channels, 5, 4, 3}) * 3 + torch::arange(channels).reshape({1, -1, 1, 1, 1});
    const at::Tensor xa = x.clone().requires_grad_(true);
    const at::Tensor xb = x.contiguous(kChannelsLast).requires_grad_(true);
    const at::Tensor ya = theirs.forward(xa), yb = ours.forward(xb);
    EXPECT_TRUE(yb.is_contiguous(kChannelsLast));
    EXPECT_LE(max_difference(ya, yb), 1e-5);
    const at::Tensor g = torch::randn_like(ya);
    (ya * g).sum().backward();
    (yb * g).sum().backward();
    EXPECT_LE(max_difference(xa.grad(), xb.grad()), 1e-5);
    auto p = ours.ptr()->parameters(), q = theirs.ptr()->parameters();
    for (std::size_t i = 0; i < p.size(); ++i) EXPECT_LE(max_difference(p[i].grad(), q[i].grad()), 1e-4) << i;
    // A contiguous input takes libtorch's own forward: the same values.
    EXPECT_LE(max_difference(ours.forward(x), ya), 1e-6);
    EXPECT_TRUE(ours.forward(x).is_contiguous());
    // bfloat16 (autocast's dtype on the CPU): the statistics in float, the result in bfloat16.
    const at::Tensor yh = ours.forward(x.to(at::kBFloat16).contiguous(kChannelsLast));
    EXPECT_EQ(yh.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(yh.is_contiguous(kChannelsLast));
    EXPECT_LE(max_difference(yh, ya), 0.02 * (ya.abs().max().item<double>() + 1));
  }
  EXPECT_THROW(channels_last_group_norm(torch::randn({1, 6, 2, 2, 2}), 4, {}, {}, 1e-5), ValueError);
}

/// A small network of each kind (and each norm), the arguments MONAI takes.
std::vector<nlohmann::json> networks() {
  using J = nlohmann::json;
  return {
      J{{"name", "UNet"}, {"in_channels", 1}, {"out_channels", 2}, {"channels", {4, 8, 16}}, {"strides", {2, 2}},
        {"num_res_units", 2}, {"norm", "batch"}},
      J{{"name", "UNet"}, {"in_channels", 1}, {"out_channels", 2}, {"channels", {4, 8, 16}}, {"strides", {2, 2}},
        {"num_res_units", 1}, {"norm", "instance"}},
      J{{"name", "DynUNet"}, {"in_channels", 1}, {"out_channels", 3}, {"kernel_size", {3, 3, 3}},
        {"strides", {1, 2, 2}}, {"upsample_kernel_size", {2, 2}}, {"filters", {4, 8, 16}},
        {"deep_supervision", true}, {"deep_supr_num", 1}, {"res_block", true}, {"norm_name", "instance"}},
      J{{"name", "SegResNet"}, {"in_channels", 1}, {"out_channels", 2}, {"init_filters", 8}},
      J{{"name", "SwinUNETR"}, {"img_size", {32, 32, 32}}, {"in_channels", 1}, {"out_channels", 2},
        {"feature_size", 12}},
  };
}

/// The floating parameters and buffers in `dtype` (Module::to(dtype) converts integer buffers too).
void to_dtype(torch::nn::Module& module, at::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& t : module.parameters()) t.set_data(t.data().to(dtype));
  for (auto& t : module.buffers()) {
    if (t.is_floating_point()) t.set_data(t.data().to(dtype));
  }
}

at::Tensor input_for(const nlohmann::json& spec) {
  const std::int64_t side = spec["name"] == "SwinUNETR" ? 32 : 16;
  return torch::randn({2, 1, side, side, side});
}

// Each network made channels-last computes what it computes contiguous: the outputs in
// training mode (batch statistics, deep supervision) and in eval mode, and the gradients of
// every parameter; its 5-D weights and its output are channels-last. In float64 the two
// agree to 1e-9: the same arithmetic. In float32 (what trains; libtorch's oneDNN kernels)
// the sums over the voxels are added in another order, and instance norm's backward
// (differences of such sums) makes their rounding visible: a looser bound, relative to the
// largest gradient.
TEST(ChannelsLast, EveryNetworkComputesWhatItsContiguousSelfDoes) {
  torch::set_num_threads(2);
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-9 : 1e-2;
    for (const auto& spec : networks()) {
      SCOPED_TRACE(str(dtype == at::kDouble ? "float64 " : "float32 ", spec.dump()));
      torch::manual_seed(1);
      auto plain = make_network(spec);
      to_dtype(*plain.ptr(), dtype);
      torch::manual_seed(1);
      auto cl = make_network(spec);
      to_dtype(*cl.ptr(), dtype);
      set_memory_format(*cl.ptr(), kChannelsLast);
      EXPECT_TRUE(has_memory_format(*cl.ptr(), kChannelsLast));
      EXPECT_FALSE(has_memory_format(*plain.ptr(), kChannelsLast));
      torch::manual_seed(2);
      const at::Tensor x = input_for(spec).to(dtype);
      const at::Tensor ya = plain.forward<at::Tensor>(x), yb = cl.forward<at::Tensor>(to_memory_format(x, kChannelsLast));
      ASSERT_EQ(ya.sizes(), yb.sizes());
      if (yb.dim() == 5) EXPECT_TRUE(is_channels_last(yb));
      EXPECT_LE(max_difference(ya, yb), tolerance * (ya.abs().max().item<double>() + 1));
      const at::Tensor g = torch::randn_like(ya);
      (ya * g).sum().backward();
      (yb * g).sum().backward();
      const auto pa = plain.ptr()->named_parameters(), pb = cl.ptr()->named_parameters();
      double largest = 0;
      for (const auto& p : pa) {
        if (p.value().grad().defined()) largest = std::max(largest, p.value().grad().abs().max().item<double>());
      }
      for (const auto& p : pa) {
        const at::Tensor& ga = p.value().grad();
        const at::Tensor& gb = pb[p.key()].grad();
        ASSERT_EQ(ga.defined(), gb.defined()) << p.key();
        if (!ga.defined()) continue;
        EXPECT_LE(max_difference(ga, gb), tolerance * largest) << p.key();
      }
      plain.ptr()->eval();
      cl.ptr()->eval();
      torch::NoGradGuard no_grad;
      const at::Tensor ea = plain.forward<at::Tensor>(x), eb = cl.forward<at::Tensor>(to_memory_format(x, kChannelsLast));
      EXPECT_TRUE(is_channels_last(eb));
      EXPECT_LE(max_difference(ea, eb), tolerance * (ea.abs().max().item<double>() + 1));
    }
  }
}

// The layout at every operator the networks' code calls in a channels-last forward: no
// operator turns a channels-last input into another layout (aten::contiguous and aten::clone
// included; views, which move nothing, may: the norms and the transformer view
// [N, C, D, H, W] as [N, D, H, W, C]). libtorch's CPU convolutions may write NCDHW (libtorch
// 1.13's do): the convolution modules lay their output out channels-last again.
TEST(ChannelsLast, EveryOperatorOfEveryNetworkKeepsTheLayout) {
  torch::set_num_threads(2);
  const std::set<std::string> convolutions{"aten::conv3d", "aten::conv_transpose3d", "aten::convolution",
                                           "aten::_convolution"};
  const std::set<std::string> views{"aten::permute", "aten::reshape", "aten::view",     "aten::as_strided",
                                    "aten::narrow",  "aten::slice",   "aten::select",   "aten::unsqueeze",
                                    "aten::squeeze", "aten::expand",  "aten::transpose", "aten::alias",
                                    "aten::detach",  "aten::split",   "aten::chunk",    "aten::unbind"};
  for (const auto& spec : networks()) {
    SCOPED_TRACE(spec["name"].get<std::string>() + " " + spec.value("norm", spec.value("norm_name", "")));
    torch::manual_seed(1);
    auto net = make_network(spec);
    set_memory_format(*net.ptr(), kChannelsLast);
    torch::manual_seed(2);
    const at::Tensor x = to_memory_format(input_for(spec), kChannelsLast);
    for (const bool training : {true, false}) {
      net.ptr()->train(training);
      std::vector<test::OpRecorder::Op> ops;
      {
        test::OpRecorder recorder;
        const at::Tensor y = net.forward<at::Tensor>(x);
        if (y.dim() == 5) EXPECT_TRUE(is_channels_last(y));
        ops = recorder.ops();
      }
      ASSERT_GT(ops.size(), 10u);
      int checked = 0;
      for (const auto& op : ops) {
        if (op.depth != 1) continue;
        const bool from_channels_last =
            std::find(op.input_layouts.begin(), op.input_layouts.end(), "channels_last") != op.input_layouts.end();
        if (from_channels_last && views.count(op.name) == 0) {
          for (const auto& layout : op.layouts) {
            ++checked;
            const bool restored_conv = convolutions.count(op.name) > 0 && x.is_cpu();
            EXPECT_TRUE(layout == "channels_last" || layout == "either" || restored_conv)
                << op.name << " wrote " << layout;
          }
        }
      }
      EXPECT_GT(checked, 10);
    }
  }
}

// On a GPU: the channels-last norms against libtorch's (cuDNN's and CUDA's kernels on NCDHW),
// in float32 and in half precision (the statistics in float32), values and gradients.
TEST(ChannelsLastGpu, NormsEqualLibtorchsOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device: libtorch without CUDA, or no GPU here";
  torch::manual_seed(0);
  const at::Device cuda("cuda:0");
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const std::int64_t groups : {std::int64_t{0}, std::int64_t{4}}) {
      SCOPED_TRACE(str(c10::toString(dtype), groups == 0 ? " instance" : " group 4"));
      torch::nn::AnyModule ours, theirs;
      if (groups == 0) {
        const auto o = torch::nn::InstanceNorm3dOptions(16).affine(true);
        ours = torch::nn::AnyModule(InstanceNorm3d(o));
        theirs = torch::nn::AnyModule(torch::nn::InstanceNorm3d(o));
      } else {
        const auto o = torch::nn::GroupNormOptions(groups, 16);
        ours = torch::nn::AnyModule(GroupNorm(o));
        theirs = torch::nn::AnyModule(torch::nn::GroupNorm(o));
      }
      ours.ptr()->to(cuda);
      theirs.ptr()->to(cuda);
      {
        torch::NoGradGuard g;
        auto p = ours.ptr()->parameters(), q = theirs.ptr()->parameters();
        for (std::size_t i = 0; i < p.size(); ++i) {
          p[i].copy_(torch::randn_like(p[i]) * 0.5 + 1);
          q[i].copy_(p[i]);
        }
      }
      const at::Tensor x = (torch::randn({2, 16, 24, 20, 16}, at::TensorOptions().device(cuda)) * 3 + 1).to(dtype);
      const at::Tensor xa = x.to(at::kFloat).requires_grad_(true);  // libtorch's in float32: the reference
      const at::Tensor xb = to_memory_format(x, kChannelsLast).requires_grad_(true);
      const at::Tensor ya = theirs.forward(xa), yb = ours.forward(xb);
      EXPECT_TRUE(is_channels_last(yb));
      EXPECT_EQ(yb.scalar_type(), dtype);
      const double tolerance = dtype == at::kFloat ? 1e-4 : dtype == at::kHalf ? 1e-2 : 5e-2;
      EXPECT_LE(max_difference(ya, yb), tolerance * (ya.abs().max().item<double>() + 1));
      const at::Tensor g = torch::randn_like(ya);
      (ya * g).sum().backward();
      (yb * g.to(dtype)).sum().backward();
      EXPECT_LE(max_difference(xa.grad(), xb.grad()), 2 * tolerance * (xa.grad().abs().max().item<double>() + 1));
    }
  }
}

TEST(ChannelsLast, SetMemoryFormatRestridesTheSameTensors) {
  torch::manual_seed(0);
  auto net = make_network(networks()[0]);
  std::vector<at::Tensor> before = net.ptr()->parameters();
  std::vector<at::Tensor> values;
  for (const auto& p : before) values.push_back(p.detach().clone());
  set_memory_format(*net.ptr(), kChannelsLast);
  const std::vector<at::Tensor> after = net.ptr()->parameters();
  for (std::size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].is_same(before[i]));  // an optimizer made before holds them still
    EXPECT_TRUE(at::equal(after[i], values[i]));
    if (after[i].dim() == 5) EXPECT_TRUE(is_channels_last(after[i])) << i;
    EXPECT_TRUE(after[i].requires_grad());
  }
  set_memory_format(*net.ptr(), at::MemoryFormat::Contiguous);
  for (const auto& p : net.ptr()->parameters()) EXPECT_TRUE(p.is_contiguous());
  // One channel: both layouts are "contiguous"; the strides tell them apart.
  const at::Tensor one = torch::randn({2, 1, 4, 4, 4});
  EXPECT_FALSE(is_channels_last(one));
  EXPECT_FALSE(is_channels_last(one.contiguous(kChannelsLast)));  // at::Tensor::contiguous leaves it
  const at::Tensor restrided = to_memory_format(one, kChannelsLast);
  EXPECT_TRUE(is_channels_last(restrided));
  EXPECT_EQ(restrided.data_ptr(), one.data_ptr());  // no copy
  EXPECT_TRUE(at::equal(restrided, one));
  EXPECT_FALSE(is_channels_last(to_memory_format(restrided, at::MemoryFormat::Contiguous)));
  EXPECT_TRUE(to_memory_format(one, at::MemoryFormat::Contiguous).is_same(one));
  EXPECT_EQ(memory_format_name(kChannelsLast), "channels_last");
  EXPECT_EQ(memory_format_name(at::MemoryFormat::Contiguous), "contiguous");
}

}  // namespace
}  // namespace medfast::nn
