// Sliding-window inference: values, window positions and predictor calls against
// tests/golden/make_inference_golden.py (an independent statement of MONAI 1.3's
// sliding_window_inference), the importance map, options and their errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/metrics.hpp"
#include "golden_set.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

// float32 results against a float64 reference.
constexpr double kTolerance = 1e-5;

double max_rel_diff(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want.to(at::kDouble)).abs() / (want.to(at::kDouble).abs() + 1.0)).max().item<double>();
}

template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  const std::string m = test::value_error_of(std::forward<Fn>(fn));
  EXPECT_NE(m.find(needle), std::string::npos) << m;
}

class SlidingWindowGolden : public ::testing::Test {
 protected:
  static const test::GoldenSet& golden() { return test::GoldenSet::of("make_inference_golden.py"); }
  static at::Tensor load(const nlohmann::json& entry) { return golden().tensor(entry); }

  static Predictor predictor_of(const std::string& name) {
    if (name == "identity") return [](const at::Tensor& t) { return t.clone(); };
    const at::Tensor w = load(golden().manifest()["conv_weight"]), b = load(golden().manifest()["conv_bias"]);
    return [w, b](const at::Tensor& t) { return at::conv3d(t, w, b, 1, 1); };
  }

  const nlohmann::json& manifest_ = golden().manifest();
};

TEST_F(SlidingWindowGolden, ImportanceMapEqualsTheReference) {
  ASSERT_GE(manifest_["importance"].size(), 5u);
  for (const auto& m : manifest_["importance"]) {
    SCOPED_TRACE(m.dump());
    const auto roi = m["roi_size"].get<std::vector<std::int64_t>>();
    const at::Tensor got = importance_map(roi, parse_choice<BlendMode>(m["mode"].get<std::string>()).value(), m["sigma_scale"].get<double>(), at::kCPU);
    const at::Tensor want = load(m);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    ASSERT_EQ(got.sizes().vec(), want.sizes().vec());
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-6);
  }
  // Not normalised: 1 at the centre of an odd window; the floor of 1e-3 is reached with a narrow sigma.
  EXPECT_FLOAT_EQ(importance_map({9, 1, 5}, BlendMode::gaussian, 0.125, at::kCPU)[4][0][2].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(importance_map({3, 4, 6}, BlendMode::gaussian, 0.05, at::kCPU).min().item<float>(), 1e-3f);
}

TEST_F(SlidingWindowGolden, MatchesTheReferenceOnEveryCase) {
  ASSERT_GE(manifest_["cases"].size(), 10u);
  for (const auto& c : manifest_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>() + " " + c["options"].dump());
    const auto options = SlidingWindowOptions::from_json(c["options"]);
    const at::Tensor input = load(c["input"]), want = load(c["output"]);
    const Predictor inner = predictor_of(c["predictor"].get<std::string>());
    std::vector<std::int64_t> calls;
    const Predictor counting = [&](const at::Tensor& t) {
      calls.push_back(t.size(0));
      return inner(t);
    };
    const at::Tensor got = sliding_window_inference(input, counting, options);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    ASSERT_EQ(got.sizes().vec(), want.sizes().vec());
    EXPECT_LT(max_rel_diff(got, want), kTolerance);
    EXPECT_EQ(calls, c["calls"].get<std::vector<std::int64_t>>());  // groups of sw_batch_size, across images
    if (c["predictor"] == "identity") EXPECT_LT((got - input).abs().max().item<double>(), kTolerance);
  }
}

TEST_F(SlidingWindowGolden, WindowsAreVisitedAtMonaisPositionsInMonaisOrder) {
  // The input holds each voxel's (image, x, y, z) code, so a window's first voxel names its start.
  int checked = 0;
  for (const auto& c : manifest_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto shape = c["input"]["shape"].get<std::vector<std::int64_t>>();
    auto options = SlidingWindowOptions::from_json(c["options"]);
    bool padded = false;
    for (int d = 0; d < 3; ++d) padded = padded || options.roi_size[d] > shape[2 + d];
    if (padded) continue;  // positions are in padded coordinates there
    const std::int64_t b = shape[0], x = shape[2], y = shape[3], z = shape[4];
    const at::Tensor code = at::arange(b * x * y * z, at::kFloat).view({b, 1, x, y, z});
    std::vector<std::vector<std::int64_t>> seen;  // image, x, y, z
    const Predictor record = [&](const at::Tensor& t) {
      for (std::int64_t i = 0; i < t.size(0); ++i) {
        auto v = static_cast<std::int64_t>(t[i][0][0][0][0].item<float>());
        seen.push_back({v / (x * y * z), v / (y * z) % x, v / z % y, v % z});
      }
      return t;
    };
    sliding_window_inference(code, record, options);
    const auto windows = c["windows"].get<std::vector<std::vector<std::int64_t>>>();
    ASSERT_EQ(seen.size(), windows.size() * static_cast<std::size_t>(b));
    for (std::size_t i = 0; i < seen.size(); ++i) {
      const auto& w = windows[i % windows.size()];
      EXPECT_EQ(seen[i], (std::vector<std::int64_t>{static_cast<std::int64_t>(i / windows.size()), w[0], w[1], w[2]}))
          << "window " << i;
    }
    ++checked;
  }
  EXPECT_GE(checked, 6);
}

