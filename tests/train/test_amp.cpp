// Mixed precision: the `amp:` value, AutocastGuard on the CPU (bf16), and the
// GradScaler against a simulation of torch's update rule in
// tests/golden/make_optim_golden.py.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/train/amp.hpp"
#include "golden_set.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

// ---------------------------------------------------------------------------
// parse_precision

TEST(AmpPrecision, ParsesTheAmpValue) {
  using nlohmann::json;
  EXPECT_EQ(parse_precision(true, /*cuda=*/true), Precision::fp16);
  EXPECT_EQ(parse_precision(true, /*cuda=*/false), Precision::bf16);
  EXPECT_EQ(parse_precision(false, true), Precision::fp32);
  EXPECT_EQ(parse_precision(false, false), Precision::fp32);
  EXPECT_EQ(parse_precision("fp16", true), Precision::fp16);
  EXPECT_EQ(parse_precision("bf16", true), Precision::bf16);
  EXPECT_EQ(parse_precision("BF16", false), Precision::bf16);
  EXPECT_EQ(parse_precision("fp32", false), Precision::fp32);
  for (auto p : {Precision::fp32, Precision::fp16, Precision::bf16}) {
    EXPECT_EQ(parse_precision(precision_name(p), true), p);
  }
  EXPECT_EQ(precision_name(Precision::bf16), "bf16");
  EXPECT_EQ(precision_dtype(Precision::fp16), at::kHalf);
  EXPECT_EQ(precision_dtype(Precision::bf16), at::kBFloat16);
  EXPECT_EQ(precision_dtype(Precision::fp32), at::kFloat);
}

TEST(AmpPrecision, ErrorsByMessage) {
  using nlohmann::json;
  EXPECT_EQ(error_of([] { parse_precision("fp16", false); }),
            "amp: fp16 needs CUDA (autocast on the CPU runs bf16 only in libtorch 1.13); use bf16");
  EXPECT_EQ(error_of([] { parse_precision("fp8", true, "train.yaml: train.amp"); }),
            "train.yaml: train.amp: unknown precision 'fp8' (expected true, false, fp16, bf16 or fp32)");
  EXPECT_EQ(error_of([] { parse_precision(3, true); }), "amp: expected true, false, fp16, bf16 or fp32, got 3");
  EXPECT_EQ(error_of([] { parse_precision(json(), true); }), "amp: expected true, false, fp16, bf16 or fp32, got null");
  EXPECT_THROW(parse_precision("half", true), ValueError);
}

// ---------------------------------------------------------------------------
// AutocastGuard

TEST(AmpAutocast, CpuBf16CastsMatmulAndConv3dInsideOnly) {
  torch::manual_seed(11);
  const auto a = torch::randn({4, 8}), b = torch::randn({8, 3});
  const auto x = torch::randn({1, 2, 6, 6, 6}), w = torch::randn({4, 2, 3, 3, 3});
  at::Tensor inside;
  {
    AutocastGuard autocast(c10::kCPU, Precision::bf16);
    EXPECT_TRUE(autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::conv3d(x, w).scalar_type(), at::kBFloat16);
    // Ops outside the lower-precision list keep fp32.
    EXPECT_EQ((a + 1).scalar_type(), at::kFloat);
    inside = at::matmul(a, b);
  }
  // The product of the bf16-rounded inputs, to bf16's 8 bits of mantissa: each term and
  // the sum may be rounded, so the bound scales with sum |a||b| (not with the result,
  // which cancellation can make small).
  const auto ra = a.to(at::kBFloat16).to(at::kFloat), rb = b.to(at::kBFloat16).to(at::kFloat);
  const auto reference = at::matmul(ra, rb);
  const auto bound = at::matmul(ra.abs(), rb.abs()) * std::ldexp(1.0, -6) + 1e-6;
  EXPECT_TRUE(((inside.to(at::kFloat) - reference).abs() <= bound).all().item<bool>())
      << inside << reference;
  EXPECT_FALSE(autocast_enabled(c10::kCPU));
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  EXPECT_EQ(at::conv3d(x, w).scalar_type(), at::kFloat);
}

