// Metrics: Dice and HD95 against tests/golden/make_metric_golden.py (numpy and
// scipy.ndimage: binary_erosion, distance_transform_edt, percentile), hand-made
// cases, MeanMetric's bookkeeping, and argument errors by message.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/train/metrics.hpp"
#include "golden_set.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

/// Equal shapes, NaN at the same places, elsewhere within rel * |want| + abs.
void expect_close(const at::Tensor& got_, const at::Tensor& want, double rel, double abs = 0) {
  const at::Tensor got = got_.cpu();
  ASSERT_EQ(got.scalar_type(), at::kDouble);
  ASSERT_EQ(got.sizes(), want.sizes());
  const auto g = got.contiguous(), w = want.to(at::kDouble).contiguous();
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double a = g.data_ptr<double>()[i], b = w.data_ptr<double>()[i];
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << "element " << i << ": got " << a << ", want NaN";
    } else {
      EXPECT_NEAR(a, b, rel * std::abs(b) + abs) << "element " << i;
    }
  }
}

class MetricGolden : public ::testing::Test {
 protected:
  static const test::GoldenSet& golden() { return test::GoldenSet::of("make_metric_golden.py"); }
  static at::Tensor tensor(const std::string& name) { return golden().tensor(name); }
  const nlohmann::json& manifest_ = golden().manifest();
};

TEST_F(MetricGolden, DiceAndHd95MatchTheReference) {
  ASSERT_GE(manifest_["cases"].size(), 7u);
  for (const auto& c : manifest_["cases"]) {
    SCOPED_TRACE(c["pred"].get<std::string>() + " include_background=" + c["include_background"].dump() +
                 " spacing=" + c["spacing"].dump());
    const at::Tensor pred = tensor(c["pred"]), gt = tensor(c["target"]);
    const bool background = c["include_background"];
    expect_close(dice_per_class(pred, gt, background), tensor(c["dice"]), 1e-12);
    // Both sides are float64 exact distance transforms: only rounding differs.
    expect_close(hausdorff95_per_class(pred, gt, background, c["spacing"].get<std::vector<double>>()),
                 tensor(c["hd95"]), 1e-9, 1e-12);
  }
}

TEST_F(MetricGolden, MasksOfAnyDtypeGiveTheSameValues) {
  const auto& c = manifest_["cases"][0];
  const at::Tensor pred = tensor(c["pred"]), gt = tensor(c["target"]);
  const auto spacing = c["spacing"].get<std::vector<double>>();
  for (auto dtype : {at::kBool, at::kFloat, at::kLong}) {
    expect_close(dice_per_class(pred.to(dtype), gt.to(dtype)), tensor(c["dice"]), 1e-12);
    expect_close(hausdorff95_per_class(pred.to(dtype), gt.to(dtype), false, spacing), tensor(c["hd95"]), 1e-9);
  }
}

class MetricGoldenGpu : public MetricGolden {};

TEST_F(MetricGoldenGpu, CudaMatchesTheReference) {
  MEDFAST_REQUIRE_CUDA();
  for (const auto& c : manifest_["cases"]) {
    const at::Tensor pred = tensor(c["pred"]).to(at::kCUDA), gt = tensor(c["target"]).to(at::kCUDA);
    const bool background = c["include_background"];
    const at::Tensor dice = dice_per_class(pred, gt, background);
    const at::Tensor hd = hausdorff95_per_class(pred, gt, background, c["spacing"].get<std::vector<double>>());
    EXPECT_TRUE(dice.is_cuda());
    EXPECT_TRUE(hd.is_cuda());
    expect_close(dice, tensor(c["dice"]), 1e-12);
    expect_close(hd, tensor(c["hd95"]), 1e-9, 1e-12);
  }
}

/// [1, 2, shape...] masks with class 1 set at the given voxels (class 0 elsewhere).
at::Tensor mask_with(const std::vector<std::int64_t>& shape, const std::vector<std::vector<std::int64_t>>& voxels) {
  std::vector<std::int64_t> full = {1, 2};
  full.insert(full.end(), shape.begin(), shape.end());
  at::Tensor m = at::zeros(full, at::kByte);
  for (const auto& v : voxels) {
    at::Tensor view = m[0][1];
    for (auto i : v) view = view[i];
    view.fill_(1);
  }
  m[0][0] = 1 - m[0][1];
  return m;
}

TEST(MetricHausdorff, SingleVoxelsAreTheirDistanceInMillimetres) {
  const at::Tensor pred = mask_with({6, 5, 7}, {{2, 3, 4}});
  const at::Tensor gt = mask_with({6, 5, 7}, {{5, 3, 0}});
  const at::Tensor hd = hausdorff95_per_class(pred, gt, false, {1.5, 1.0, 2.0});
  ASSERT_EQ(hd.sizes(), (std::vector<std::int64_t>{1, 1}));
  EXPECT_NEAR(hd.item<double>(), std::sqrt(4.5 * 4.5 + 8.0 * 8.0), 1e-12);
  // 1 mm by default, and one spatial axis works too.
  EXPECT_NEAR(hausdorff95_per_class(pred, gt).item<double>(), 5.0, 1e-12);
  EXPECT_NEAR(hausdorff95_per_class(mask_with({9}, {{1}, {2}}), mask_with({9}, {{7}}), false, {0.5}).item<double>(),
              2.5 + 0.95 * 0.5, 1e-12);  // percentile 95 of {2.5, 3} mm
}

