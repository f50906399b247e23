// Losses: values and gradients against tests/golden/make_loss_golden.py (an
// independent PyTorch float64 implementation of MONAI 1.3's formulas, autograd
// for the gradients), the `loss:` mapping, and argument errors by message.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/metrics.hpp"
#include "golden_set.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

class LossGolden : public ::testing::Test {
 protected:
  static const test::GoldenSet& golden() { return test::GoldenSet::of("make_loss_golden.py"); }
  static at::Tensor tensor(const std::string& name) { return golden().tensor(name); }

  /// The loss and the gradient w.r.t. the input, for inputs converted to `dtype`.
  static std::pair<at::Tensor, at::Tensor> evaluate(const nlohmann::json& c, at::ScalarType dtype,
                                                    at::Device device = at::kCPU) {
    const Loss loss(LossOptions::from_json(c["options"]));
    at::Tensor x = tensor(c["input"]).to(device, dtype).requires_grad_(true);
    const at::Tensor value = loss(x, tensor(c["target"]).to(device));
    value.backward();
    return {value.detach().cpu(), x.grad().cpu()};
  }

  const nlohmann::json& manifest_ = golden().manifest();
};

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

TEST_F(LossGolden, Float32ValuesAndGradientsMatchTheReference) {
  ASSERT_GE(manifest_["cases"].size(), 80u);
  for (const auto& c : manifest_["cases"]) {
    SCOPED_TRACE(c["options"].dump() + " on " + c["input"].get<std::string>());
    const auto [value, grad] = evaluate(c, at::kFloat);
    EXPECT_EQ(value.dim(), 0);
    EXPECT_EQ(value.scalar_type(), at::kFloat);
    const double want = c["loss"];
    EXPECT_NEAR(value.item<double>(), want, 1e-5 * std::abs(want) + 1e-7);
    const at::Tensor grad_want = tensor(c["grad"]);
    ASSERT_EQ(grad.sizes(), grad_want.sizes());
    EXPECT_LE(max_abs(grad.to(at::kDouble) - grad_want), 2e-5 * max_abs(grad_want));
  }
}

// A training step's way (train/step.hpp): channels-last logits (softmax and cross-entropy
// over the innermost axis of their memory) and labels whose range is checked later, on the
// host, a step on: the same values and gradients, in float64 to rounding. The range left
// is the labels' lowest and highest class.
TEST_F(LossGolden, ChannelsLastAndDeferredLabelChecksGiveTheSameLossAndGradient) {
  int five_d = 0;
  for (const auto& c : manifest_["cases"]) {
    const at::Tensor input = tensor(c["input"]);
    if (input.dim() != 5) continue;
    ++five_d;
    SCOPED_TRACE(c["options"].dump() + " on " + c["input"].get<std::string>());
    const Loss loss(LossOptions::from_json(c["options"]));
    const at::Tensor x = nn::to_memory_format(input.to(at::kDouble), at::MemoryFormat::ChannelsLast3d).requires_grad_(true);
    ASSERT_TRUE(nn::is_channels_last(x) || x.size(1) == 1);
    at::Tensor range;
    const at::Tensor target = tensor(c["target"]);
    const at::Tensor value = loss(x, target, &range);
    value.backward();
    const double want = c["loss"];
    EXPECT_NEAR(value.item<double>(), want, 1e-12 * std::abs(want));
    EXPECT_LE(max_abs(x.grad() - tensor(c["grad"])), 1e-11 * max_abs(tensor(c["grad"])));
    if (range.defined()) {
      const at::Tensor classes = target.to(at::kLong);
      EXPECT_EQ(range[0].item<std::int64_t>(), classes.min().item<std::int64_t>());
      EXPECT_EQ(range[1].item<std::int64_t>(), classes.max().item<std::int64_t>());
    }
  }
  EXPECT_GE(five_d, 10);
  // Out of range: the step's loss is computed on labels clamped into the classes; the range
  // tells the caller, which does not take the step.
  LossOptions o;
  o.to_onehot_y = true;
  o.softmax = true;
  const at::Tensor logits = at::randn({1, 2, 3, 3, 3}, at::kDouble);
  at::Tensor labels = at::zeros({1, 1, 3, 3, 3});
  labels[0][0][1][1][1] = 4;
  at::Tensor range;
  const Loss dice_ce(o);
  EXPECT_TRUE(std::isfinite(dice_ce(logits, labels, &range).item<double>()));
  EXPECT_EQ(range[1].item<std::int64_t>(), 4);
  EXPECT_THROW(dice_ce(logits, labels), ValueError);  // the checked way refuses them at once
}