TEST(SlidingWindow, HalfPrecisionPredictionsGiveFloat32) {
  const at::Tensor input = at::randn({1, 1, 13, 10, 9});
  SlidingWindowOptions o;
  o.roi_size = {6, 6, 6};
  o.mode = BlendMode::gaussian;
  const at::Tensor out = sliding_window_inference(
      input, [](const at::Tensor& t) { return t.to(at::kHalf); }, o);
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_LT((out - input).abs().max().item<double>(), 5e-3);  // half's rounding of N(0, 1) values
}

TEST(SlidingWindow, PredictorMayChangeTheChannelCount) {
  const at::Tensor input = at::randn({2, 3, 11, 7, 9});
  SlidingWindowOptions o;
  o.roi_size = {5, 4, 4};
  o.overlap = 0.5;
  const at::Tensor out = sliding_window_inference(
      input, [](const at::Tensor& t) { return t.sum(1, /*keepdim=*/true); }, o);
  ASSERT_EQ(out.sizes().vec(), (std::vector<std::int64_t>{2, 1, 11, 7, 9}));
  EXPECT_LT((out - input.sum(1, true)).abs().max().item<double>(), 1e-5);
}

TEST(SlidingWindow, RoiEntriesBelowOneTakeTheInputSize) {
  const at::Tensor input = at::randn({1, 1, 10, 8, 6});
  SlidingWindowOptions o;
  o.roi_size = {4, 0, -1};
  o.device = "cpu";
  std::vector<std::int64_t> window_shape;
  const at::Tensor out = sliding_window_inference(
      input,
      [&](const at::Tensor& t) {
        window_shape = t.sizes().vec();
        return t * 2;
      },
      o);
  EXPECT_EQ(window_shape, (std::vector<std::int64_t>{3, 1, 4, 8, 6}));  // starts 0, 3, 6
  EXPECT_TRUE(out.device().is_cpu());
  EXPECT_LT((out - 2 * input).abs().max().item<double>(), 1e-5);
}

