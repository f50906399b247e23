// The start-up self-check (nn/self_check.hpp): it passes right backends, catches an
// injected faulty op, switches the faulty backend off and checks again, and stops with
// the reason when nothing it can switch off helps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "backend_check.hpp"
#include "medfast/nn/direct_conv.hpp"
#include "medfast/train/self_check.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

constexpr const char* kOneDnn = "oneDNN (mkldnn)";
constexpr const char* kDirect = "medfast direct convolution";

/// Whether the check probes medfast's direct convolution (float32 on a CPU with AVX2 or more).
bool probes_direct(at::ScalarType dtype) {
  return dtype == at::kFloat && nn::direct_conv_isa() != "generic";
}

/// Each test leaves oneDNN as it found it and the direct convolution at its default (on, not
/// faulty): a check may switch either off for the process.
class SelfCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    mkldnn_was_ = at::globalContext().userEnabledMkldnn();
    nn::set_direct_conv(true);
    nn::set_direct_conv_faulty(false);
  }
  void TearDown() override {
    at::globalContext().setUserEnabledMkldnn(mkldnn_was_);
    nn::set_direct_conv_faulty(false);
    nn::set_direct_conv(true);
  }
  /// oneDNN on, as on a machine nothing was switched off on; skips where it is not built in.
  bool with_onednn() {
    if (!at::hasMKLDNN()) return false;
    at::globalContext().setUserEnabledMkldnn(true);
    return true;
  }
  bool mkldnn_was_ = true;
};

TEST_F(SelfCheck, RightBackendsPassEveryOpWithinItsBound) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    SelfCheckOptions o;
    o.dtype = dtype;
    const SelfCheckReport r = run_self_check(o);
    EXPECT_TRUE(r.ran);
    EXPECT_TRUE(r.passed()) << r.summary();
    EXPECT_EQ(r.device, "cpu");
    EXPECT_FALSE(r.hardware.empty());
    ASSERT_EQ(r.ops.size(), probes_direct(dtype) ? 14u : 12u);
    std::set<std::string> names;
    for (const auto& op : r.ops) {
      names.insert(op.op);
      EXPECT_TRUE(op.passed) << op.op << " " << op.backend << " " << op.max_abs_error;
      EXPECT_LE(op.worst_ratio, 1.0) << op.op;
      EXPECT_TRUE(std::isfinite(op.max_abs_error)) << op.op;
      EXPECT_FALSE(op.backend.empty()) << op.op;
    }
    for (const char* want : {"conv3d 3x3x3 stride 1", "conv3d 3x3x3 stride 2", "conv3d 1x1x1 stride 1",
                             "conv3d 1x1x1 stride 2", "conv3d 3x3x3 1->8 channels", "conv3d 3x3x3 32->32 channels",
                             "conv3d 3x3x3 backward (input)", "conv3d 3x3x3 backward (weight)",
                             "conv_transpose3d 3x3x3 stride 2", "conv_transpose3d 2x2x2 stride 2", "linear (matmul)",
                             "window attention"}) {
      EXPECT_TRUE(names.count(want)) << want;
    }
    // Nothing is switched off without a failure that made it so (a machine whose oneDNN
    // is faulty shows both: that is what the check is for).
    EXPECT_EQ(r.switched_off.empty(), r.failed_first.empty()) << r.summary();
  }
}

TEST_F(SelfCheck, BoundsAreTightEnoughToCatchSmallErrorsAndLooseEnoughForRounding) {
  // Right results perturbed by a float32 rounding error or two pass; 1% off fails.
  SelfCheckOptions o;
  o.inject = [](const std::string&, const std::string&, at::Tensor& out) {
    out.mul_(1 + 2 * std::numeric_limits<float>::epsilon());
  };
  EXPECT_TRUE(run_self_check(o).passed());
  o.inject = [](const std::string& op, const std::string&, at::Tensor& out) {
    if (op == "conv3d 3x3x3 stride 2") out.mul_(1.01);
  };
  const std::string m = test::error_of<BackendError>([&] { run_self_check(o); });
  EXPECT_NE(m.find("conv3d 3x3x3 stride 2"), std::string::npos) << m;
}