TEST_F(LossGolden, Float64InputsMatchTheReferenceToRounding) {
  // The same formulas in float64 leave only summation-order differences.
  for (const auto& c : manifest_["cases"]) {
    SCOPED_TRACE(c["options"].dump() + " on " + c["input"].get<std::string>());
    const auto [value, grad] = evaluate(c, at::kDouble);
    EXPECT_EQ(value.scalar_type(), at::kDouble);
    const double want = c["loss"];
    EXPECT_NEAR(value.item<double>(), want, 1e-12 * std::abs(want));
    EXPECT_LE(max_abs(grad - tensor(c["grad"])), 1e-11 * max_abs(tensor(c["grad"])));
  }
}

TEST_F(LossGolden, TargetsOfAnyDtypeGiveTheSameLoss) {
  const auto& cases = manifest_["cases"];
  int checked = 0;
  for (const auto& c : cases) {
    const auto& o = c["options"];
    if (c["input"] != "x3" || o.value("name", "") != "DiceCE" || !o.value("softmax", false) ||
        o.value("batch", false) || !o.value("include_background", true))
      continue;
    SCOPED_TRACE(o.dump());
    const Loss loss(LossOptions::from_json(o));
    const at::Tensor x = tensor(c["input"]);
    const at::Tensor y = tensor(c["target"]);
    const double want = loss(x, y).item<double>();
    const bool indices = o.value("to_onehot_y", false);
    const auto dtypes = indices ? std::vector<at::ScalarType>{at::kLong, at::kInt, at::kByte, at::kDouble}
                                : std::vector<at::ScalarType>{at::kByte, at::kBool, at::kDouble};
    for (auto dtype : dtypes) EXPECT_FLOAT_EQ(loss(x, y.to(dtype)).item<double>(), want) << dtype;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST_F(LossGolden, ReducedPrecisionInputsAreComputedInFloat32) {
  const auto& c = manifest_["cases"][0];
  const Loss loss(LossOptions::from_json(c["options"]));
  const at::Tensor x = tensor(c["input"]).to(at::kBFloat16);
  const at::Tensor value = loss(x, tensor(c["target"]));
  EXPECT_EQ(value.scalar_type(), at::kFloat);
  EXPECT_NEAR(value.item<double>(), loss(x.to(at::kFloat), tensor(c["target"])).item<double>(), 1e-6);
}

class LossGoldenGpu : public LossGolden {};

TEST_F(LossGoldenGpu, CudaMatchesTheReference) {
  MEDFAST_REQUIRE_CUDA();
  for (const auto& c : manifest_["cases"]) {
    SCOPED_TRACE(c["options"].dump() + " on " + c["input"].get<std::string>());
    const auto [value, grad] = evaluate(c, at::kFloat, at::kCUDA);
    const double want = c["loss"];
    EXPECT_NEAR(value.item<double>(), want, 1e-5 * std::abs(want) + 1e-7);
    EXPECT_LE(max_abs(grad.to(at::kDouble) - tensor(c["grad"])), 2e-5 * max_abs(tensor(c["grad"])));
  }
}

TEST(LossConfig, FromJsonReadsEveryArgument) {
  const auto o = LossOptions::from_json(nlohmann::json::parse(R"({
      "name": "DiceFocal", "include_background": false, "to_onehot_y": true, "sigmoid": true,
      "squared_pred": true, "jaccard": true, "batch": true, "smooth_nr": 0, "smooth_dr": 1e-6,
      "lambda_dice": 0.5, "lambda_ce": 2, "lambda_focal": 3.5, "gamma": 1.5})"));
  EXPECT_EQ(o.name, LossName::DiceFocal);
  EXPECT_FALSE(o.include_background);
  EXPECT_TRUE(o.to_onehot_y && o.sigmoid && o.squared_pred && o.jaccard && o.batch);
  EXPECT_FALSE(o.softmax);
  EXPECT_EQ(o.smooth_nr, 0.0);
  EXPECT_EQ(o.smooth_dr, 1e-6);
  EXPECT_EQ(o.lambda_dice, 0.5);
  EXPECT_EQ(o.lambda_ce, 2.0);
  EXPECT_EQ(o.lambda_focal, 3.5);
  EXPECT_EQ(o.gamma, 1.5);

  const auto d = LossOptions::from_json(nlohmann::json::object());
  const LossOptions defaults;
  EXPECT_EQ(d.name, defaults.name);
  EXPECT_EQ(d.include_background, defaults.include_background);
  EXPECT_EQ(d.smooth_nr, defaults.smooth_nr);
  EXPECT_EQ(d.gamma, defaults.gamma);
}

TEST(LossConfig, WrittenBackWholeFromItsFieldList) {
  const auto o = LossOptions::from_json(nlohmann::json::parse(R"({"name": "Dice", "gamma": 3})"));
  const nlohmann::json j = fields_json(o);
  EXPECT_EQ(j.size(), 14u);  // every argument, defaults included
  EXPECT_EQ(j["name"], "Dice");
  EXPECT_EQ(j["gamma"], 3.0);
  EXPECT_EQ(j["include_background"], true);
  const auto again = LossOptions::from_json(j);
  EXPECT_EQ(fields_json(again), j);
  // An unknown argument lists the known ones (name aside), in the list's order.
  EXPECT_VALUE_ERROR(LossOptions::from_json(nlohmann::json::parse(R"({"gama": 3})")),
                     "(known: include_background, to_onehot_y, sigmoid, softmax, squared_pred, jaccard, batch, "
                     "smooth_nr, smooth_dr, lambda_dice, lambda_ce, lambda_focal, gamma)");
}

TEST(LossConfig, BadArgumentsAreValueErrorsNamingTheKey) {
  using nlohmann::json;
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"name": "DiceCE", "softmx": true})")),
                     "loss.softmx: unknown argument");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"softmax": "yes"})"), "train.yaml: loss"),
                     "train.yaml: loss.softmax: expected true or false, got \"yes\"");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"softmax": 1})")), "loss.softmax: expected true or false");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"gamma": true})")), "loss.gamma: expected a number");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"name": 3})")), "loss.name: expected a string");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"name": "Tversky"})")),
                     "loss.name: 'Tversky' is not one of Dice | DiceCE | DiceFocal");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"sigmoid": true, "softmax": true})")),
                     "loss.sigmoid: true together with softmax: true");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"({"lambda_ce": -1})")),
                     "loss.lambda_ce: expected a finite number >= 0, got -1");
  EXPECT_VALUE_ERROR(LossOptions::from_json(json::parse(R"([1, 2])")), "loss: expected a mapping");

  LossOptions o;
  o.gamma = -0.5;
  EXPECT_VALUE_ERROR(o.validate(), "gamma: expected a finite number >= 0, got -0.5");
  EXPECT_VALUE_ERROR(Loss(o), "gamma");
  o = LossOptions{};
  o.smooth_dr = std::nan("");
  EXPECT_VALUE_ERROR(Loss(o), "smooth_dr: expected a finite number >= 0");
}

