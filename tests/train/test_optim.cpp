// Optimizers and learning-rate schedules against tests/golden/make_optim_golden.py
// (torch.optim of PyTorch 1.13, a Novograd written from MONAI 1.3's source,
// torch's PolynomialLR and a LinearWarmupCosineAnnealingLR reimplementation),
// save/load continuation, and the config errors by message.
#include <gtest/gtest.h>

#include <map>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "medfast/core/error.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/update.hpp"
#include "golden_set.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

/// make_optim_golden.py's set (trajectories, schedules).
struct Golden {
  static const test::GoldenSet& get() { return test::GoldenSet::of("make_optim_golden.py"); }
};

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// The optimizer problem of the golden script: initial parameters, per-step gradients.
struct Problem {
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t steps = 0, lr_change_step = 0, numel = 0;
  double lr_factor = 1;
  std::set<std::pair<std::int64_t, std::int64_t>> none_grads;
  std::vector<float> init, grads;

  static Problem load() {
    const auto& m = Golden::get().manifest()["optimizers"];
    Problem p;
    p.shapes = m["shapes"].get<std::vector<std::vector<std::int64_t>>>();
    p.steps = m["steps"];
    p.lr_change_step = m["lr_change_step"];
    p.lr_factor = m["lr_factor"];
    for (const auto& ng : m["none_grads"]) p.none_grads.insert({ng[0].get<std::int64_t>(), ng[1].get<std::int64_t>()});
    p.init = Golden::get().floats(m["params_init"]);
    p.grads = Golden::get().floats(m["grads"]);
    for (const auto& s : p.shapes) p.numel += numel_of(s);
    return p;
  }

  /// Tensors of the parameter shapes cut from `data` (a copy).
  std::vector<at::Tensor> split(const float* data) const {
    std::vector<at::Tensor> out;
    for (const auto& s : shapes) {
      out.push_back(at::from_blob(const_cast<float*>(data), s, at::kFloat).clone());
      data += numel_of(s);
    }
    return out;
  }
  std::vector<at::Tensor> initial_params() const {
    auto ps = split(init.data());
    for (auto& p : ps) p.requires_grad_(true);
    return ps;
  }
  /// Step s as the script takes it, up to the update: the learning rate of that step, its gradients.
  void prepare(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, std::int64_t s, double lr) const {
    set_learning_rate(opt, s >= lr_change_step ? lr * lr_factor : lr);
    const auto g = split(grads.data() + s * numel);
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() =
          none_grads.count({s, static_cast<std::int64_t>(i)}) ? at::Tensor() : g[i];
    }
  }
  /// One optimizer step as the script takes it: prepare(), then step().
  void step(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, std::int64_t s, double lr) const {
    prepare(opt, params, s, lr);
    opt.step();
  }
};

at::Tensor flat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> f;
  for (const auto& t : ts) f.push_back(t.detach().reshape({-1}));
  return at::cat(f);
}

// ---------------------------------------------------------------------------
// Golden trajectories

TEST(OptimGolden, TrajectoriesMatchTorchAndMonai) {
  const Problem pb = Problem::load();
  const auto& cases = Golden::get().manifest()["optimizers"]["cases"];
  ASSERT_EQ(cases.size(), 9u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + " " + c["options"].dump());
    const OptimizerOptions o = OptimizerOptions::from_json(c["options"]);
    auto params = pb.initial_params();
    auto opt = make_optimizer(params, o);
    const auto want = Golden::get().floats(c["file"]);
    ASSERT_EQ(static_cast<std::int64_t>(want.size()), pb.steps * pb.numel);
    double worst = 0;
    for (std::int64_t s = 0; s < pb.steps; ++s) {
      pb.step(*opt, params, s, o.lr);
      const at::Tensor got = flat(params);
      const at::Tensor ref = at::from_blob(const_cast<float*>(want.data() + s * pb.numel), {pb.numel}, at::kFloat);
      // Relative to the magnitude: float32 ops in the same order as torch's, so a few ulps at most.
      const double err = ((got - ref).abs() / (ref.abs() + 1)).max().item<double>();
      worst = std::max(worst, err);
      ASSERT_LE(err, 2e-6) << "step " << s << "\ngot  " << got << "\nwant " << ref;
    }
    // The trajectory must actually move (a no-op optimizer would fail above, but make it explicit).
    EXPECT_GT((flat(params) - flat(pb.initial_params())).abs().max().item<double>(), 1e-3);
    RecordProperty(c["name"].get<std::string>(), str(worst));  // 0 with PyTorch 1.13.1 on x86-64
  }
}

