#pragma once
/// \file
/// Optimizers and learning-rate schedules from a config's `optimizer` and `schedule` sections:
///
///   optimizer: {name: SGD, lr: 0.01, momentum: 0.99, nesterov: true, weight_decay: 3.0e-5}
///   optimizer: {name: AdamW, lr: 1.0e-4, weight_decay: 1.0e-5}
///   optimizer: {name: Novograd, lr: 1.0e-3, betas: [0.9, 0.98], grad_averaging: true}
///   schedule:  {name: warmup_cosine, warmup_epochs: 50}
///   schedule:  {name: poly, power: 0.9}
///
/// SGD, Adam and AdamW are libtorch's (the same arithmetic as torch.optim in
/// PyTorch 1.13); Novograd is MONAI 1.3's. Argument names are torch's; each
/// optimizer accepts only its own arguments, so a `momentum` given to Adam is
/// an error rather than silently ignored.
///
/// Schedules are closed forms of the epoch number: the trainer sets the rate
/// at the start of every epoch with set_learning_rate(opt, scheduled_lr(...)),
/// and a resumed run needs nothing but the epoch it resumes at.

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "medfast/core/fields.hpp"

namespace medfast::train {

/// Default Novograd betas (MONAI's), which from_json applies when a Novograd config gives none.
inline constexpr double kNovogradBeta2 = 0.98;
/// Default AdamW weight decay (torch's), which from_json applies when an AdamW config gives none.
inline constexpr double kAdamWWeightDecay = 1e-2;

/// The optimizer a config names, with torch's argument names. Each argument is declared
/// once in fields(), with the optimizers it belongs to: reading, writing back
/// (fields_json(o, o.name)) and the docs' key table come from that list.
/// The optimizer of a config whose `optimizer` section is absent or names none.
inline constexpr const char* kDefaultOptimizer = "Adam";

struct OptimizerOptions {
  std::string name = "SGD";  ///< SGD | Adam | AdamW | Novograd (the table in optim.cpp)
  double lr = 1e-4, momentum = 0.0, dampening = 0.0;
  std::array<double, 2> betas{0.9, 0.999};  ///< Adam, AdamW, Novograd
  double eps = 1e-8, weight_decay = 0.0;
  bool nesterov = false;        ///< SGD
  bool grad_averaging = false;  ///< Novograd
  bool amsgrad = false;         ///< Adam, AdamW, Novograd

  static constexpr auto fields() {
    using O = OptimizerOptions;
    constexpr const char* adams = "Adam,AdamW,Novograd";
    return std::make_tuple(field("lr", &O::lr, "learning rate"),
                           field("momentum", &O::momentum, "momentum factor").in("SGD"),
                           field("dampening", &O::dampening, "dampening of the momentum").in("SGD"),
                           field("betas", &O::betas, "running-average coefficients [b1, b2]").in(adams),
                           field("eps", &O::eps, "added to the denominator").in(adams),
                           field("weight_decay", &O::weight_decay, "L2 penalty (AdamW: decoupled)"),
                           field("nesterov", &O::nesterov, "Nesterov momentum").in("SGD"),
                           field("grad_averaging", &O::grad_averaging, "scale the gradient by 1 - b1").in("Novograd"),
                           field("amsgrad", &O::amsgrad, "the AMSGrad variant").in(adams));
  }
  /// The defaults of optimizer `name` (canonical spelling): AdamW's weight_decay is
  /// kAdamWWeightDecay and Novograd's betas[1] kNovogradBeta2, as in torch and MONAI.
  /// ValueError for an unknown name.
  static OptimizerOptions defaults(const std::string& name);
  /// Throws ValueError naming the argument and its value: an unknown name, a
  /// negative lr/eps/weight_decay/momentum/dampening, betas outside [0, 1), or
  /// nesterov without momentum or with dampening (torch's rules). Fields the
  /// named optimizer does not use are ignored here; from_json rejects them.
  void validate() const;
  /// Reads a mapping {name, lr, ...}; `name` is required (matched ignoring
  /// case). Unknown keys, arguments of another optimizer and wrong types are
  /// ValueErrors naming `where`.key. Absent arguments take defaults(name).
  /// The result is validated.
  static OptimizerOptions from_json(const nlohmann::json& j, const std::string& where = "optimizer");
};

/// The optimizers make_optimizer knows, in the table's order.
std::vector<std::string> optimizer_names();

/// MONAI 1.3's Novograd options (monai/optimizers/novograd.py).
struct NovogradOptions : public torch::optim::OptimizerCloneableOptions<NovogradOptions> {
  NovogradOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): libtorch's serializer builds it from lr
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, kNovogradBeta2);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, grad_averaging) = false;
  TORCH_ARG(bool, amsgrad) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Novograd's per-parameter state: the first moment per element, the second
