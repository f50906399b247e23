// The training step (train/step.hpp): outcomes read a step later equal a plain loop's losses
// and weights; a non-finite step never reaches the weights; labels outside the classes stop
// the run naming the step they came from.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/train/amp.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/step.hpp"
#include "nn/op_recorder.hpp"
#include "test_util.hpp"

#include <torch/version.h>

namespace medfast::train {
namespace {

const nlohmann::json kModel = {{"name", "UNet"},  {"spatial_dims", 3},       {"in_channels", 1},
                               {"out_channels", 2}, {"channels", {4, 8, 16}}, {"strides", {2, 2}},
                               {"num_res_units", 1}, {"norm", "batch"}};

LossOptions dice_ce() {
  LossOptions o;
  o.name = LossName::DiceCE;
  o.to_onehot_y = true;
  o.softmax = true;
  return o;
}

OptimizerOptions sgd() {
  OptimizerOptions o = OptimizerOptions::defaults("SGD");
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-4;
  o.nesterov = true;
  return o;
}

/// Batches of random images and two-class labels, the same for every caller.
struct Batches {
  std::vector<at::Tensor> images, labels;
  explicit Batches(int n) {
    torch::manual_seed(7);
    for (int i = 0; i < n; ++i) {
      images.push_back(torch::randn({2, 1, 16, 16, 8}));
      labels.push_back((torch::rand({2, 1, 16, 16, 8}) > 0.7).to(at::kFloat));
    }
  }
};

/// A network, its optimizer, scaler and loss, from one seed.
struct Trainee {
  torch::nn::AnyModule net;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  GradScaler scaler{GradScalerOptions{65536.0, 2.0, 0.5, 2000, false}};
  Loss loss{dice_ce()};
  explicit Trainee(const OptimizerOptions& o = sgd(), const std::string& norm = "batch") {
    torch::manual_seed(3);
    nlohmann::json model = kModel;
    model["norm"] = norm;
    net = nn::make_network(model);
    params = nn::unique_tensors(net.ptr()->parameters());
    optimizer = make_optimizer(params, o);
  }
  TrainingStep step(const OptimizerOptions& o = sgd()) {
    TrainingStep::Parts parts;
    parts.model = net;
    parts.params = params;
    parts.optimizer = optimizer.get();
    parts.optimizer_name = o.name;
    parts.scaler = &scaler;
    parts.loss = &loss;
    return TrainingStep(std::move(parts), StepOptions{});
  }
  at::Tensor weights() const {
    std::vector<at::Tensor> f;
    for (const auto& p : params) f.push_back(p.detach().reshape({-1}));
    return at::cat(f);
  }
};

TEST(TrainingStep, OutcomesReadAStepLaterEqualAPlainLoop) {
  torch::set_num_threads(1);
  const Batches b(5);
  for (const char* name : {"SGD", "Adam", "AdamW", "Novograd"}) {
    SCOPED_TRACE(name);
    OptimizerOptions o = name == std::string("SGD") ? sgd() : OptimizerOptions::defaults(name);
    o.lr = name == std::string("SGD") ? o.lr : 1e-3;
    // Adam, AdamW and Novograd scale each gradient by its own magnitude: a convolution's bias
    // before batch norm, whose gradient is rounding noise (1e-9), moves by about lr whichever
    // way the noise points, and two updates that round differently (libtorch's fused kernel
    // against its per-parameter step) make different noise after the first step. Without
    // batch norm every gradient means something.
    const std::string norm = name == std::string("SGD") ? "batch" : "none";
    // The plain loop: zero_grad, forward, loss, backward, step(), the loss read at once.
    Trainee ref(o, norm);
    std::vector<double> want;
    for (std::size_t i = 0; i < b.images.size(); ++i) {
      ref.optimizer->zero_grad();
      const at::Tensor loss = ref.loss(ref.net.forward<at::Tensor>(b.images[i]), b.labels[i]);
      loss.backward();
      ref.optimizer->step();
      want.push_back(loss.item<double>());
    }
    // The step: each outcome comes back with the next step, the last from finish().
    Trainee s(o, norm);
    TrainingStep step_object = s.step(o);
    TrainingStep* step = &step_object;
    std::vector<StepOutcome> got;
    StageTimes times;
    for (std::size_t i = 0; i < b.images.size(); ++i) {
      const auto done = step->run(b.images[i], b.labels[i], StepLabel{1, static_cast<int>(i) + 1, {2 * i, 2 * i + 1}}, times);
      EXPECT_EQ(done.has_value(), i > 0) << "step " << i + 1;
      if (done) got.push_back(*done);
    }
    const auto last = step->finish(times);
    ASSERT_TRUE(last.has_value());
    got.push_back(*last);
    EXPECT_FALSE(step->finish(times).has_value());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].label.step, static_cast<int>(i) + 1);
      EXPECT_TRUE(got[i].applied);
      EXPECT_NEAR(got[i].loss, want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
    }
    EXPECT_TRUE(at::allclose(s.weights(), ref.weights(), 1e-5, 1e-6))
        << "the weights differ after the steps by up to " << (s.weights() - ref.weights()).abs().max().item<double>();
    EXPECT_GT(times.forward + times.backward + times.optimizer, 0.0);
    EXPECT_GT(times.copy, 0.0);
    // The parameters' gradients are set to none before each backward (and the last one's left).
    for (const auto& p : s.params) EXPECT_TRUE(p.grad().defined());
  }
}