TEST(OptimGolden, SaveLoadContinuesExactly) {
  const Problem pb = Problem::load();
  test::TempDir tmp;
  const std::int64_t cut = 5;  // after the missing gradient (step 3), before the learning-rate change (step 7)
  ASSERT_LT(cut, pb.lr_change_step);
  for (const auto& c : Golden::get().manifest()["optimizers"]["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const OptimizerOptions o = OptimizerOptions::from_json(c["options"]);

    auto straight = pb.initial_params();
    auto opt = make_optimizer(straight, o);
    for (std::int64_t s = 0; s < pb.steps; ++s) pb.step(*opt, straight, s, o.lr);

    auto first = pb.initial_params();
    auto opt1 = make_optimizer(first, o);
    for (std::int64_t s = 0; s < cut; ++s) pb.step(*opt1, first, s, o.lr);
    const std::string file = tmp / (name + ".pt");
    torch::save(*opt1, file);

    // New tensors (new TensorImpl keys) holding the values, as after loading a model checkpoint.
    auto resume = [&](bool load) {
      std::vector<at::Tensor> params;
      for (const auto& p : first) params.push_back(p.detach().clone().requires_grad_(true));
      auto opt2 = make_optimizer(params, o);
      if (load) torch::load(*opt2, file);
      for (std::int64_t s = cut; s < pb.steps; ++s) pb.step(*opt2, params, s, o.lr);
      return flat(params);
    };
    EXPECT_TRUE(at::equal(resume(true), flat(straight)));
    if (name != "sgd") {  // every other case keeps state, so forgetting it must show
      EXPECT_FALSE(at::allclose(resume(false), flat(straight), 1e-6, 1e-7));
    }
  }
}

// ---------------------------------------------------------------------------
// ParameterUpdate: the multi-tensor update the training step runs

/// Every tensor of an optimizer's state, in parameter order, flattened (float64).
at::Tensor state_of(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> parts;
  for (const auto& p : params) {
    const auto it = opt.state().find(optimizer_state_key(p));
    if (it == opt.state().end()) continue;
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) parts.push_back(s->momentum_buffer().reshape({-1}));
    if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      parts.push_back(s->exp_avg().reshape({-1}));
      parts.push_back(s->exp_avg_sq().reshape({-1}));
      parts.push_back(at::full({1}, static_cast<double>(s->step())));
      if (s->max_exp_avg_sq().defined()) parts.push_back(s->max_exp_avg_sq().reshape({-1}));
    }
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      parts.push_back(s->exp_avg().reshape({-1}));
      parts.push_back(s->exp_avg_sq().reshape({-1}));
      parts.push_back(at::full({1}, static_cast<double>(s->step())));
      if (s->max_exp_avg_sq().defined()) parts.push_back(s->max_exp_avg_sq().reshape({-1}));
    }
    if (auto* s = dynamic_cast<NovogradParamState*>(it->second.get())) {
      parts.push_back(s->exp_avg().reshape({-1}));
      parts.push_back(s->exp_avg_sq().reshape({-1}));
      parts.push_back(at::full({1}, static_cast<double>(s->step())));
      if (s->max_exp_avg_sq().defined()) parts.push_back(s->max_exp_avg_sq().reshape({-1}));
    }
  }
  for (auto& t : parts) t = t.to(at::kDouble);
  return parts.empty() ? at::zeros({0}, at::kDouble) : at::cat(parts);
}

/// Relative difference, as OptimGolden measures it.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes()) return std::numeric_limits<double>::infinity();
  if (got.numel() == 0) return 0;
  return ((got.to(at::kDouble) - want.to(at::kDouble)).abs() / (want.to(at::kDouble).abs() + 1)).max().item<double>();
}