TEST(LossShapes, MismatchedShapesAreValueErrorsStatingBoth) {
  LossOptions o;
  o.softmax = true;
  o.to_onehot_y = true;
  const Loss onehot_y(o);
  const at::Tensor x = at::randn({2, 3, 4, 4, 4});
  EXPECT_VALUE_ERROR(onehot_y(x, at::zeros({2, 3, 4, 4, 4})),
                     "DiceCE loss: target [2, 3, 4, 4, 4] does not fit input [2, 3, 4, 4, 4] (expected [2, 1, 4, 4, 4]");
  EXPECT_VALUE_ERROR(onehot_y(x, at::zeros({2, 4, 4, 4})), "target [2, 4, 4, 4] does not fit input");
  EXPECT_VALUE_ERROR(onehot_y(x, at::zeros({2, 1, 4, 4, 5})), "does not fit");
  EXPECT_VALUE_ERROR(onehot_y(x, at::full({2, 1, 4, 4, 4}, 3)), "one_hot: labels must lie in [0, 3), got values from 3 to 3");
  EXPECT_VALUE_ERROR(onehot_y(x, at::full({2, 1, 4, 4, 4}, -1)), "labels must lie in [0, 3)");
  EXPECT_VALUE_ERROR(onehot_y(at::randn({2, 3}), at::zeros({2, 1})), "input must be floating-point logits [B, C, spatial...]");
  EXPECT_VALUE_ERROR(onehot_y(at::zeros({2, 3, 4}, at::kLong), at::zeros({2, 1, 4})), "floating-point");

  o.to_onehot_y = false;
  EXPECT_VALUE_ERROR(Loss(o)(x, at::zeros({2, 1, 4, 4, 4})), "set to_onehot_y for class indices");

  // Softmax over one channel is constant: an error rather than MONAI's warning.
  EXPECT_VALUE_ERROR(Loss(o)(at::randn({2, 1, 4, 4}), at::zeros({2, 1, 4, 4})),
                     "softmax over a single channel is constant; use sigmoid");
}