TEST(TrainingStep, ANonFiniteStepIsSkippedAndReportedAsSuch) {
  torch::set_num_threads(1);
  const Batches b(3);
  Trainee s;
  TrainingStep::Parts parts;
  parts.model = s.net;
  parts.params = s.params;
  parts.optimizer = s.optimizer.get();
  parts.optimizer_name = "SGD";
  parts.scaler = &s.scaler;
  parts.loss = &s.loss;
  parts.loss_filter = [](int, int step, const at::Tensor& loss) { return step == 2 ? loss * std::nan("") : loss; };
  TrainingStep step(std::move(parts), StepOptions{});
  StageTimes times;
  ASSERT_FALSE(step.run(b.images[0], b.labels[0], {1, 1, {0}}, times).has_value());
  const at::Tensor after_first = s.weights().clone();
  const auto first = step.run(b.images[1], b.labels[1], {1, 2, {1}}, times);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->applied);
  // Step 2's NaN gradients did not reach the weights (its update skipped itself).
  EXPECT_TRUE(at::equal(s.weights(), after_first));
  const auto second = step.run(b.images[2], b.labels[2], {1, 3, {2}}, times);
  ASSERT_TRUE(second.has_value());
  EXPECT_FALSE(second->applied);
  EXPECT_TRUE(std::isnan(second->loss));
  EXPECT_EQ(second->label.text(), "epoch 1, step 2 (items 1)");
  const auto third = step.finish(times);
  ASSERT_TRUE(third.has_value());
  EXPECT_TRUE(third->applied);
  EXPECT_FALSE(at::equal(s.weights(), after_first));
}

TEST(TrainingStep, LabelsOutsideTheClassesNameTheirStep) {
  torch::set_num_threads(1);
  const Batches b(2);
  Trainee s;
  TrainingStep step = s.step();
  StageTimes times;
  const at::Tensor bad = b.labels[0].clone();
  bad[1][0][3][4][5] = 5;
  const at::Tensor before = s.weights().clone();
  ASSERT_FALSE(step.run(b.images[0], bad, {3, 4, {10, 11}}, times).has_value());  // found on the device, read later
  const std::string m = test::error_of<ValueError>([&] { step.run(b.images[1], b.labels[1], {3, 5, {12, 13}}, times); });
  EXPECT_NE(m.find("epoch 3, step 4 (items 10, 11): one_hot: labels must lie in [0, 2), got values from 0 to 5"),
            std::string::npos)
      << m;
  // The bad step's update skipped itself (and the error came before the next one's).
  EXPECT_TRUE(at::equal(before, s.weights()));
  // Read at the end of an epoch too.
  TrainingStep last = s.step();
  const at::Tensor negative = b.labels[0] - 1;
  ASSERT_FALSE(last.run(b.images[0], negative, {1, 1, {0, 1}}, times).has_value());
  const std::string m2 = test::error_of<ValueError>([&] { last.finish(times); });
  EXPECT_NE(m2.find("epoch 1, step 1 (items 0, 1): one_hot: labels must lie in [0, 2), got values from -1 to 0"),
            std::string::npos)
      << m2;
}