TEST_F(SelfCheck, FaultyOneDnnIsSwitchedOffAndEveryOpCheckedAgain) {
  if (!with_onednn()) GTEST_SKIP() << "this libtorch has no oneDNN to switch off";
  // As on the AMD EPYC of docs/compat.md: oneDNN's 3x3x3 convolutions return NaN.
  int calls = 0;
  SelfCheckOptions o;
  o.inject = [&](const std::string& op, const std::string& backend, at::Tensor& out) {
    ++calls;
    if (backend == kOneDnn && op.rfind("conv3d 3x3x3", 0) == 0) out.fill_(std::nan(""));
  };
  const SelfCheckReport r = run_self_check(o);
  EXPECT_EQ(calls, probes_direct(at::kFloat) ? 28 : 24);  // every op, twice
  EXPECT_TRUE(r.passed()) << r.summary();
  EXPECT_FALSE(at::globalContext().userEnabledMkldnn());
  ASSERT_EQ(r.switched_off, std::vector<std::string>{kOneDnn});
  ASSERT_EQ(r.failed_first.size(), 6u);  // strides 1 and 2, 1->8, 32->32, the backward's two
  for (const auto& f : r.failed_first) {
    EXPECT_EQ(f.backend, kOneDnn);
    EXPECT_TRUE(std::isnan(f.max_abs_error));
    EXPECT_FALSE(f.passed);
  }
  for (const auto& op : r.ops) {
    if (op.op.rfind("conv", 0) == 0) EXPECT_NE(op.backend, kOneDnn) << op.op;
  }
  const std::string s = r.summary();
  EXPECT_NE(s.find("conv3d 3x3x3 stride 1 computed by oneDNN (mkldnn) returns NaN"), std::string::npos) << s;
  EXPECT_NE(s.find("oneDNN (mkldnn) switched off for this process"), std::string::npos) << s;
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["switched_off"][0], kOneDnn);
  EXPECT_TRUE(j["failed_first"][0]["max_abs_error"].is_null());
  EXPECT_TRUE(j["passed"].get<bool>());
}

TEST_F(SelfCheck, FaultyDirectConvolutionIsSwitchedOffAndOnlyIt) {
  if (!probes_direct(at::kFloat)) {
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: the direct convolution is not used, nor checked";
  }
  // medfast's own kernel wrong (say, an instruction set the CPU mis-executes): it is switched
  // off, libtorch's kernels left on, and the networks' convolutions go back to them.
  SelfCheckOptions o;
  o.inject = [](const std::string&, const std::string& backend, at::Tensor& out) {
    if (backend.rfind(kDirect, 0) == 0) out.add_(0.5);
  };
  const bool onednn = at::globalContext().userEnabledMkldnn();
  const SelfCheckReport r = run_self_check(o);
  EXPECT_TRUE(r.passed()) << r.summary();
  EXPECT_TRUE(nn::direct_conv_faulty());
  EXPECT_FALSE(nn::direct_conv_enabled());
  nn::set_direct_conv(true);  // a later run's conv_forward: auto does not bring it back
  EXPECT_FALSE(nn::direct_conv_enabled());
  EXPECT_EQ(at::globalContext().userEnabledMkldnn(), onednn);
  ASSERT_EQ(r.switched_off, std::vector<std::string>{kDirect});
  ASSERT_EQ(r.failed_first.size(), 2u);
  for (const auto& f : r.failed_first) {
    EXPECT_EQ(f.backend.rfind(kDirect, 0), 0u) << f.backend;
    EXPECT_NE(f.backend.find(nn::direct_conv_isa()), std::string::npos) << f.backend;
  }
  EXPECT_EQ(r.ops.size(), 12u);  // checked again without it
  const std::string s = r.summary();
  EXPECT_NE(s.find("medfast direct convolution switched off for this process"), std::string::npos) << s;
}

TEST_F(SelfCheck, TheDirectConvolutionIsCheckedEvenWhileItsSettingIsOff) {
  if (!probes_direct(at::kFloat)) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
  // conv_forward: libtorch for the first run of a process, auto for a later one: the check,
  // which runs once, must have covered the kernel the later run uses.
  nn::set_direct_conv(false);
  SelfCheckOptions o;
  const SelfCheckReport r = run_self_check(o);
  EXPECT_EQ(r.ops.size(), 14u);
  EXPECT_TRUE(r.passed()) << r.summary();
}

