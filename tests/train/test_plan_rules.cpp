// nnU-Net v2's planning rules (issue 23): medfast's restatement (src/plan/rules.cpp) against an
// independent numpy statement (tests/golden/nnunet_rules.py) on hand-made fingerprints: an
// isotropic CT, an anisotropic MR with 5 mm slices, images smaller than any patch, two
// modalities, and a coarse axis with many voxels (no anisotropy rule).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/nn/dynunet.hpp"
#include "medfast/plan/fingerprint.hpp"
#include "medfast/plan/rules.hpp"
#include "test_util.hpp"

namespace medfast::plan {
namespace {

const char* name_of(Normalization n) {
  switch (n) {
    case Normalization::ct: return "ct";
    case Normalization::zscore: return "zscore";
    case Normalization::none: return "none";
    case Normalization::rescale_to_0_1: return "rescale_to_0_1";
  }
  return "?";
}

std::vector<double> samples(int n, double offset, double scale) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(offset + scale * std::sin(i * 0.7548776662466927) * std::abs(std::cos(i * 0.31)));
  return v;
}

void expect_as_nnunet(const nlohmann::json& f, const std::string& what) {
  SCOPED_TRACE(what);
  test::TempDir dir;
  test::write_file(dir / "f.json", f.dump());
  const auto r = test::run(test::python() + " " + test::source_dir() + "/tests/golden/nnunet_rules.py < " + dir / "f.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = nlohmann::json::parse(r.out);

  std::vector<Spacing> spacings;
  std::vector<Shape> shapes;
  for (const auto& s : f["spacings"]) spacings.push_back({s[0], s[1], s[2]});
  for (const auto& s : f["shapes"]) shapes.push_back({s[0], s[1], s[2]});
  const Spacing target = target_spacing(spacings, shapes);
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(target[d], want["target_spacing"][d].get<double>(), 1e-12) << "axis " << d;
  const Spacing median = resampled_median_shape(spacings, shapes, target);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(median[d], want["median_shape"][d].get<double>()) << "axis " << d;

  const PatchPlan p = plan_patch(target, median, f["classes"], median[0] * median[1] * median[2] * shapes.size());
  const auto as_json = [](const std::vector<Shape>& v) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& s : v) j.push_back({s[0], s[1], s[2]});
    return j;
  };
  EXPECT_EQ(nlohmann::json(p.topology.patch), want["patch"]);
  EXPECT_EQ(as_json(p.topology.strides), want["strides"]);
  EXPECT_EQ(as_json(p.topology.kernels), want["kernels"]);
  EXPECT_EQ(nlohmann::json(p.topology.divisor), want["divisor"]);
  EXPECT_EQ(nlohmann::json(p.features), want["features"]);
  EXPECT_EQ(p.batch_size, want["batch_size"].get<std::int64_t>());
  EXPECT_NEAR(p.estimate / want["estimate"].get<double>(), 1.0, 1e-12);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(p.topology.patch[d] % p.topology.divisor[d], 0);

  std::vector<double> rel;
  for (const auto& v : f.value("relative_sizes", nlohmann::json::array())) rel.push_back(v);
  const double median_rel = rel.empty() ? 1.0 : percentile(rel, 50);
  for (std::size_t c = 0; c < f["channels"].size(); ++c) {
    const Normalization n = normalization_for(f["channels"][c]);
    EXPECT_EQ(name_of(n), want["normalization"][c].get<std::string>()) << f["channels"][c];
    EXPECT_EQ(use_mask_for_norm(n, median_rel), want["use_mask"][c].get<bool>()) << f["channels"][c];
  }
  for (std::size_t c = 0; c < f.value("samples", nlohmann::json::array()).size(); ++c) {
    const IntensityStats s = intensity_stats(f["samples"][c].get<std::vector<double>>());
    const auto& w = want["stats"][c];
    const auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)); };
    EXPECT_TRUE(near(s.mean, w["mean"])) << s.mean << " " << w["mean"];
    EXPECT_TRUE(near(s.median, w["median"])) << s.median << " " << w["median"];
    EXPECT_TRUE(near(s.std, w["std"])) << s.std << " " << w["std"];
    EXPECT_TRUE(near(s.min, w["min"]) && near(s.max, w["max"]));
    EXPECT_TRUE(near(s.p00_5, w["p00_5"])) << s.p00_5 << " " << w["p00_5"];
    EXPECT_TRUE(near(s.p99_5, w["p99_5"])) << s.p99_5 << " " << w["p99_5"];
  }
  const auto weights = nn::deep_supervision_weights(f.value("outputs", 1), /*drop_lowest=*/true);
  ASSERT_EQ(weights.size(), want["deep_supervision_weights"].size());
  for (std::size_t i = 0; i < weights.size(); ++i) EXPECT_NEAR(weights[i], want["deep_supervision_weights"][i].get<double>(), 1e-15);
}