TEST(AmpAutocast, NestingRestoresThePreviousState) {
  const auto a = torch::randn({4, 4});
  ASSERT_FALSE(autocast_enabled(c10::kCPU));
  {
    AutocastGuard outer(c10::kCPU, Precision::bf16);
    {
      AutocastGuard inner(c10::kCPU, Precision::bf16);
      EXPECT_EQ(at::mm(a, a).scalar_type(), at::kBFloat16);
      {
        AutocastGuard none(c10::kCPU, Precision::fp32);  // a no-op: the enclosing region stays
        EXPECT_EQ(at::mm(a, a).scalar_type(), at::kBFloat16);
      }
    }
    EXPECT_TRUE(autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::mm(a, a).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(autocast_enabled(c10::kCPU));
  EXPECT_EQ(autocast_dtype(c10::kCPU), at::kBFloat16);  // libtorch's default, left as found
  EXPECT_EQ(at::mm(a, a).scalar_type(), at::kFloat);

  // Unwinding restores too.
  try {
    AutocastGuard g(c10::kCPU, Precision::bf16);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(autocast_enabled(c10::kCPU));
}

TEST(AmpAutocast, Fp16OnCpuIsAnError) {
  EXPECT_EQ(error_of([] { AutocastGuard g(c10::kCPU, Precision::fp16); }),
            "autocast: CPU autocast supports bf16 only in libtorch 1.13 (got fp16)");
  EXPECT_FALSE(autocast_enabled(c10::kCPU));
  EXPECT_THROW(AutocastGuard(c10::kMeta, Precision::bf16), ValueError);
}

TEST(AmpAutocastGpu, CudaFp16) {
  MEDFAST_REQUIRE_CUDA();
  const auto a = torch::randn({4, 4}, torch::kCUDA);
  {
    AutocastGuard autocast(c10::kCUDA, Precision::fp16);
    EXPECT_EQ(at::mm(a, a).scalar_type(), at::kHalf);
  }
  EXPECT_EQ(at::mm(a, a).scalar_type(), at::kFloat);
}

// ---------------------------------------------------------------------------
// GradScaler

/// A parameter and a loss whose gradient is `w`: loss = sum(p * w).
struct Toy {
  at::Tensor p, w;
  std::unique_ptr<torch::optim::Optimizer> opt;
  explicit Toy(at::Device device = at::kCPU, double momentum = 0.0) {
    p = torch::tensor({1.0f, -2.0f, 3.0f, 0.5f}, torch::TensorOptions().device(device)).requires_grad_(true);
    w = torch::tensor({0.25f, 1.0f, -0.5f, 2.0f}, torch::TensorOptions().device(device));
    opt = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{p},
                                              torch::optim::SGDOptions(0.1).momentum(momentum));
  }
  /// One training iteration; `overflow` puts an inf into the gradient as an fp16 overflow would.
  bool iterate(GradScaler& scaler, bool overflow = false) {
    opt->zero_grad();
    scaler.scale((p * w).sum()).backward();
    if (overflow) p.mutable_grad()[1] = std::numeric_limits<float>::infinity();
    const bool stepped = scaler.step(*opt);
    scaler.update();
    return stepped;
  }
};

TEST(GradScalerTest, ScaleMultipliesAndUnscaleDivides) {
  GradScaler scaler;
  EXPECT_TRUE(scaler.enabled());
  EXPECT_EQ(scaler.scale_value(), GradScalerOptions{}.init_scale);
  const auto loss = torch::tensor(3.0f);
  const auto scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.dim(), 0);
  EXPECT_EQ(scaled.item<float>(), 3.0f * 65536.0f);

  Toy t;
  t.opt->zero_grad();
  scaler.scale((t.p * t.w).sum()).backward();
  EXPECT_TRUE(at::equal(t.p.grad(), t.w * 65536.0f));
  scaler.unscale(*t.opt);
  EXPECT_TRUE(at::equal(t.p.grad(), t.w));
  EXPECT_EQ(error_of([&] { scaler.unscale(*t.opt); }),
            "GradScaler: unscale() has already been called on this optimizer since the last update()");
  const auto before = t.p.detach().clone();
  EXPECT_TRUE(scaler.step(*t.opt));  // no second unscale inside
  EXPECT_TRUE(at::allclose(t.p.detach(), before - 0.1 * t.w));
  EXPECT_EQ(error_of([&] { scaler.unscale(*t.opt); }), "GradScaler: unscale() is being called after step()");
  EXPECT_EQ(error_of([&] { scaler.step(*t.opt); }), "GradScaler: step() has already been called since the last update()");
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.scale_value(), 65536.0);
  EXPECT_EQ(error_of([&] { scaler.update(); }),
            "GradScaler: no inf checks were recorded prior to update() (call step(opt) first)");
}