/// moment of the gradient's squared norm as one scalar per parameter tensor.
struct NovogradParamState : public torch::optim::OptimizerCloneableParamState<NovogradParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  TORCH_ARG(at::Tensor, max_exp_avg_sq) = {};

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Novograd (Ginsburg et al. 2019, arXiv:1905.11286) step for step as MONAI 1.3
/// computes it: per parameter tensor v = ||g||^2 (the first nonzero value taken
/// as is, then v = b2 v + (1 - b2) ||g||^2; the running maximum of v with
/// amsgrad), g' = g / (sqrt(v) + eps) + weight_decay * p, times (1 - b1) with
/// grad_averaging, m = b1 m + g', p -= lr m.
///
/// One difference: MONAI divides p.grad in place; here the gradients are left
/// as they were, which changes nothing unless gradients are accumulated across
/// steps without zero_grad(). State save()/load() round-trips like libtorch's Adam.
class Novograd : public torch::optim::Optimizer {
 public:
  explicit Novograd(std::vector<torch::optim::OptimizerParamGroup> param_groups, NovogradOptions defaults = {});
  explicit Novograd(std::vector<at::Tensor> params, NovogradOptions defaults = {})
      : Novograd({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    torch::optim::serialize<NovogradParamState, NovogradOptions>(archive, self);
  }
};

/// The optimizer `options` describe (validated first) over `params`.
///
/// Checkpoints: torch::save(*opt, path) / torch::load(*opt, path) round-trip
/// the per-parameter state (momentum buffers, moments, step counts), matched
/// to the new optimizer's parameters by position. As everywhere in libtorch,
/// load() does not restore the parameter groups' options: set the learning
/// rate after loading (scheduled_lr gives it from the epoch).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<at::Tensor> params, const OptimizerOptions& options);

/// The key of parameter `p` in torch::optim::Optimizer::state(): its TensorImpl's
/// address as text in libtorch 1.13, the address itself in 2.x.
using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
OptimizerStateKey optimizer_state_key(const at::Tensor& p);

/// Reads an optimizer's state (torch::optim's archive, as Optimizer::save writes it)
/// into `optimizer`, whichever libtorch version wrote it: libtorch 2.x's own
/// Optimizer::load mismatches the state of a 1.13 archive (see optim.cpp).
/// State goes to parameters by position; the groups' options are restored.
/// Throws ValueError when the group or parameter counts differ.
void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive);

/// Calls f(parameter, state tensor) for every tensor of the per-parameter state of
/// `optimizer` (momentum buffers, moments; SGD, Adam, AdamW, Novograd), so that it may
/// replace it (f takes it by reference).
void for_each_state_tensor(torch::optim::Optimizer& optimizer,
                           const std::function<void(const at::Tensor& parameter, at::Tensor& state)>& f);

/// Each state tensor shaped as its parameter laid out as the parameter is (after loading
/// a checkpoint written in another layout: nn/layout.hpp), so that the update's operations
/// see one layout.
void lay_out_state_as_parameters(torch::optim::Optimizer& optimizer);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// The learning rate of the first parameter group.
double learning_rate(const torch::optim::Optimizer& optimizer);

/// A learning-rate schedule over epochs.
struct ScheduleOptions {
  std::string name = "constant";  ///< constant | warmup_cosine | poly (the table in optim.cpp)
  /// warmup_cosine: epochs of linear warmup from warmup_start_lr to lr, then a
  /// cosine from lr to eta_min at max_epochs, as LinearWarmupCosineAnnealingLR
  /// (Lightning Bolts, used by MONAI's SwinUNETR tutorials) stepped per epoch.
  std::int64_t warmup_epochs = 0;
  double warmup_start_lr = 0.0, eta_min = 0.0;
  double power = 0.9;  ///< poly: lr * (1 - epoch / max_epochs) ** power, as torch's PolynomialLR

  static constexpr auto fields() {
    using O = ScheduleOptions;
    return std::make_tuple(
        field("warmup_epochs", &O::warmup_epochs, "epochs of linear warmup").in("warmup_cosine"),
        field("warmup_start_lr", &O::warmup_start_lr, "learning rate of the first warmup epoch").in("warmup_cosine"),
        field("eta_min", &O::eta_min, "learning rate at the last epoch").in("warmup_cosine"),
        field("power", &O::power, "exponent of the decay").in("poly"));
  }
  /// Throws ValueError naming the argument: unknown name, negative
  /// warmup_epochs/warmup_start_lr/eta_min, or power <= 0. Fields the named
  /// schedule does not use are ignored here; from_json rejects them.
  void validate() const;
  /// Reads a mapping {name, ...} (name required, lower case) or a bare name;
  /// unknown keys and wrong types are ValueErrors naming `where`.key.
  static ScheduleOptions from_json(const nlohmann::json& j, const std::string& where = "schedule");
};

/// The schedules scheduled_lr knows, in the table's order.
std::vector<std::string> schedule_names();

/// Learning rate for `epoch` (0-based) of `max_epochs` with base `lr`. Closed
/// form, so resuming needs no state. warmup_cosine: epoch e < warmup_epochs
/// gives warmup_start_lr + e (lr - warmup_start_lr) / (warmup_epochs - 1) (so
/// both epochs warmup_epochs - 1 and warmup_epochs run at lr, as the reference
/// does), later epochs eta_min + (lr - eta_min) (1 + cos(pi (e - warmup_epochs)
/// / (max_epochs - warmup_epochs))) / 2. poly stays at 0 from max_epochs on.
/// Throws ValueError for epoch < 0, max_epochs < 1, or warmup_epochs >= max_epochs.
double scheduled_lr(const ScheduleOptions& s, double lr, std::int64_t epoch, std::int64_t max_epochs);

}  // namespace medfast::train