// The multi-tensor update (foreach; fused where this libtorch has the kernels for the CPU)
// follows the golden trajectories of torch.optim and MONAI's Novograd, missing gradients and
// the learning-rate change included, and leaves the optimizer's own state as step() does.
TEST(ParameterUpdate, FollowsTheGoldenTrajectoriesWithTheOptimizersOwnState) {
  const Problem pb = Problem::load();
  for (const auto& c : Golden::get().manifest()["optimizers"]["cases"]) {
    for (const UpdateKernel kernel : {UpdateKernel::foreach, UpdateKernel::fused}) {
      SCOPED_TRACE(c["name"].get<std::string>() + " " + update_kernel_name(kernel));
      const OptimizerOptions o = OptimizerOptions::from_json(c["options"]);
      auto params = pb.initial_params();
      auto opt = make_optimizer(params, o);
      ParameterUpdate update(*opt, o.name, kernel);
      auto ref_params = pb.initial_params();
      auto ref = make_optimizer(ref_params, o);
      const auto want = Golden::get().floats(c["file"]);
      for (std::int64_t s = 0; s < pb.steps; ++s) {
        pb.prepare(*opt, params, s, o.lr);
        update.apply();
        pb.step(*ref, ref_params, s, o.lr);
        const at::Tensor golden =
            at::from_blob(const_cast<float*>(want.data() + s * pb.numel), {pb.numel}, at::kFloat);
        // Novograd's norms come from one multi-tensor norm (sqrt, then squared): a few ulps more.
        const double tolerance = o.name == "Novograd" ? 2e-5 : 2e-6;
        ASSERT_LE(relative_error(flat(params), golden), tolerance) << "step " << s;
        ASSERT_LE(relative_error(state_of(*opt, params), state_of(*ref, ref_params)), tolerance) << "step " << s;
      }
      if (kernel == UpdateKernel::foreach) EXPECT_EQ(update.kernel(), UpdateKernel::foreach);
      RecordProperty(c["name"].get<std::string>() + "_" + update_kernel_name(kernel), update_kernel_name(update.kernel()));
    }
  }
}

// A step flagged to skip changes nothing: not the parameters, not the state, also with NaN
// gradients and also on the step that would create the state; skipped() puts back what the
// host keeps (step counts, SGD's first momentum step), so the run goes on exactly as one
// without that step. Both ways: the flag read on the host (the CPU), and put back on the
// device (a GPU's way, run here on the CPU).
TEST(ParameterUpdate, AFlaggedStepIsSkippedAndTheRunGoesOnAsWithoutIt) {
  const Problem pb = Problem::load();
  for (const auto& c : Golden::get().manifest()["optimizers"]["cases"]) {
    for (const bool on_device : {false, true}) {
      for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{5}}) {
        SCOPED_TRACE(c["name"].get<std::string>() + (on_device ? " device" : " host") + " bad step " + str(bad));
        const OptimizerOptions o = OptimizerOptions::from_json(c["options"]);
        // The same steps without the flagged one (an extra step before step `bad`, its gradients NaN).
        auto want_params = pb.initial_params();
        auto want_opt = make_optimizer(want_params, o);
        ParameterUpdate want_update(*want_opt, o.name, UpdateKernel::foreach);
        auto params = pb.initial_params();
        auto opt = make_optimizer(params, o);
        ParameterUpdate update(*opt, o.name);
        update.set_device_skip_on_cpu(on_device);
        const at::Tensor clean = at::zeros({1}), flagged = at::ones({1});
        for (std::int64_t s = 0; s < pb.steps; ++s) {
          if (s == bad) {
            const at::Tensor before = flat(params), state_before = state_of(*opt, params);
            pb.prepare(*opt, params, s, o.lr);
            for (auto& p : params) {
              if (p.grad().defined()) p.mutable_grad().fill_(std::nan(""));
            }
            update.apply(flagged);
            EXPECT_TRUE(at::equal(flat(params), before)) << "parameters changed by a skipped step";
            update.skipped();
            EXPECT_TRUE(at::equal(state_of(*opt, params), state_before)) << "state changed by a skipped step";
          }
          pb.prepare(*opt, params, s, o.lr);
          update.apply(clean);
          pb.prepare(*want_opt, want_params, s, o.lr);
          want_update.apply();
          ASSERT_LE(relative_error(flat(params), flat(want_params)), 2e-6) << "step " << s;
          ASSERT_LE(relative_error(state_of(*opt, params), state_of(*want_opt, want_params)), 2e-6) << "step " << s;
        }
      }
    }
  }
  // The per-parameter update skips after reading the flag, and only on the host.
  auto p = torch::ones({2}, torch::requires_grad());
  auto opt = make_optimizer({p}, OptimizerOptions::defaults("SGD"));
  ParameterUpdate per(*opt, "SGD", UpdateKernel::per_parameter);
  p.mutable_grad() = torch::ones({2});
  per.apply(at::ones({1}));
  EXPECT_TRUE(at::equal(p, torch::ones({2})));
  per.apply(at::zeros({1}));
  EXPECT_FALSE(at::equal(p, torch::ones({2})));
  EXPECT_EQ(per.kernel(), UpdateKernel::per_parameter);
  EXPECT_THROW(ParameterUpdate(*opt, "Lion"), ValueError);
}