TEST(LossShapes, SingleChannelIgnoresToOnehotAndBackground) {
  // MONAI ignores to_onehot_y and include_background=false for one channel.
  const at::Tensor x = at::randn({2, 1, 5, 6}), y = (at::rand({2, 1, 5, 6}) > 0.5).to(at::kFloat);
  for (const LossName name : {LossName::Dice, LossName::DiceCE, LossName::DiceFocal}) {
    LossOptions plain;
    plain.name = name;
    plain.sigmoid = true;
    LossOptions ignored = plain;
    ignored.to_onehot_y = true;
    ignored.include_background = false;
    EXPECT_DOUBLE_EQ(Loss(plain)(x, y).item<double>(), Loss(ignored)(x, y).item<double>()) << name_of(name);
  }
}

TEST(LossShapes, PerfectPredictionsGiveZeroDice) {
  LossOptions o;
  o.name = LossName::Dice;
  o.to_onehot_y = true;
  const at::Tensor labels = at::randint(0, 3, {2, 1, 6, 5, 4});
  const at::Tensor probabilities = train::one_hot(labels, 3);
  EXPECT_NEAR(Loss(o)(probabilities, labels).item<double>(), 0.0, 1e-9);
}

TEST(LossOneHot, EncodesClassIndicesOfAnyDtype) {
  const at::Tensor labels = at::tensor({0, 2, 1, 2}, at::kLong).view({1, 1, 4});
  const at::Tensor want = at::tensor({1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1}, at::kFloat).view({1, 3, 4});
  for (auto dtype : {at::kLong, at::kByte, at::kInt, at::kFloat, at::kDouble}) {
    const at::Tensor got = train::one_hot(labels.to(dtype), 3);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(got, want)) << dtype;
  }
  EXPECT_TRUE(at::equal(train::one_hot(at::tensor({1.9f, 0.2f}).view({2, 1}), 2),
                        at::tensor({0.f, 1.f, 1.f, 0.f}).view({2, 2})));  // truncated, as MONAI's .long()
  EXPECT_VALUE_ERROR(train::one_hot(at::zeros({2, 2, 3}), 3), "one_hot: labels must be [B, 1, ...] class indices, got [2, 2, 3]");
  EXPECT_VALUE_ERROR(train::one_hot(labels, 0), "num_classes must be >= 1, got 0");
  EXPECT_VALUE_ERROR(train::one_hot(labels, 2), "labels must lie in [0, 2), got values from 0 to 2");
}