// The labels computed slab by slab equal those of the whole output: padding on some axes,
// batches of windows that cross rows and images, gaussian and constant blending, argmax and
// sigmoid, 2 and 3 spatial axes, a window as long as the first axis; NaN counted.
TEST(SlidingWindow, LabelsSlabBySlabEqualThoseOfTheWholeOutput) {
  at::manual_seed(7);
  const at::Tensor w3 = at::randn({3, 1, 3, 3, 3}), b3 = at::randn({3});
  const Predictor conv = [&](const at::Tensor& t) { return at::conv3d(t, w3, b3, 1, 1); };
  const Predictor any_dims = [](const at::Tensor& t) { return at::cat({t, t * t - 0.5, -t}, 1); };
  struct Case {
    std::vector<std::int64_t> shape, roi;
    double overlap;
    BlendMode mode;
    PadMode padding;
    std::int64_t sw;
    bool sigmoid;
  };
  const std::vector<Case> cases{
      {{2, 1, 23, 17, 11}, {8, 6, 5}, 0.5, BlendMode::gaussian, PadMode::constant, 3, false},
      {{1, 1, 5, 30, 9}, {8, 8, 8}, 0.25, BlendMode::constant, PadMode::replicate, 1, false},
      {{2, 1, 19, 9, 7}, {-1, 4, 4}, 0.5, BlendMode::gaussian, PadMode::constant, 5, true},
      {{1, 1, 31, 12, 6}, {7, 12, 6}, 0.0, BlendMode::gaussian, PadMode::constant, 2, false},
      {{1, 1, 26, 13}, {8, 8}, 0.6, BlendMode::gaussian, PadMode::reflect, 4, false},
  };
  for (const Case& c : cases) {
    SlidingWindowOptions o;
    o.roi_size = c.roi;
    o.overlap = c.overlap;
    o.mode = c.mode;
    o.padding_mode = c.padding;
    o.sw_batch_size = c.sw;
    const at::Tensor input = at::randn(c.shape);
    const Predictor& predict = c.shape.size() == 5 && !c.sigmoid ? conv : any_dims;
    SCOPED_TRACE(str("shape ", at::IntArrayRef(c.shape), " roi ", at::IntArrayRef(c.roi)));
    const at::Tensor want = predicted_labels(sliding_window_inference(input, predict, o), c.sigmoid);
    // Finished a few MiB at a time (the default) and one row at a time.
    for (const std::int64_t finish_bytes : {std::int64_t{16} << 20, std::int64_t{1}}) {
      const SlidingWindowLabels got = sliding_window_labels(input, predict, o, c.sigmoid, finish_bytes);
      EXPECT_EQ(got.labels.scalar_type(), at::kByte);
      ASSERT_EQ(got.labels.sizes(), want.sizes());
      EXPECT_TRUE(at::equal(got.labels, want)) << "finish_bytes " << finish_bytes;
      EXPECT_EQ(got.nonfinite, 0);
    }
  }
  // A window that returns NaN: every value it touched counts, as in the whole output.
  SlidingWindowOptions o;
  o.roi_size = {4, 4, 4};
  o.overlap = 0.5;
  int calls = 0;
  const Predictor nan_once = [&](const at::Tensor& t) {
    at::Tensor y = at::cat({t, -t}, 1);
    if (calls++ == 2) y[0][1][1][1][1] = std::numeric_limits<float>::quiet_NaN();
    return y;
  };
  const at::Tensor input = at::randn({1, 1, 10, 8, 6});
  const std::int64_t whole = (~at::isfinite(sliding_window_inference(input, nan_once, o))).sum().item<std::int64_t>();
  calls = 0;
  EXPECT_GT(whole, 0);
  EXPECT_EQ(sliding_window_labels(input, nan_once, o, false).nonfinite, whole);
  calls = 0;
  EXPECT_EQ(sliding_window_labels(input, nan_once, o, false, 1).nonfinite, whole);
  // The labels follow torch.argmax there too: NaN counts as the largest, and of equal maxima
  // the first class wins (classes 1 and 2 tie wherever t > 0).
  calls = 0;
  const at::Tensor with_nan = predicted_labels(sliding_window_inference(input, nan_once, o), false);
  calls = 0;
  EXPECT_TRUE(at::equal(sliding_window_labels(input, nan_once, o, false).labels, with_nan));
  const Predictor ties = [](const at::Tensor& t) { return at::cat({at::zeros_like(t), t, t}, 1); };
  const at::Tensor tied = predicted_labels(sliding_window_inference(input, ties, o), false);
  EXPECT_GT(tied.eq(1).sum().item<std::int64_t>(), 0);
  EXPECT_EQ(tied.eq(2).sum().item<std::int64_t>(), 0);
  EXPECT_TRUE(at::equal(sliding_window_labels(input, ties, o, false).labels, tied));
}