// After the multi-tensor update, the optimizer saves and loads as ever, and step() goes on.
TEST(ParameterUpdate, ItsStateSavesAndContinuesWithStep) {
  const Problem pb = Problem::load();
  test::TempDir tmp;
  for (const auto& c : Golden::get().manifest()["optimizers"]["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const OptimizerOptions o = OptimizerOptions::from_json(c["options"]);
    auto params = pb.initial_params();
    auto opt = make_optimizer(params, o);
    ParameterUpdate update(*opt, o.name);
    for (std::int64_t s = 0; s < 6; ++s) {
      pb.prepare(*opt, params, s, o.lr);
      update.apply();
    }
    torch::save(*opt, tmp / "o.pt");
    std::vector<at::Tensor> resumed;
    for (const auto& p : params) resumed.push_back(p.detach().clone().requires_grad_(true));
    auto opt2 = make_optimizer(resumed, o);
    torch::load(*opt2, tmp / "o.pt");
    for (std::int64_t s = 6; s < pb.steps; ++s) pb.step(*opt2, resumed, s, o.lr);
    const auto want = Golden::get().floats(c["file"]);
    const at::Tensor golden =
        at::from_blob(const_cast<float*>(want.data() + (pb.steps - 1) * pb.numel), {pb.numel}, at::kFloat);
    EXPECT_LE(relative_error(flat(resumed), golden), o.name == "Novograd" ? 2e-5 : 2e-6);
  }
}

// What a captured update (train.cuda_graph) needs, on the CPU: which updates can be captured;
// the fused Adam with its step counts on the device (prepare_capture) follows the golden
// trajectory; a replay advances the host's counts as an apply does, and skipped() puts them back.
TEST(ParameterUpdate, CapturedUpdatesKeepTheirCounts) {
  const Problem pb = Problem::load();
  for (const auto& c : Golden::get().manifest()["optimizers"]["cases"]) {
    const OptimizerOptions o = OptimizerOptions::from_json(c["options"]);
    SCOPED_TRACE(c["name"].get<std::string>());
    auto params = pb.initial_params();
    auto opt = make_optimizer(params, o);
    ParameterUpdate update(*opt, o.name);
    pb.prepare(*opt, params, 0, o.lr);
    update.apply();
    const bool adam = o.name == "Adam" || o.name == "AdamW";
    EXPECT_EQ(update.capturable(), !adam || update.kernel() == UpdateKernel::fused) << update_kernel_name(update.kernel());
    if (adam && update.capturable()) {  // libtorch >= 2.4 on the CPU: the device's counts
      update.prepare_capture();
      for (std::int64_t s = 1; s < pb.steps; ++s) {
        pb.prepare(*opt, params, s, o.lr);
        update.apply();
      }
      const auto want = Golden::get().floats(c["file"]);
      const at::Tensor golden =
          at::from_blob(const_cast<float*>(want.data() + (pb.steps - 1) * pb.numel), {pb.numel}, at::kFloat);
      EXPECT_LE(relative_error(flat(params), golden), 2e-6);
    }
    if (o.name == "SGD") continue;  // no counts
    auto count = [&] {
      const auto& st = *opt->state().at(optimizer_state_key(params[0]));
      if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&st)) return a->step();
      if (auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) return w->step();
      return dynamic_cast<const NovogradParamState&>(st).step();
    };
    const std::int64_t before = count();
    update.replayed();
    EXPECT_EQ(count(), before + 1);
    update.skipped();
    EXPECT_EQ(count(), before);
    update.replayed();
    update.replayed();
    EXPECT_EQ(count(), before + 2);
  }
}