// On a GPU (libtorch 2.x: CUDA 3D convolutions keep channels-last), the spleen recipe's
// network channels-last in fp16 and bf16: no operator under its forward, loss and backward
// copies a tensor into another layout (aten::contiguous, aten::clone, a copy_ that keeps the
// dtype; autocast's casts change it), and the update is libtorch's fused kernel.
TEST(TrainingStepGpu, ChannelsLastForwardAndBackwardHaveNoLayoutRoundTrips) {
  MEDFAST_REQUIRE_CUDA();
  const nlohmann::json model = {{"name", "UNet"},  {"in_channels", 1},     {"out_channels", 2},
                                {"channels", {16, 32, 64, 128, 256}}, {"strides", {2, 2, 2, 2}},
                                {"num_res_units", 2}, {"norm", "batch"}};
  const c10::Device cuda("cuda:0");
  for (const Precision precision : {Precision::fp16, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    torch::manual_seed(0);
    auto net = nn::make_network(model);
    net.ptr()->to(cuda);
    nn::set_memory_format(*net.ptr(), at::MemoryFormat::ChannelsLast3d);
    const at::Tensor x = nn::to_memory_format(torch::randn({4, 1, 64, 64, 64}, at::TensorOptions().device(cuda)),
                                              at::MemoryFormat::ChannelsLast3d);
    const at::Tensor y = (torch::rand({4, 1, 64, 64, 64}, at::TensorOptions().device(cuda)) > 0.7).to(at::kFloat);
    const Loss loss(dice_ce());
    auto pass = [&] {
      at::Tensor range;
      at::Tensor l;
      {
        AutocastGuard autocast(c10::DeviceType::CUDA, precision);
        l = loss(net.forward<at::Tensor>(x).to(at::kFloat), y, &range);
      }
      for (auto& p : net.ptr()->parameters()) p.mutable_grad().reset();
      (precision == Precision::fp16 ? l * 1024.0 : l).backward();
    };
    for (int i = 0; i < 3; ++i) pass();  // cuDNN's autotuning and the allocator settle
    std::vector<test::OpRecorder::Op> ops;
    {
      test::OpRecorder recorder;
      pass();
      torch::cuda::synchronize();
      ops = recorder.ops();
    }
    ASSERT_GT(ops.size(), 50u);
    int backward_ops = 0;
    for (const auto& op : ops) {
      EXPECT_NE(op.name, "aten::contiguous");
      EXPECT_NE(op.name, "aten::clone");
      EXPECT_FALSE(op.same_dtype_copy) << "a copy that keeps the dtype (a layout change)";
      if (op.name.find("backward") != std::string::npos) ++backward_ops;
    }
    EXPECT_GT(backward_ops, 10) << "the backward ops were not recorded";
  }
  // The update on the GPU: libtorch's fused kernel where this libtorch has it (2.3 and later
  // for SGD; foreach before).
  Trainee s;
  s.net.ptr()->to(cuda);
  TrainingStep::Parts parts;
  parts.model = s.net;
  parts.params = nn::unique_tensors(s.net.ptr()->parameters());
  s.optimizer = make_optimizer(parts.params, sgd());
  parts.optimizer = s.optimizer.get();
  parts.optimizer_name = "SGD";
  parts.scaler = &s.scaler;
  parts.loss = &s.loss;
  StepOptions o;
  o.device = cuda;
  TrainingStep step(std::move(parts), o);
  const Batches b(2);
  StageTimes times;
  step.run(b.images[0], b.labels[0], {1, 1, {0}}, times);
  const auto done = step.run(b.images[1], b.labels[1], {1, 2, {1}}, times);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->applied);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  EXPECT_EQ(step.update_kernel(), UpdateKernel::fused);
#else
  EXPECT_EQ(step.update_kernel(), UpdateKernel::foreach);
#endif
  EXPECT_TRUE(step.finish(times).has_value());
}