// Test-time augmentation (issue 26): flips is the mean of the predictor over every mirror
// image, each flipped back (nnU-Net's mirroring), computed here independently in float64;
// the mirrored copies of a window share a forward batch of the caller's size.
TEST(TestTimeAugmentation, FlipsAverageEveryMirrorImageFlippedBack) {
  at::manual_seed(11);
  const at::Tensor w = at::randn({2, 1, 3, 3, 3}), b = at::randn({2});
  const auto conv = [&](const at::Tensor& t) { return at::conv3d(t, w.to(t.scalar_type()), b.to(t.scalar_type()), 1, 1); };
  std::vector<at::Tensor> calls;
  const Predictor recording = [&](const at::Tensor& t) {
    calls.push_back(t.clone());
    return conv(t);
  };
  const at::Tensor x = at::randn({3, 1, 6, 5, 4});
  const at::Tensor got = with_tta(recording, Tta::flips)(x);
  // Independently: sum over the 8 subsets of {2, 3, 4} of flip(conv(flip(x))), in float64.
  const at::Tensor xd = x.to(at::kDouble);
  at::Tensor want = at::zeros({3, 2, 6, 5, 4}, at::kDouble);
  for (int m = 0; m < 8; ++m) {
    std::vector<std::int64_t> axes;
    for (int d = 0; d < 3; ++d) {
      if (m & (1 << d)) axes.push_back(2 + d);
    }
    want += axes.empty() ? conv(xd) : conv(xd.flip(axes)).flip(axes);
  }
  want /= 8;
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT(max_rel_diff(got, want), 1e-5);
  // 8 calls of 3 windows: the first holds window 0 as it is, flipped along X, along Y, along both.
  ASSERT_EQ(calls.size(), 8u);
  for (const auto& c : calls) EXPECT_EQ(c.size(0), 3);
  EXPECT_TRUE(at::equal(calls[0][0], x[0]));
  EXPECT_TRUE(at::equal(calls[0][1], x[0].flip({1})));
  EXPECT_TRUE(at::equal(calls[0][2], x[0].flip({2})));
  EXPECT_TRUE(at::equal(calls[1][0], x[0].flip({1, 2})));
  EXPECT_TRUE(at::equal(calls[7][2], x[2].flip({1, 2, 3})));
  EXPECT_EQ(tta_forwards(Tta::flips, 3), 8);
  EXPECT_EQ(tta_forwards(Tta::none, 3), 1);

  // A predictor that commutes with mirroring gives its own output; none is the predictor itself.
  const Predictor pointwise = [](const at::Tensor& t) { return at::cat({t * 2 + 1, -t}, 1); };
  EXPECT_LT((with_tta(pointwise, Tta::flips)(x) - pointwise(x)).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(at::equal(with_tta(pointwise, Tta::none)(x), pointwise(x)));
  // Through the sliding window, in 2D too; half-precision outputs are averaged in float32.
  SlidingWindowOptions o;
  o.roi_size = {4, 4};
  o.overlap = 0.5;
  o.sw_batch_size = 3;
  const at::Tensor x2 = at::randn({1, 1, 9, 7});
  const at::Tensor sw = sliding_window_inference(x2, with_tta([](const at::Tensor& t) { return (t * 3).to(at::kHalf); }, Tta::flips), o);
  EXPECT_LT((sw - 3 * x2).abs().max().item<double>(), 1e-2);
  // A predictor returning the wrong batch is named by the sliding window, not hidden.
  expect_error([&] { sliding_window_inference(x2, with_tta([](const at::Tensor& t) { return t.narrow(0, 0, 1); }, Tta::flips), o); },
               "the predictor returned");
}

TEST(SlidingWindow, BadOptionsThrowValueErrorNamingTheArgumentAndValue) {
  const at::Tensor input = at::randn({1, 1, 6, 6, 6});
  const Predictor identity = [](const at::Tensor& t) { return t; };
  const auto with = [&](const std::function<void(SlidingWindowOptions&)>& change) {
    SlidingWindowOptions o;
    o.roi_size = {4, 4, 4};
    change(o);
    return [&input, &identity, o] { sliding_window_inference(input, identity, o); };
  };
  expect_error(with([](auto& o) { o.overlap = 1.0; }), "overlap 1 ");
  expect_error(with([](auto& o) { o.overlap = -0.25; }), "overlap -0.25");
  expect_error(with([](auto& o) { o.sw_batch_size = 0; }), "sw_batch_size 0");
  expect_error(with([](auto& o) { o.sigma_scale = 0; }), "sigma_scale 0");
  expect_error(with([](auto& o) { o.device = "tpu"; }), "device 'tpu'");
  expect_error(with([](auto& o) { o.roi_size.clear(); }), "roi_size is empty");
  expect_error(with([](auto& o) { o.roi_size = {100000, 100000, 100000}; }), "voxels a window, more than 2^31");
  expect_error(with([](auto& o) { o.roi_size = {4, 4}; }), "roi_size [4, 4] has 2 entries");
  expect_error(with([](auto& o) {
                 o.roi_size = {20, 4, 4};
                 o.padding_mode = PadMode::reflect;
                 o.cval = 0;
               }),
               "reflect");
  SlidingWindowOptions o;
  o.roi_size = {4, 4, 4};
  expect_error(
      [&] {
        sliding_window_inference(
            input, [](const at::Tensor& t) { return t.narrow(2, 0, 3); }, o);
      },
      "the predictor returned [4, 1, 3, 4, 4] for 4 windows of [4, 4, 4]");
  expect_error([&] { sliding_window_inference(input, Predictor{}, o); }, "no predictor");
  expect_error([&] { importance_map({4, 0, 4}, BlendMode::gaussian, 0.125, at::kCPU); }, "roi_size [4, 0, 4]");
  // Names outside the closed sets stop at the reader, which lists the names.
  expect_error([] { SlidingWindowOptions::from_json({{"mode", "linear"}}); },
               "validation.sliding_window.mode: 'linear' is not one of constant | gaussian");
  expect_error([] { SlidingWindowOptions::from_json({{"padding_mode", "circular"}}); },
               "validation.sliding_window.padding_mode: 'circular' is not one of constant | reflect | replicate");
}

TEST(SlidingWindow, FromJsonReadsEveryKeyAndRejectsUnknownOnes) {
  const SlidingWindowOptions defaults;
  const auto empty = SlidingWindowOptions::from_json(nlohmann::json::object());
  EXPECT_EQ(empty.roi_size, defaults.roi_size);
  EXPECT_EQ(empty.sw_batch_size, defaults.sw_batch_size);
  EXPECT_EQ(empty.overlap, defaults.overlap);
  EXPECT_EQ(empty.mode, defaults.mode);

  const auto o = SlidingWindowOptions::from_json(nlohmann::json::parse(
      R"({"roi_size": [64, 32, -1], "sw_batch_size": 2, "overlap": 0.5, "mode": "gaussian", "sigma_scale": 0.25,
          "padding_mode": "replicate", "cval": 1.5, "device": "cpu"})"));
  EXPECT_EQ(o.roi_size, (std::vector<std::int64_t>{64, 32, -1}));
  EXPECT_EQ(o.sw_batch_size, 2);
  EXPECT_EQ(o.overlap, 0.5);
  EXPECT_EQ(o.mode, BlendMode::gaussian);
  EXPECT_EQ(o.sigma_scale, 0.25);
  EXPECT_EQ(o.padding_mode, PadMode::replicate);
  EXPECT_EQ(o.cval, 1.5);
  EXPECT_EQ(o.device, "cpu");
  EXPECT_EQ(SlidingWindowOptions::from_json(nlohmann::json::parse(R"({"roi_size": 80})")).roi_size,
            (std::vector<std::int64_t>{80, 80, 80}));

  const auto format_error = [](const char* text, const std::string& needle) {
    const std::string m =
        test::error_of<ConfigError>([&] { SlidingWindowOptions::from_json(nlohmann::json::parse(text)); });
    EXPECT_NE(m.find(needle), std::string::npos) << text << ": " << m;
  };
  format_error(R"({"roi": [96, 96, 96]})", "validation.sliding_window.roi: unknown key");
  format_error(R"({"overlap": "half"})", "validation.sliding_window.overlap: expected a number");
  format_error(R"({"sw_batch_size": 2.5})", "validation.sliding_window.sw_batch_size: expected a whole number");
  format_error(R"({"roi_size": [96, 96.5, 96]})", "validation.sliding_window.roi_size");
  format_error(R"([1, 2])", "expected a mapping");
  expect_error([] { SlidingWindowOptions::from_json(nlohmann::json::parse(R"({"overlap": 1.5})"), "val.sw"); },
               "val.sw: sliding window: argument overlap 1.5 is outside [0, 1)");
}

TEST(SlidingWindowGpu, CudaWindowsAccumulateOnTheRequestedDevice) {
  MEDFAST_REQUIRE_CUDA();
  const at::Tensor input = at::randn({2, 1, 20, 17, 13});
  SlidingWindowOptions o;
  o.roi_size = {8, 8, 8};
  o.mode = BlendMode::gaussian;
  const Predictor square = [](const at::Tensor& t) { return t * t; };
  const at::Tensor on_cpu = sliding_window_inference(input, square, o);
  o.device = "cpu";
  bool windows_on_cuda = true;
  const at::Tensor from_cuda = sliding_window_inference(
      input.cuda(),
      [&](const at::Tensor& t) {
        windows_on_cuda = windows_on_cuda && t.is_cuda();
        return square(t);
      },
      o);
  EXPECT_TRUE(windows_on_cuda);
  EXPECT_TRUE(from_cuda.device().is_cpu());
  EXPECT_LT((from_cuda - on_cpu).abs().max().item<double>(), 1e-5);
}

}  // namespace
}  // namespace medfast::train