TEST(OptimNovograd, StateHasScalarSecondMomentAndRoundTrips) {
  auto p = torch::ones({2, 3}, torch::requires_grad());
  Novograd opt({p}, NovogradOptions(0.1).amsgrad(true));
  p.mutable_grad() = torch::full({2, 3}, 2.0);
  opt.step();
  ASSERT_EQ(opt.state().size(), 1u);
  const auto& st = static_cast<const NovogradParamState&>(*opt.state().begin()->second);
  EXPECT_EQ(st.step(), 1);
  EXPECT_EQ(st.exp_avg_sq().dim(), 0);
  EXPECT_FLOAT_EQ(st.exp_avg_sq().item<float>(), 24.0f);  // ||g||^2 taken as is on the first step
  EXPECT_FLOAT_EQ(st.max_exp_avg_sq().item<float>(), 24.0f);
  // m = g / (sqrt(24) + eps); p = 1 - 0.1 m
  EXPECT_NEAR(p[0][0].item<double>(), 1 - 0.1 * 2 / (std::sqrt(24.0) + 1e-8), 1e-6);
  // Gradients are left as they were (MONAI divides them in place).
  EXPECT_TRUE(at::equal(p.grad(), torch::full({2, 3}, 2.0)));

  test::TempDir tmp;
  torch::save(opt, tmp / "n.pt");
  auto q = p.detach().clone().requires_grad_(true);
  Novograd loaded({q}, NovogradOptions(0.1).amsgrad(true));
  torch::load(loaded, tmp / "n.pt");
  ASSERT_EQ(loaded.state().size(), 1u);
  const auto& lst = static_cast<const NovogradParamState&>(*loaded.state().begin()->second);
  EXPECT_EQ(lst.step(), 1);
  EXPECT_TRUE(at::equal(lst.exp_avg(), st.exp_avg()));
  EXPECT_TRUE(at::equal(lst.exp_avg_sq(), st.exp_avg_sq()));
  EXPECT_TRUE(at::equal(lst.max_exp_avg_sq(), st.max_exp_avg_sq()));
}

TEST(OptimNovograd, RejectsBadArguments) {
  auto p = torch::ones({2}, torch::requires_grad());
  EXPECT_EQ(test::value_error_of([&] { Novograd({p}, NovogradOptions(0.1).betas({0.9, 1.0})); }),
            "Novograd: betas[1] must be in [0, 1) (got 1)");
  EXPECT_THROW(Novograd({p}, NovogradOptions(-1)), ValueError);
}

// ---------------------------------------------------------------------------
// Options

OptimizerOptions opt_json(const char* text) { return OptimizerOptions::from_json(nlohmann::json::parse(text)); }