// A captured step (train.cuda_graph: on) trains as the eager one: the same losses and weights
// over the steps, with SGD and with Adam (fused: its step counts advanced on the device), in
// fp16 (the scaler in the graph) and bf16; captured once, and again when the learning rate
// changes; a batch of another shape is refused naming its step.
TEST(TrainingStepGpu, ACapturedStepTrainsAsTheEagerOne) {
  MEDFAST_REQUIRE_CUDA();
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "libtorch 1.x: no fused Adam to capture";
#endif
  const c10::Device cuda("cuda:0");
  torch::manual_seed(11);
  std::vector<at::Tensor> images, labels;
  for (int i = 0; i < 8; ++i) {
    images.push_back(torch::randn({2, 1, 32, 32, 32}));
    labels.push_back((torch::rand({2, 1, 32, 32, 32}) > 0.7).to(at::kFloat));
  }
  for (const char* name : {"SGD", "Adam"}) {
    for (const Precision precision : {Precision::fp16, Precision::bf16}) {
      SCOPED_TRACE(str(name, " ", precision_name(precision)));
      OptimizerOptions oo = name == std::string("SGD") ? sgd() : OptimizerOptions::defaults(name);
      if (oo.name == "Adam") oo.lr = 1e-3;
      auto train = [&](bool graph, std::vector<double>& losses, int& captures) {
        Trainee t(oo, "none");
        t.net.ptr()->to(cuda);
        nn::set_memory_format(*t.net.ptr(), at::MemoryFormat::ChannelsLast3d);
        t.params = nn::unique_tensors(t.net.ptr()->parameters());
        t.optimizer = make_optimizer(t.params, oo);
        GradScalerOptions so;
        so.enabled = precision == Precision::fp16;
        t.scaler = GradScaler(so);
        TrainingStep::Parts parts;
        parts.model = t.net;
        parts.params = t.params;
        parts.optimizer = t.optimizer.get();
        parts.optimizer_name = oo.name;
        parts.scaler = &t.scaler;
        parts.loss = &t.loss;
        StepOptions o;
        o.device = cuda;
        o.precision = precision;
        o.memory_format = at::MemoryFormat::ChannelsLast3d;
        o.cuda_graph = graph;
        o.eager_before_capture = 2;
        TrainingStep step(std::move(parts), o);
        StageTimes times;
        for (std::size_t i = 0; i < images.size(); ++i) {
          if (i == 6) set_learning_rate(*t.optimizer, learning_rate(*t.optimizer) / 2);  // captured again
          if (auto d = step.run(images[i], labels[i], {1, static_cast<int>(i) + 1, {i}}, times)) losses.push_back(d->loss);
        }
        losses.push_back(step.finish(times)->loss);
        captures = step.captures();
        if (graph) {  // another shape is not what was captured
          const std::string m = test::error_of<ValueError>(
              [&] { step.run(torch::randn({2, 1, 32, 32, 16}), labels[0].narrow(4, 0, 16), {2, 1, {9}}, times); });
          EXPECT_NE(m.find("epoch 2, step 1 (items 9): train.cuda_graph: on replays one captured step"),
                    std::string::npos)
              << m;
        }
        return t.weights();
      };
      std::vector<double> eager_losses, graph_losses;
      int eager_captures = 0, graph_captures = 0;
      const at::Tensor we = train(false, eager_losses, eager_captures);
      const at::Tensor wg = train(true, graph_losses, graph_captures);
      EXPECT_EQ(eager_captures, 0);
      EXPECT_EQ(graph_captures, 2);
      ASSERT_EQ(graph_losses.size(), eager_losses.size());
      for (std::size_t i = 0; i < eager_losses.size(); ++i) {
        EXPECT_NEAR(graph_losses[i], eager_losses[i], 2e-3 * std::abs(eager_losses[i])) << "step " << i + 1;
      }
      EXPECT_LE((wg - we).abs().max().item<double>(), 2e-3 * (we.abs().max().item<double>() + 1));
    }
  }
}

}  // namespace
}  // namespace medfast::train