TEST(LossOneHot, ArgmaxOneHotPicksTheFirstMaximum) {
  const at::Tensor logits = at::tensor({0.1f, 3.f, 2.f, 2.f, -1.f, 0.f}).view({1, 3, 2});
  // Voxel 0: scores (0.1, 2, -1) -> class 1; voxel 1: (3, 2, 0) -> class 0.
  EXPECT_TRUE(at::equal(argmax_one_hot(logits), at::tensor({0.f, 1.f, 1.f, 0.f, 0.f, 0.f}).view({1, 3, 2})));
  const at::Tensor ties = at::zeros({1, 3, 2});
  EXPECT_TRUE(at::equal(argmax_one_hot(ties).select(1, 0), at::ones({1, 2})));
}

// Deep supervision: the weighted sum of the loss of each stacked output against one target.
TEST(Losses, DeepSupervisionWeighsEachStackedOutput) {
  at::manual_seed(5);
  LossOptions lo;
  lo.to_onehot_y = lo.softmax = true;
  const Loss loss(lo);
  const at::Tensor stacked = at::randn({2, 3, 2, 6, 5, 4}).requires_grad_();
  const at::Tensor target = at::randint(0, 2, {2, 1, 6, 5, 4});
  const std::vector<double> w{4.0 / 7, 2.0 / 7, 1.0 / 7};
  const at::Tensor got = deep_supervision_loss(loss, stacked, target, w);
  double want = 0;
  for (int i = 0; i < 3; ++i) want += w[static_cast<std::size_t>(i)] * loss(stacked.select(1, i), target).item<double>();
  EXPECT_NEAR(got.item<double>(), want, 1e-6);
  got.backward();
  EXPECT_TRUE(stacked.grad().defined());
  EXPECT_GT(stacked.grad().select(1, 2).abs().sum().item<double>(), 0);  // every output is trained
  // A weight of 0 (nnU-Net's lowest output) is not scored: its NaN does not reach the loss.
  at::Tensor two = at::randn({2, 2, 2, 6, 5, 4});
  two.select(1, 1).fill_(std::numeric_limits<float>::quiet_NaN());
  EXPECT_NEAR(deep_supervision_loss(loss, two, target, {1.0, 0.0}).item<double>(), loss(two.select(1, 0), target).item<double>(), 1e-7);
  const std::string m = test::value_error_of([&] { deep_supervision_loss(loss, stacked, target, {0.5, 0.5}); });
  EXPECT_NE(m.find("expected 2 outputs stacked on axis 1"), std::string::npos) << "2 weights and 3 outputs: " << m;
}

// Region labels (LabelToRegions, ConvertToMultiChannelBasedOnBratsClasses: uint8 channels of 0
// and 1; MONAI's BraTS transform gives bool) are a sigmoid model's targets as they are.
TEST(LossRegions, Uint8AndBoolRegionTargetsGiveTheFloatTargetsLossAndMetrics) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 3, 5, 4, 3});
  const at::Tensor y = (at::randn({2, 3, 5, 4, 3}) > 0).to(at::kByte);
  for (const char* name : {"Dice", "DiceCE", "DiceFocal"}) {
    const Loss loss(LossOptions::from_json({{"name", name}, {"sigmoid", true}}));
    const double want = loss(x, y.to(at::kFloat)).item<double>();
    EXPECT_FLOAT_EQ(loss(x, y).item<double>(), want) << name;
    EXPECT_FLOAT_EQ(loss(x, y.to(at::kBool)).item<double>(), want) << name;
  }
  for (const auto& labels : {y, y.to(at::kBool)}) {
    const auto m = metric_inputs(x, labels, /*sigmoid=*/true);
    EXPECT_TRUE(at::equal(m.target, y.to(at::kFloat)));
    EXPECT_TRUE(m.include_background);
  }
}

}  // namespace
}  // namespace medfast::train