TEST(OptimConfig, FromJsonDefaultsAndNames) {
  const auto sgd = opt_json(R"({"name": "SGD", "lr": 0.01, "momentum": 0.99, "nesterov": true, "weight_decay": 3e-5})");
  EXPECT_EQ(sgd.name, "SGD");
  EXPECT_DOUBLE_EQ(sgd.lr, 0.01);
  EXPECT_DOUBLE_EQ(sgd.momentum, 0.99);
  EXPECT_TRUE(sgd.nesterov);
  EXPECT_DOUBLE_EQ(sgd.weight_decay, 3e-5);

  const auto adamw = opt_json(R"({"name": "adamw", "lr": 1e-4})");
  EXPECT_EQ(adamw.name, "AdamW");
  EXPECT_DOUBLE_EQ(adamw.weight_decay, kAdamWWeightDecay);
  EXPECT_DOUBLE_EQ(opt_json(R"({"name": "AdamW", "weight_decay": 0})").weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(opt_json(R"({"name": "Adam"})").weight_decay, 0.0);

  const auto nova = opt_json(R"({"name": "Novograd", "grad_averaging": true})");
  EXPECT_DOUBLE_EQ(nova.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(nova.betas[1], kNovogradBeta2);
  EXPECT_TRUE(nova.grad_averaging);
  const auto betas = opt_json(R"({"name": "Adam", "betas": [0.5, 0.75], "eps": 1e-6, "amsgrad": true})");
  EXPECT_DOUBLE_EQ(betas.betas[0], 0.5);
  EXPECT_DOUBLE_EQ(betas.betas[1], 0.75);
  EXPECT_DOUBLE_EQ(betas.eps, 1e-6);
  EXPECT_TRUE(betas.amsgrad);
}

// Each optimizer and schedule is a row of a table plus the fields marked with its name:
// what it reads, writes back and documents comes from that one list.
TEST(OptimConfig, WrittenBackWholeFromItsFieldListPerKind) {
  EXPECT_EQ(optimizer_names(), (std::vector<std::string>{"SGD", "Adam", "AdamW", "Novograd"}));
  const std::map<std::string, std::vector<std::string>> keys = {
      {"SGD", {"lr", "momentum", "dampening", "weight_decay", "nesterov"}},
      {"Adam", {"lr", "betas", "eps", "weight_decay", "amsgrad"}},
      {"AdamW", {"lr", "betas", "eps", "weight_decay", "amsgrad"}},
      {"Novograd", {"lr", "betas", "eps", "weight_decay", "grad_averaging", "amsgrad"}}};
  for (const auto& name : optimizer_names()) {
    EXPECT_EQ(field_keys<OptimizerOptions>(name), keys.at(name)) << name;
    const OptimizerOptions o = OptimizerOptions::from_json({{"name", name}});
    nlohmann::json j = fields_json(o, name);
    EXPECT_EQ(j.size(), keys.at(name).size()) << name;  // every argument of its own, defaults included
    j["name"] = name;
    const OptimizerOptions again = OptimizerOptions::from_json(j);
    EXPECT_EQ(fields_json(again, name), fields_json(o, name)) << name;
    EXPECT_EQ(field_docs(OptimizerOptions::defaults(name), name).size(), keys.at(name).size()) << name;
    EXPECT_NE(make_optimizer({torch::ones({2}, torch::requires_grad())}, o), nullptr) << name;
  }
  EXPECT_EQ(fields_json(OptimizerOptions::defaults("AdamW"), "AdamW")["weight_decay"], kAdamWWeightDecay);
  EXPECT_EQ(fields_json(OptimizerOptions::defaults("Novograd"), "Novograd")["betas"][1], kNovogradBeta2);
  EXPECT_THROW(OptimizerOptions::defaults("Adagrad"), ValueError);

  EXPECT_EQ(schedule_names(), (std::vector<std::string>{"constant", "warmup_cosine", "poly"}));
  EXPECT_TRUE(field_keys<ScheduleOptions>("constant").empty());
  EXPECT_EQ(field_keys<ScheduleOptions>("poly"), std::vector<std::string>{"power"});
  const ScheduleOptions w =
      ScheduleOptions::from_json(nlohmann::json::parse(R"({"name": "warmup_cosine", "warmup_epochs": 3})"));
  nlohmann::json wj = fields_json(w, w.name);
  EXPECT_EQ(wj, nlohmann::json::parse(R"({"warmup_epochs": 3, "warmup_start_lr": 0.0, "eta_min": 0.0})"));
  wj["name"] = "warmup_cosine";
  EXPECT_EQ(scheduled_lr(ScheduleOptions::from_json(wj), 0.1, 5, 10), scheduled_lr(w, 0.1, 5, 10));
}

TEST(OptimConfig, ErrorsByMessage) {
  auto err = [](const char* text, const std::string& where = "optimizer") {
    return test::value_error_of([&] { OptimizerOptions::from_json(nlohmann::json::parse(text), where); });
  };
  EXPECT_EQ(err(R"({"name": "Adamax"})"), "optimizer.name: unknown optimizer 'Adamax' (expected SGD, Adam, AdamW, Novograd)");
  // No name: Adam (docs/config.md), its other arguments as given.
  const OptimizerOptions unnamed = OptimizerOptions::from_json(nlohmann::json::parse(R"({"lr": 0.1})"), "optimizer");
  EXPECT_EQ(unnamed.name, "Adam");
  EXPECT_DOUBLE_EQ(unnamed.lr, 0.1);
  EXPECT_EQ(err(R"("SGD")"), "optimizer: expected a mapping with a 'name' (SGD, Adam, AdamW, Novograd)");
  EXPECT_EQ(err(R"({"name": 3})"), "optimizer.name: expected a string (SGD, Adam, AdamW, Novograd), got 3");
  EXPECT_EQ(err(R"({"name": "Adam", "momentum": 0.9})"),
            "optimizer.momentum: unknown argument for Adam (known: lr, betas, eps, weight_decay, amsgrad)");
  EXPECT_EQ(err(R"({"name": "SGD", "amsgrad": true})"),
            "optimizer.amsgrad: unknown argument for SGD (known: lr, momentum, dampening, weight_decay, nesterov)");
  EXPECT_EQ(err(R"({"name": "Novograd", "nesterov": true})", "train.yaml: optimizer"),
            "train.yaml: optimizer.nesterov: unknown argument for Novograd (known: lr, betas, eps, weight_decay, "
            "grad_averaging, amsgrad)");
  EXPECT_EQ(err(R"({"name": "SGD", "lr": 0.1, "nesterov": true})"),
            "optimizer: SGD: nesterov needs momentum > 0 and dampening 0 (got momentum 0, dampening 0)");
  EXPECT_EQ(err(R"({"name": "SGD", "momentum": 0.9, "dampening": 0.1, "nesterov": true})"),
            "optimizer: SGD: nesterov needs momentum > 0 and dampening 0 (got momentum 0.9, dampening 0.1)");
  EXPECT_EQ(err(R"({"name": "SGD", "lr": -0.1})"), "optimizer: SGD: lr must be >= 0 (got -0.1)");
  EXPECT_EQ(err(R"({"name": "SGD", "lr": "fast"})"), "optimizer.lr: expected a number, got \"fast\"");
  EXPECT_EQ(err(R"({"name": "SGD", "nesterov": 1})"), "optimizer.nesterov: expected true or false, got 1");
  EXPECT_EQ(err(R"({"name": "Adam", "betas": [0.9]})"), "optimizer.betas: expected a list of 2 numbers, got [0.9]");
  EXPECT_EQ(err(R"({"name": "Adam", "betas": [0.9, 1.0]})"), "optimizer: Adam: betas[1] must be in [0, 1) (got 1)");
  EXPECT_EQ(err(R"({"name": "AdamW", "weight_decay": -1})"), "optimizer: AdamW: weight_decay must be >= 0 (got -1)");
  EXPECT_EQ(err(R"({"name": "Novograd", "eps": -1e-8})"), "optimizer: Novograd: eps must be >= 0 (got -1e-08)");

  OptimizerOptions bad;
  bad.name = "LBFGS";
  EXPECT_EQ(test::value_error_of([&] { bad.validate(); }),
            "optimizer name: unknown optimizer 'LBFGS' (expected SGD, Adam, AdamW, Novograd)");
  EXPECT_EQ(test::value_error_of([&] { make_optimizer({torch::ones({1})}, bad); }),
            "optimizer name: unknown optimizer 'LBFGS' (expected SGD, Adam, AdamW, Novograd)");
}

TEST(OptimConfig, MakeOptimizerBuildsTheNamedKind) {
  const std::vector<at::Tensor> params = {torch::ones({3}, torch::requires_grad())};
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(make_optimizer(params, opt_json(R"({"name": "SGD"})")).get()), nullptr);
  EXPECT_NE(dynamic_cast<torch::optim::Adam*>(make_optimizer(params, opt_json(R"({"name": "Adam"})")).get()), nullptr);
  auto adamw = make_optimizer(params, opt_json(R"({"name": "AdamW", "lr": 0.5})"));
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(adamw.get()), nullptr);
  const auto& ao = static_cast<const torch::optim::AdamWOptions&>(adamw->defaults());
  EXPECT_DOUBLE_EQ(ao.lr(), 0.5);
  EXPECT_DOUBLE_EQ(ao.weight_decay(), kAdamWWeightDecay);
  auto nova = make_optimizer(params, opt_json(R"({"name": "Novograd", "betas": [0.8, 0.9], "amsgrad": true})"));
  ASSERT_NE(dynamic_cast<Novograd*>(nova.get()), nullptr);
  const auto& no = static_cast<const NovogradOptions&>(nova->defaults());
  EXPECT_EQ(no.betas(), std::make_tuple(0.8, 0.9));
  EXPECT_TRUE(no.amsgrad());
}