TEST(GradScalerTest, NonFiniteGradientSkipsTheStepAndBacksOff) {
  GradScaler scaler(GradScalerOptions{1024.0, 2.0, 0.5, 100, true});
  Toy t(at::kCPU, /*momentum=*/0.9);
  ASSERT_TRUE(t.iterate(scaler));  // creates the momentum buffer
  const auto params = t.p.detach().clone();
  ASSERT_EQ(t.opt->state().size(), 1u);
  const auto buffer =
      static_cast<const torch::optim::SGDParamState&>(*t.opt->state().begin()->second).momentum_buffer().clone();
  EXPECT_EQ(scaler.growth_tracker(), 1);

  EXPECT_FALSE(t.iterate(scaler, /*overflow=*/true));
  EXPECT_TRUE(at::equal(t.p.detach(), params));
  EXPECT_TRUE(at::equal(
      static_cast<const torch::optim::SGDParamState&>(*t.opt->state().begin()->second).momentum_buffer(), buffer));
  EXPECT_EQ(scaler.scale_value(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);

  // NaN counts too, and a clean iteration steps again.
  t.opt->zero_grad();
  scaler.scale((t.p * t.w).sum()).backward();
  t.p.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.step(*t.opt));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 256.0);
  EXPECT_TRUE(t.iterate(scaler));
  EXPECT_FALSE(at::equal(t.p.detach(), params));
}