TEST(MetricHausdorff, EmptyMasksFollowMonai) {
  const at::Tensor some = mask_with({5, 5}, {{1, 1}, {1, 2}}), none = mask_with({5, 5}, {});
  // Dice: NaN for an empty ground truth, 0 for an empty prediction.
  EXPECT_TRUE(std::isnan(dice_per_class(some, none).item<double>()));
  EXPECT_TRUE(std::isnan(dice_per_class(none, none).item<double>()));
  EXPECT_EQ(dice_per_class(none, some).item<double>(), 0.0);
  EXPECT_EQ(dice_per_class(some, some).item<double>(), 1.0);
  // HD95: NaN as soon as either side is empty; 0 for identical masks.
  EXPECT_TRUE(std::isnan(hausdorff95_per_class(some, none).item<double>()));
  EXPECT_TRUE(std::isnan(hausdorff95_per_class(none, some).item<double>()));
  EXPECT_TRUE(std::isnan(hausdorff95_per_class(none, none).item<double>()));
  EXPECT_EQ(hausdorff95_per_class(some, some).item<double>(), 0.0);
  // With background, channel 0 is there too.
  EXPECT_EQ(dice_per_class(some, some, true).sizes(), (std::vector<std::int64_t>{1, 2}));
}

TEST(MetricHausdorff, BadArgumentsAreValueErrors) {
  const at::Tensor a = mask_with({4, 4, 4}, {{1, 1, 1}});
  EXPECT_VALUE_ERROR(hausdorff95_per_class(a, a, false, {1.0, 2.0}),
                     "hausdorff95_per_class: spacing has 2 values for 3 spatial axes");
  EXPECT_VALUE_ERROR(hausdorff95_per_class(a, a, false, {1.0, 0.0, 1.0}), "spacing must be finite and > 0, got 0 on axis 1");
  EXPECT_VALUE_ERROR(hausdorff95_per_class(a, a.narrow(2, 0, 3)),
                     "hausdorff95_per_class: prediction [1, 2, 4, 4, 4] and ground truth [1, 2, 3, 4, 4] differ in shape");
  EXPECT_VALUE_ERROR(dice_per_class(a, a.narrow(1, 0, 1)), "dice_per_class: prediction");
  EXPECT_VALUE_ERROR(dice_per_class(at::zeros({2, 3}), at::zeros({2, 3})), "expected masks [B, C, spatial...], got [2, 3]");
}

TEST(MetricMean, LeavesNanOutPerClass) {
  const double nan = std::nan("");
  MeanMetric m;
  EXPECT_EQ(m.per_class().numel(), 0);
  EXPECT_TRUE(std::isnan(m.mean()));
  m.add(at::tensor({0.5, nan, 1.0, 1.0, nan, 0.25}, at::kDouble).view({2, 3}));
  m.add(at::tensor({nan, nan, 0.25}, at::kFloat));  // one row, float32
  expect_close(m.per_class(), at::tensor({0.75, nan, 0.5}, at::kDouble), 1e-15);
  expect_close(m.sums(), at::tensor({1.5, 0.0, 1.5}, at::kDouble), 1e-15);
  expect_close(m.counts(), at::tensor({2.0, 0.0, 3.0}, at::kDouble), 0);
  EXPECT_DOUBLE_EQ(m.mean(), 0.625);  // over the classes with values
  EXPECT_VALUE_ERROR(m.add(at::zeros({2, 4})), "MeanMetric: rows have 4 classes, earlier rows 3");
  EXPECT_VALUE_ERROR(m.add(at::zeros({2, 2, 3})), "expected per-case rows [N, C] or one row [C], got [2, 2, 3]");

  // Totals rebuild the same metric (as after an all-reduce over ranks).
  MeanMetric other;
  other.add(at::tensor({0.0, 1.0, nan}, at::kDouble).view({1, 3}));
  const MeanMetric sum = MeanMetric::from_totals(m.sums() + other.sums(), m.counts() + other.counts());
  expect_close(sum.per_class(), at::tensor({0.5, 1.0, 0.5}, at::kDouble), 1e-15);
  EXPECT_DOUBLE_EQ(sum.mean(), 2.0 / 3.0);

  m.reset();
  EXPECT_EQ(m.sums().numel(), 0);
  m.add(at::tensor({0.5}, at::kDouble));
  EXPECT_DOUBLE_EQ(m.mean(), 0.5);
}

TEST(MetricMean, AGivenClassCountGivesZeroTotalsBeforeAnyCase) {
  MeanMetric m(2);
  expect_close(m.sums(), at::zeros({2}, at::kDouble), 0);
  expect_close(m.counts(), at::zeros({2}, at::kDouble), 0);
  EXPECT_TRUE(std::isnan(m.mean()));
  EXPECT_VALUE_ERROR(m.add(at::zeros({3})), "rows have 3 classes, earlier rows 2");
  m.reset();
  EXPECT_EQ(m.sums().numel(), 2);
  EXPECT_VALUE_ERROR(MeanMetric::from_totals(at::zeros({2}), at::zeros({3})), "sums and counts must be [C] of the same size");
  EXPECT_VALUE_ERROR(MeanMetric::from_totals(at::zeros({2}), -at::ones({2})), "counts must be >= 0");
  EXPECT_VALUE_ERROR(MeanMetric(-1), "num_classes must be >= 0");
}

}  // namespace
}  // namespace medfast::train