TEST(OptimConfig, SetLearningRateReachesEveryGroup) {
  for (const char* name : {"SGD", "Adam", "AdamW", "Novograd"}) {
    SCOPED_TRACE(name);
    OptimizerOptions o;
    o.name = name;
    o.lr = 0.1;
    auto opt = make_optimizer({torch::ones({2}, torch::requires_grad())}, o);
    opt->add_param_group(torch::optim::OptimizerParamGroup({torch::ones({3}, torch::requires_grad())}));
    ASSERT_EQ(opt->param_groups().size(), 2u);
    set_learning_rate(*opt, 0.025);
    for (const auto& g : opt->param_groups()) EXPECT_DOUBLE_EQ(g.options().get_lr(), 0.025);
    EXPECT_DOUBLE_EQ(learning_rate(*opt), 0.025);
  }
  auto opt = make_optimizer({torch::ones({2})}, OptimizerOptions{});
  EXPECT_EQ(test::value_error_of([&] { set_learning_rate(*opt, -1); }), "set_learning_rate: lr must be >= 0 (got -1)");
}

// ---------------------------------------------------------------------------
// Schedules

TEST(ScheduleGolden, MatchesTorchPolynomialLRAndWarmupCosine) {
  const auto& cases = Golden::get().manifest()["schedules"];
  ASSERT_EQ(cases.size(), 9u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.dump());
    const ScheduleOptions o = ScheduleOptions::from_json(c["options"]);
    const double lr = c["lr"];
    const std::int64_t max_epochs = c["max_epochs"];
    const auto lrs = c["lrs"].get<std::vector<double>>();
    const auto formula = c["formula"].get<std::vector<double>>();
    ASSERT_EQ(lrs.size(), formula.size());
    for (std::size_t e = 0; e < lrs.size(); ++e) {
      const double got = scheduled_lr(o, lr, static_cast<std::int64_t>(e), max_epochs);
      EXPECT_DOUBLE_EQ(got, formula[e]) << "epoch " << e;  // the same closed form, term by term
      EXPECT_NEAR(got, lrs[e], 1e-12 * lr) << "epoch " << e;  // the reference schedulers, stepped per epoch
    }
  }
}