// The trainer's form: found_inf read by the caller (with the loss, in one host read),
// then step(opt, clean) without a read of its own; the same skip and back-off.
TEST(GradScalerTest, CallerReadFlagStepsAsStepDoes) {
  GradScaler scaler(GradScalerOptions{1024.0, 2.0, 0.5, 100, true});
  Toy t;
  EXPECT_EQ(error_of([&] { scaler.found_inf(*t.opt); }), "GradScaler: found_inf(opt) needs unscale(opt) first");
  t.opt->zero_grad();
  scaler.scale((t.p * t.w).sum()).backward();
  EXPECT_EQ(error_of([&] { scaler.step(*t.opt, true); }), "GradScaler: step(opt, clean) needs unscale(opt) first, once");
  scaler.unscale(*t.opt);
  EXPECT_EQ(scaler.found_inf(*t.opt).item<float>(), 0.0f);
  const auto before = t.p.detach().clone();
  EXPECT_TRUE(scaler.step(*t.opt, scaler.found_inf(*t.opt).item<float>() == 0));
  EXPECT_TRUE(at::allclose(t.p.detach(), before - 0.1 * t.w));
  EXPECT_EQ(error_of([&] { scaler.step(*t.opt, true); }), "GradScaler: step(opt, clean) needs unscale(opt) first, once");
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);

  t.opt->zero_grad();
  scaler.scale((t.p * t.w).sum()).backward();
  t.p.mutable_grad()[2] = std::numeric_limits<float>::infinity();
  scaler.unscale(*t.opt);
  const bool clean = scaler.found_inf(*t.opt).item<float>() == 0;
  EXPECT_FALSE(clean);
  const auto params = t.p.detach().clone();
  EXPECT_FALSE(scaler.step(*t.opt, clean));
  scaler.update();
  EXPECT_TRUE(at::equal(t.p.detach(), params));
  EXPECT_EQ(scaler.scale_value(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScalerTest, GrowsAfterGrowthIntervalCleanSteps) {
  GradScaler scaler(GradScalerOptions{8.0, 2.0, 0.5, 3, true});
  Toy t;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(t.iterate(scaler));
  EXPECT_EQ(scaler.scale_value(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  ASSERT_TRUE(t.iterate(scaler));
  EXPECT_EQ(scaler.scale_value(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);

  // A growth that would overflow float32 is not taken (the scaled gradients, at most 2^127, stay finite).
  GradScaler top(GradScalerOptions{std::ldexp(1.0, 126), 4.0, 0.5, 1, true});
  Toy u;
  ASSERT_TRUE(u.iterate(top));
  EXPECT_EQ(top.scale_value(), std::ldexp(1.0, 126));
  EXPECT_EQ(top.growth_tracker(), 0);
}

/// Replays the script's overflow pattern and compares the scale after every update().
void replay_golden(at::Device device) {
  const auto cases = test::GoldenSet::of("make_optim_golden.py").manifest()["grad_scaler"];
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["options"].dump());
    const auto& o = c["options"];
    GradScaler scaler(GradScalerOptions{o["init_scale"].get<double>(), o["growth_factor"].get<double>(), o["backoff_factor"].get<double>(),
                                        o["growth_interval"].get<std::int64_t>(), true});
    Toy t(device);
    const auto overflow = c["overflow"].get<std::vector<int>>();
    for (int it = 0; it < c["iterations"].get<int>(); ++it) {
      const bool inf = std::find(overflow.begin(), overflow.end(), it) != overflow.end();
      ASSERT_EQ(t.iterate(scaler, inf), c["stepped"][it].get<bool>()) << "iteration " << it;
      ASSERT_EQ(scaler.scale_value(), c["scales"][it].get<double>()) << "iteration " << it;
      ASSERT_EQ(scaler.growth_tracker(), c["growth_trackers"][it].get<std::int64_t>()) << "iteration " << it;
    }
  }
}

TEST(GradScalerTest, ScaleSequenceMatchesTorchUpdateRule) { replay_golden(at::kCPU); }

TEST(GradScalerGpu, CudaFusedKernelsMatchTheUpdateRule) {
  MEDFAST_REQUIRE_CUDA();
  replay_golden(at::kCUDA);
}

TEST(GradScalerTest, StateRoundTrips) {
  GradScaler scaler(GradScalerOptions{1000.0, 1.5, 0.25, 4, true});
  Toy t;
  t.iterate(scaler, true);
  t.iterate(scaler);
  t.iterate(scaler);
  const auto s = scaler.state();
  EXPECT_EQ(s["scale"].get<double>(), 250.0);
  EXPECT_EQ(s["_growth_tracker"].get<std::int64_t>(), 2);
  EXPECT_EQ(s["growth_factor"].get<double>(), 1.5);
  EXPECT_EQ(s["backoff_factor"].get<double>(), 0.25);
  EXPECT_EQ(s["growth_interval"].get<std::int64_t>(), 4);

  // Into a fresh scaler (before its first scale()) and into a used one.
  GradScaler fresh;
  fresh.load_state(nlohmann::json::parse(s.dump()));
  EXPECT_EQ(fresh.state(), s);
  GradScaler used;
  Toy u;
  u.iterate(used);
  used.load_state(s);
  EXPECT_EQ(used.state(), s);
  // Both continue as the original: two more clean steps reach the interval of 4.
  for (GradScaler* g : {&scaler, &fresh, &used}) {
    Toy v;
    v.iterate(*g);
    v.iterate(*g);
    EXPECT_EQ(g->scale_value(), 375.0);
    EXPECT_EQ(g->growth_tracker(), 0);
  }
  EXPECT_EQ(error_of([&] { fresh.load_state(nlohmann::json::object()); }),
            "GradScaler state: empty, possibly because it was saved from a disabled GradScaler");
  auto missing = s;
  missing.erase("_growth_tracker");
  EXPECT_EQ(error_of([&] { fresh.load_state(missing); }),
            "GradScaler state: '_growth_tracker' missing or not a whole number (got null)");
  auto bad = s;
  bad["growth_factor"] = 0.5;
  EXPECT_EQ(error_of([&] { fresh.load_state(bad); }), "GradScaler: growth_factor must be > 1 (got 0.5)");
}

TEST(GradScalerTest, DisabledPassesThrough) {
  GradScaler scaler(GradScalerOptions{1024.0, 2.0, 0.5, 1, false});
  EXPECT_FALSE(scaler.enabled());
  const auto loss = torch::tensor(2.0f);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  EXPECT_EQ(scaler.scale_value(), 1.0);
  EXPECT_EQ(scaler.state(), nlohmann::json::object());
  scaler.load_state(nlohmann::json::object());  // a no-op, as torch's
  Toy t;
  const auto before = t.p.detach().clone();
  EXPECT_TRUE(t.iterate(scaler));
  EXPECT_TRUE(at::allclose(t.p.detach(), before - 0.1 * t.w));
  scaler.update();  // nothing recorded, nothing to complain about
}

TEST(GradScalerTest, OptionsAreValidated) {
  EXPECT_EQ(error_of([] { GradScaler g(GradScalerOptions{65536.0, 1.0, 0.5, 2000, true}); }),
            "GradScaler: growth_factor must be > 1 (got 1)");
  EXPECT_EQ(error_of([] { GradScaler g(GradScalerOptions{65536.0, 2.0, 1.0, 2000, true}); }),
            "GradScaler: backoff_factor must be in (0, 1) (got 1)");
  EXPECT_EQ(error_of([] { GradScaler g(GradScalerOptions{0.0, 2.0, 0.5, 2000, true}); }),
            "GradScaler: init_scale must be a positive number (got 0)");
  EXPECT_EQ(error_of([] { GradScaler g(GradScalerOptions{65536.0, 2.0, 0.5, 0, true}); }),
            "GradScaler: growth_interval must be >= 1 (got 0)");
  GradScaler unused;
  Toy t;
  EXPECT_EQ(error_of([&] { unused.unscale(*t.opt); }),
            "GradScaler: unscale() before any scale(loss) in this iteration");
  // fp16 gradients: torch refuses to unscale them (the master weights must stay fp32).
  auto h = torch::ones({2}, torch::TensorOptions().dtype(at::kHalf)).requires_grad_(true);
  torch::optim::SGD opt({h}, 0.1);
  GradScaler scaler;
  scaler.scale(torch::tensor(1.0f));
  h.mutable_grad() = torch::ones({2}, at::kHalf);
  EXPECT_THROW(scaler.unscale(opt), ValueError);
}

}  // namespace
}  // namespace medfast::train