TEST_F(SelfCheck, WrongMathNothingCanSwitchOffStopsWithTheReason) {
  const bool onednn = with_onednn();
  // A BLAS that is wrong: nothing medfast can switch off computes the linear layer.
  SelfCheckOptions o;
  o.inject = [](const std::string& op, const std::string&, at::Tensor& out) {
    if (op == "linear (matmul)") out.add_(52.8);
  };
  const std::string m = test::error_of<BackendError>([&] { run_self_check(o); });
  EXPECT_NE(m.find("linear (matmul) computed by BLAS"), std::string::npos) << m;
  EXPECT_NE(m.find("is off by up to 52.8"), std::string::npos) << m;
  EXPECT_NE(m.find("on cpu ("), std::string::npos) << m;
  EXPECT_NE(m.find("MEDFAST_SELF_CHECK=off"), std::string::npos) << m;
  EXPECT_EQ(m.find("switched off"), std::string::npos) << m;
  EXPECT_EQ(at::globalContext().userEnabledMkldnn(), onednn);  // not implicated: left on

  // A convolution wrong on every backend: oneDNN is switched off, the ops checked again,
  // and the check stops saying that it stayed wrong.
  if (!onednn) return;
  o.inject = [](const std::string& op, const std::string&, at::Tensor& out) {
    if (op == "conv_transpose3d 2x2x2 stride 2") out.zero_();
  };
  const std::string m2 = test::error_of<BackendError>([&] { run_self_check(o); });
  EXPECT_NE(m2.find("conv_transpose3d 2x2x2 stride 2 computed by ATen"), std::string::npos) << m2;
  EXPECT_NE(m2.find("stays wrong with oneDNN (mkldnn) switched off"), std::string::npos) << m2;
}

TEST_F(SelfCheck, AnOpThatThrowsFailsWithItsMessage) {
  SelfCheckOptions o;
  o.inject = [](const std::string& op, const std::string&, at::Tensor& out) {
    if (op == "window attention") out = out.narrow(-1, 0, 3);  // a wrong shape
  };
  const std::string m = test::error_of<BackendError>([&] { run_self_check(o); });
  EXPECT_NE(m.find("window attention computed by"), std::string::npos) << m;
  EXPECT_NE(m.find("failed: shape"), std::string::npos) << m;
  o.dtype = at::kInt;
  EXPECT_THROW(run_self_check(o), ValueError);
}

TEST_F(SelfCheck, OncePerProcessDeviceAndDtype) {
  // The environment of this binary checked cpu/float32 before any test ran.
  const SelfCheckReport a = ensure_backends_checked(c10::Device(c10::kCPU), at::kFloat);
  const SelfCheckReport b = ensure_backends_checked(c10::Device(c10::kCPU), at::kFloat);
  EXPECT_EQ(a.seconds, b.seconds);  // the same report, not a second run
  EXPECT_TRUE(a.ran);
  bool listed = false;
  for (const auto& r : backend_reports()) listed = listed || (r.device == "cpu" && r.dtype == "float32");
  EXPECT_TRUE(listed);
  const SelfCheckReport off = ensure_backends_checked(c10::Device(c10::kCPU), at::kBFloat16, /*enabled=*/false);
  EXPECT_FALSE(off.ran);
  EXPECT_TRUE(off.ops.empty());
  EXPECT_NE(off.summary().find("not checked (self_check is off)"), std::string::npos);
}

TEST(SelfCheckGpu, CudaBackendsPassInEveryTrainingDtype) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device: libtorch without CUDA, or no GPU here";
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    SelfCheckOptions o;
    o.device = c10::Device(c10::kCUDA);
    o.dtype = dtype;
    const SelfCheckReport r = run_self_check(o);
    EXPECT_TRUE(r.passed()) << r.summary();
    EXPECT_EQ(r.device, "cuda:0");
    EXPECT_TRUE(r.switched_off.empty()) << r.summary();
    for (const auto& op : r.ops) EXPECT_LE(op.worst_ratio, 1.0) << op.op << " " << op.backend;
  }
}

}  // namespace
}  // namespace medfast::train