TEST(PlanRules, IsotropicCt) {
  expect_as_nnunet({{"spacings", {{0.78, 0.78, 1.0}, {0.8, 0.8, 1.0}, {0.7, 0.7, 0.8}, {0.9, 0.9, 1.0}, {0.75, 0.75, 1.25}}},
                    {"shapes", {{512, 512, 120}, {500, 480, 130}, {512, 512, 200}, {400, 400, 100}, {450, 460, 90}}},
                    {"classes", 2},
                    {"channels", {"CT"}},
                    {"relative_sizes", {0.9, 0.95, 0.85, 1.0, 0.92}},
                    {"samples", {samples(4001, 40, 300)}},
                    {"outputs", 5}},
                   "isotropic CT");
}

TEST(PlanRules, AnisotropicMrWithFiveMillimetreSlices) {
  expect_as_nnunet({{"spacings", {{0.7, 0.7, 5.0}, {0.75, 0.75, 5.0}, {0.8, 0.8, 6.0}, {0.65, 0.65, 4.5}, {0.7, 0.7, 5.5}, {0.72, 0.72, 3.0}}},
                    {"shapes", {{320, 320, 24}, {300, 310, 22}, {280, 300, 20}, {320, 320, 26}, {310, 300, 23}, {256, 256, 40}}},
                    {"classes", 3},
                    {"channels", {"T2"}},
                    {"relative_sizes", {0.6, 0.7, 0.5, 0.8, 0.65, 0.7}},
                    {"outputs", 4}},
                   "anisotropic MR");
}

TEST(PlanRules, ImagesSmallerThanAnyPatch) {
  expect_as_nnunet({{"spacings", {{1.0, 1.0, 1.0}, {1.0, 1.0, 1.0}, {1.0, 1.0, 1.0}}},
                    {"shapes", {{20, 18, 10}, {22, 16, 12}, {18, 20, 11}}},
                    {"classes", 3},
                    {"channels", {"rescale_to_0_1"}},
                    {"outputs", 2}},
                   "tiny images");
}

TEST(PlanRules, TwoModalities) {
  expect_as_nnunet({{"spacings", {{1.0, 1.0, 1.0}, {1.2, 1.2, 1.2}, {1.0, 1.0, 1.5}, {0.9, 0.9, 1.0}}},
                    {"shapes", {{240, 240, 155}, {200, 200, 130}, {240, 240, 100}, {256, 256, 170}}},
                    {"classes", 4},
                    {"channels", {"CT", "noNorm"}},
                    {"relative_sizes", {0.5, 0.6, 0.7, 0.55}},
                    {"samples", {samples(3000, -100, 500), samples(2999, 0.5, 0.2)}},
                    {"outputs", 1}},
                   "two modalities");
}

TEST(PlanRules, CoarseAxisWithManyVoxelsKeepsItsMedianSpacing) {
  expect_as_nnunet({{"spacings", {{1.0, 1.0, 4.0}, {1.0, 1.0, 4.0}, {1.1, 1.1, 5.0}}},
                    {"shapes", {{200, 200, 150}, {210, 190, 160}, {180, 200, 140}}},
                    {"classes", 2},
                    {"channels", {"MRI"}}},
                   "coarse axis, many voxels");
}