TEST(ScheduleConfig, ConstantAndShapes) {
  const auto constant = ScheduleOptions::from_json("constant");
  for (int e : {0, 5, 99}) EXPECT_EQ(scheduled_lr(constant, 0.01, e, 10), 0.01);
  EXPECT_EQ(ScheduleOptions::from_json(nlohmann::json{{"name", "constant"}}).name, "constant");

  const auto wc = ScheduleOptions::from_json(
      nlohmann::json::parse(R"({"name": "Warmup_Cosine", "warmup_epochs": 50, "warmup_start_lr": 0, "eta_min": 0})"));
  EXPECT_EQ(wc.name, "warmup_cosine");
  EXPECT_EQ(wc.warmup_epochs, 50);
  EXPECT_DOUBLE_EQ(scheduled_lr(wc, 1e-4, 0, 500), 0.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(wc, 1e-4, 49, 500), 1e-4);
  EXPECT_DOUBLE_EQ(scheduled_lr(wc, 1e-4, 50, 500), 1e-4);
  EXPECT_NEAR(scheduled_lr(wc, 1e-4, 275, 500), 0.5e-4, 1e-18);
  EXPECT_LT(scheduled_lr(wc, 1e-4, 499, 500), 1e-8);

  const auto poly = ScheduleOptions::from_json(nlohmann::json::parse(R"({"name": "poly"})"));
  EXPECT_DOUBLE_EQ(poly.power, 0.9);
  EXPECT_DOUBLE_EQ(scheduled_lr(poly, 0.01, 0, 100), 0.01);
  EXPECT_DOUBLE_EQ(scheduled_lr(poly, 0.01, 50, 100), 0.01 * std::pow(0.5, 0.9));
  EXPECT_EQ(scheduled_lr(poly, 0.01, 100, 100), 0.0);
  EXPECT_EQ(scheduled_lr(poly, 0.01, 150, 100), 0.0);
}

TEST(ScheduleConfig, ErrorsByMessage) {
  auto err = [](const nlohmann::json& j) { return test::value_error_of([&] { ScheduleOptions::from_json(j); }); };
  using nlohmann::json;
  EXPECT_EQ(err(json::parse(R"({"name": "cosine"})")),
            "schedule.name: unknown schedule 'cosine' (expected constant, warmup_cosine, poly)");
  EXPECT_EQ(err(json::parse(R"({"power": 2})")),
            "schedule: expected a name or a mapping with a 'name' (constant, warmup_cosine, poly)");
  EXPECT_EQ(err(json::parse(R"({"name": "poly", "warmup_epochs": 3})")),
            "schedule.warmup_epochs: unknown argument for poly (known: power)");
  EXPECT_EQ(err(json::parse(R"({"name": "constant", "power": 3})")),
            "schedule.power: unknown argument for constant (it takes none)");
  EXPECT_EQ(err(json::parse(R"({"name": "warmup_cosine", "warmup_epochs": 2.5})")),
            "schedule.warmup_epochs: expected a whole number, got 2.5");
  EXPECT_EQ(ScheduleOptions::from_json(json::parse(R"({"name": "warmup_cosine", "warmup_epochs": 2.0})")).warmup_epochs, 2);
  EXPECT_EQ(err(json::parse(R"({"name": "warmup_cosine", "warmup_epochs": -1})")),
            "schedule: warmup_cosine: warmup_epochs must be >= 0 (got -1)");
  EXPECT_EQ(err(json::parse(R"({"name": "poly", "power": 0})")), "schedule: poly: power must be > 0 (got 0)");

  ScheduleOptions wc;
  wc.name = "warmup_cosine";
  wc.warmup_epochs = 10;
  EXPECT_EQ(test::value_error_of([&] { scheduled_lr(wc, 0.1, 0, 10); }),
            "warmup_cosine: warmup_epochs (10) must be below the number of epochs (10)");
  EXPECT_EQ(test::value_error_of([&] { scheduled_lr(wc, 0.1, -1, 100); }), "scheduled_lr: epoch must be >= 0 (got -1)");
  EXPECT_EQ(test::value_error_of([&] { scheduled_lr(ScheduleOptions{}, 0.1, 0, 0); }),
            "scheduled_lr: max_epochs must be >= 1 (got 0)");
}

}  // namespace
}  // namespace medfast::train