/// The largest case per axis at the target spacing, as either rounding makes it: nnU-Net's
/// round(r * n) or the Spacing transform's round((n - 1) * r + 1) (r = spacing / target).
TEST(PlanRules, TheLargestCaseAtTheTargetSpacing) {
  // x: 8 (10 * 0.8), y: 12, z: 15 (10 * 1.5; the transform's 14.5 rounds to 14).
  EXPECT_EQ(
      resampled_max_shape({{1, 1, 3}, {1, 1, 2.5}, {0.5, 1, 2}}, {{10, 10, 10}, {9, 12, 11}, {3, 4, 5}}, {1.25, 1, 2}),
      (Shape{8, 12, 15}));
  // Where the transform's shape is larger (9 voxels at half the spacing: 4.5 -> 4 by nnU-Net's
  // rounding, 5 by the transform's), the window takes it.
  EXPECT_EQ(resampled_max_shape({{0.5, 0.5, 1}}, {{9, 9, 9}}, {1, 1, 2}), (Shape{5, 5, 5}));
  EXPECT_THROW(resampled_max_shape({}, {}, {1, 1, 1}), ValueError);
  EXPECT_THROW(resampled_max_shape({{1, 1, 1}}, {}, {1, 1, 1}), ValueError);
}

TEST(PlanRules, BadInputIsAValueError) {
  EXPECT_THROW(target_spacing({}, {}), ValueError);
  EXPECT_THROW(target_spacing({{1, 1, 1}}, {}), ValueError);
  EXPECT_THROW(percentile({}, 50), ValueError);
  EXPECT_THROW(percentile({1.0}, 101), ValueError);
  EXPECT_THROW(plan_patch({0, 1, 1}, {10, 10, 10}, 2, 1000), ValueError);
  EXPECT_THROW(intensity_stats({}), ValueError);
  EXPECT_THROW(nn::deep_supervision_weights(0, true), ValueError);
  EXPECT_EQ(nn::deep_supervision_weights(1, true), std::vector<double>{1.0});
}

// The patch loop with a compute budget beside memory: the patch shrinks until a batch of 2
// fits both; the batch is the largest both allow (and the channels are the model's).
TEST(PlanRules, AComputeBudgetShrinksThePatchAndCapsTheBatch) {
  const Spacing spacing{1, 1, 1}, median{160, 160, 160};
  // A toy cost: memory 1 per voxel and sample; compute 10 per voxel, sample and base channel.
  StepModel m;
  m.budget = 1e12;  // memory is no limit
  m.cost = [](const Topology& t, const std::vector<std::int64_t>&, std::int64_t batch) {
    return static_cast<double>(t.patch[0] * t.patch[1] * t.patch[2] * batch);
  };
  const auto compute = [](const Topology& t, const std::vector<std::int64_t>& f, std::int64_t batch) {
    return 10.0 * static_cast<double>(f.front() * t.patch[0] * t.patch[1] * t.patch[2] * batch);
  };
  const PatchPlan free = plan_patch(spacing, median, 1e12, m);
  m.compute = compute;
  m.compute_budget = 2 * 10.0 * 32 * 64 * 64 * 64;  // a batch of 2 at 64^3 with 32 channels
  const PatchPlan p = plan_patch(spacing, median, 1e12, m);
  const auto voxels = [](const Shape& s) { return s[0] * s[1] * s[2]; };
  EXPECT_LT(voxels(p.topology.patch), voxels(free.topology.patch));
  EXPECT_LE(compute(p.topology, p.features, 2), m.compute_budget);
  EXPECT_EQ(p.features.front(), 32);
  EXPECT_LE(compute(p.topology, p.features, p.batch_size), m.compute_budget);
  EXPECT_GT(compute(p.topology, p.features, p.batch_size + 1), m.compute_budget);
  // Narrower channels: the same budget keeps a larger patch, channels capped at 10x the base.
  m.base_features = 8;
  m.max_features = 80;
  const PatchPlan narrow = plan_patch(spacing, median, 1e12, m);
  EXPECT_EQ(narrow.features.front(), 8);
  EXPECT_EQ(*std::max_element(narrow.features.begin(), narrow.features.end()),
            std::min<std::int64_t>(80, 8 << (narrow.features.size() - 1)));
  EXPECT_GT(voxels(narrow.topology.patch), voxels(p.topology.patch));
  // Nothing fits: the message names the compute budget, not memory.
  m.compute_budget = 1;
  const std::string e = test::value_error_of([&] { plan_patch(spacing, median, 1e12, m); });
  EXPECT_NE(e.find("no patch fits the compute budget"), std::string::npos) << e;
}

// One case's fingerprint: the crop to the nonzero region of any channel, its share of the
// image, foreground samples drawn from the cropped foreground only, the same for a seed.
TEST(PlanFingerprint, CropsToNonzeroAndSamplesTheForeground) {
  at::Tensor image = at::zeros({2, 20, 16, 10});
  image[0].narrow(0, 3, 10).narrow(1, 2, 12).narrow(2, 1, 8).fill_(-5);  // channel 0: x 3..12, y 2..13, z 1..8
  image[1][15][14][9] = 7;                                               // channel 1 widens the box to 15, 14, 9
  at::Tensor label = at::zeros({1, 20, 16, 10}, at::kByte);
  label[0].narrow(0, 5, 2).narrow(1, 4, 2).narrow(2, 2, 2).fill_(1);  // 8 foreground voxels
  image[0].narrow(0, 5, 2).narrow(1, 4, 2).narrow(2, 2, 2).fill_(100);
  image[1].narrow(0, 5, 2).narrow(1, 4, 2).narrow(2, 2, 2).fill_(3);
  const CaseFingerprint f = case_fingerprint(image, label, {0.8, 0.8, 2.5}, 500, 1234, "case 1");
  EXPECT_EQ(f.shape_after_crop, (Shape{13, 13, 9}));  // x 3..15, y 2..14, z 1..9
  EXPECT_DOUBLE_EQ(f.relative_size, 13.0 * 13 * 9 / (20.0 * 16 * 10));
  EXPECT_EQ(f.foreground_voxels, 8);
  ASSERT_EQ(f.samples.size(), 2u);
  ASSERT_EQ(f.samples[0].size(), 500u);
  for (const double v : f.samples[0]) EXPECT_EQ(v, 100);
  for (const double v : f.samples[1]) EXPECT_EQ(v, 3);
  // Varied foreground values: every sample is one of them, and a seed repeats its draws.
  at::Tensor ramp = image.clone();
  ramp[0].narrow(0, 5, 2).narrow(1, 4, 2).narrow(2, 2, 2).copy_(at::arange(8, at::kFloat).reshape({2, 2, 2}) + 10);
  const CaseFingerprint a = case_fingerprint(ramp, label, {1, 1, 1}, 400, 7, "ramp"),
                        b = case_fingerprint(ramp, label, {1, 1, 1}, 400, 7, "ramp");
  EXPECT_EQ(a.samples, b.samples);
  std::set<double> seen(a.samples[0].begin(), a.samples[0].end());
  EXPECT_EQ(seen.size(), 8u);  // 400 draws of 8 values reach them all
  EXPECT_EQ(*seen.begin(), 10);
  EXPECT_EQ(*seen.rbegin(), 17);
  // No foreground: no samples; an all-zero image keeps its whole shape.
  const CaseFingerprint none = case_fingerprint(at::zeros({1, 6, 5, 4}), at::zeros({6, 5, 4}, at::kByte), {1, 1, 1}, 10, 1, "empty");
  EXPECT_EQ(none.shape_after_crop, (Shape{6, 5, 4}));
  EXPECT_EQ(none.relative_size, 1.0);
  EXPECT_TRUE(none.samples[0].empty());
  EXPECT_EQ(none.foreground_voxels, 0);
  // Bad input names the case.
  const std::string shape =
      test::value_error_of([&] { case_fingerprint(image, at::zeros({20, 16, 9}), {1, 1, 1}, 1, 1, "case 9"); });
  EXPECT_NE(shape.find("case 9: the label's shape"), std::string::npos) << shape;
  const std::string spacing = test::value_error_of([&] { case_fingerprint(image, label, {1, 0, 1}, 1, 1, "case 9"); });
  EXPECT_NE(spacing.find("case 9: spacing 0 along axis 1"), std::string::npos) << spacing;
  const std::string rank = test::value_error_of([&] { case_fingerprint(image[0], label, {1, 1, 1}, 1, 1, "case 9"); });
  EXPECT_NE(rank.find("case 9: expected an image"), std::string::npos) << rank;
}

}  // namespace
}  // namespace medfast::plan
