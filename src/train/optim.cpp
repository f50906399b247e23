#include "medfast/train/optim.hpp"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/registry.hpp"

namespace medfast::train {

namespace {

/// torch::optim::Optimizer keys its per-parameter state by the parameter's
/// TensorImpl: a string of the address in libtorch 1.13 (c10::guts::to_string),
/// the address itself in 2.x. The key type is read off the map, so this is the
/// one place that knows the difference and needs no version test.
template <typename Key>
Key state_key_of(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;  // what c10::guts::to_string did
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

/// The canonical spelling of `name` among `known`, matched ignoring case; throws naming `where`.name.
std::string canonical_name(const nlohmann::json& j, const std::vector<std::string>& known, const std::string& where,
                           const char* what) {
  if (!j.is_string()) throw ConfigError(str(where, ".name: expected a string (", join(known), "), got ", j.dump()));
  const std::string name = j.get<std::string>();
  for (const auto& k : known) {
    if (lowercase(k) == lowercase(name)) return k;
  }
  throw ConfigError(str(where, ".name: unknown ", what, " '", name, "' (expected ", join(known), ")"));
}

constexpr double kPi = 3.14159265358979323846;  // Python's math.pi

// ---------------------------------------------------------------------------
// The tables: an optimizer or schedule is its row here plus its fields' .in() marks.

/// Adam and AdamW: the same arguments, another update.
template <typename Optimizer, typename Options>
std::unique_ptr<torch::optim::Optimizer> adam_family(std::vector<at::Tensor> params, const OptimizerOptions& o) {
  return std::make_unique<Optimizer>(std::move(params), Options(o.lr)
                                                            .betas({o.betas[0], o.betas[1]})
                                                            .eps(o.eps)
                                                            .weight_decay(o.weight_decay)
                                                            .amsgrad(o.amsgrad));
}

std::unique_ptr<torch::optim::Optimizer> make_sgd(std::vector<at::Tensor> params, const OptimizerOptions& o) {
  return std::make_unique<torch::optim::SGD>(
      std::move(params),
      torch::optim::SGDOptions(o.lr).momentum(o.momentum).dampening(o.dampening).weight_decay(o.weight_decay).nesterov(
          o.nesterov));
}

std::unique_ptr<torch::optim::Optimizer> make_novograd(std::vector<at::Tensor> params, const OptimizerOptions& o) {
  return std::make_unique<Novograd>(std::move(params), NovogradOptions(o.lr)
                                                            .betas({o.betas[0], o.betas[1]})
                                                            .eps(o.eps)
                                                            .weight_decay(o.weight_decay)
                                                            .grad_averaging(o.grad_averaging)
                                                            .amsgrad(o.amsgrad));
}

void no_change(OptimizerOptions&) {}
void adamw_defaults(OptimizerOptions& o) { o.weight_decay = kAdamWWeightDecay; }
void novograd_defaults(OptimizerOptions& o) { o.betas[1] = kNovogradBeta2; }

struct OptimizerKind {
  std::unique_ptr<torch::optim::Optimizer> (*make)(std::vector<at::Tensor>, const OptimizerOptions&);
  void (*defaults)(OptimizerOptions&);  ///< where its defaults differ from the struct's
};

constexpr Registered<OptimizerKind> kOptimizers[] = {
    {"SGD", {&make_sgd, &no_change}},
    {"Adam", {&adam_family<torch::optim::Adam, torch::optim::AdamOptions>, &no_change}},
    {"AdamW", {&adam_family<torch::optim::AdamW, torch::optim::AdamWOptions>, &adamw_defaults}},
    {"Novograd", {&make_novograd, &novograd_defaults}},
};

// The arithmetic follows the reference closed forms term by term (same
// operation order), so the golden comparison can be tight.
double constant_lr(const ScheduleOptions&, double lr, std::int64_t, std::int64_t) { return lr; }

double poly_lr(const ScheduleOptions& s, double lr, std::int64_t epoch, std::int64_t max_epochs) {
  const auto e = static_cast<double>(epoch);
  const auto total = static_cast<double>(max_epochs);
  return lr * std::pow(1.0 - std::min(total, e) / total, s.power);
}

double warmup_cosine_lr(const ScheduleOptions& s, double lr, std::int64_t epoch, std::int64_t max_epochs) {
  MEDFAST_CHECK_T(ValueError, s.warmup_epochs < max_epochs, "warmup_cosine: warmup_epochs (", s.warmup_epochs,
                  ") must be below the number of epochs (", max_epochs, ")");
  const auto e = static_cast<double>(epoch);
  const auto warmup = static_cast<double>(s.warmup_epochs);
  if (epoch < s.warmup_epochs) {
    // One warmup epoch: the reference's chained form starts at warmup_start_lr (its closed form divides by 0).
    if (s.warmup_epochs == 1) return s.warmup_start_lr;
    return s.warmup_start_lr + e * (lr - s.warmup_start_lr) / (warmup - 1);
  }
  return s.eta_min +
         0.5 * (lr - s.eta_min) * (1 + std::cos(kPi * (e - warmup) / (static_cast<double>(max_epochs) - warmup)));
}

constexpr Registered<double (*)(const ScheduleOptions&, double, std::int64_t, std::int64_t)> kSchedules[] = {
    {"constant", &constant_lr},
    {"warmup_cosine", &warmup_cosine_lr},
    {"poly", &poly_lr},
};

}  // namespace

std::vector<std::string> optimizer_names() { return registered_names(kOptimizers); }
std::vector<std::string> schedule_names() { return registered_names(kSchedules); }

// ---------------------------------------------------------------------------
// Options

void OptimizerOptions::validate() const {
  if (!find_registered(kOptimizers, name)) {
    throw ValueError(str("optimizer name: unknown optimizer '", name, "' (expected ", registered_text(kOptimizers), ")"));
  }
  auto fail = [&](const char* arg, const std::string& what) { return ValueError(str(name, ": ", arg, " ", what)); };
  if (!(lr >= 0)) throw fail("lr", str("must be >= 0 (got ", lr, ")"));
  if (!(weight_decay >= 0)) throw fail("weight_decay", str("must be >= 0 (got ", weight_decay, ")"));
  if (name == "SGD") {
    if (!(momentum >= 0)) throw fail("momentum", str("must be >= 0 (got ", momentum, ")"));
    if (!(dampening >= 0)) throw fail("dampening", str("must be >= 0 (got ", dampening, ")"));
    if (nesterov && !(momentum > 0 && dampening == 0)) {
      throw fail("nesterov", str("needs momentum > 0 and dampening 0 (got momentum ", momentum, ", dampening ",
                                 dampening, ")"));
    }
    return;
  }
  if (!(eps >= 0)) throw fail("eps", str("must be >= 0 (got ", eps, ")"));
  for (int i = 0; i < 2; ++i) {
    if (!(betas[i] >= 0 && betas[i] < 1)) throw fail(i == 0 ? "betas[0]" : "betas[1]", str("must be in [0, 1) (got ", betas[i], ")"));
  }
}

OptimizerOptions OptimizerOptions::defaults(const std::string& name) {
  const auto* row = find_registered(kOptimizers, name);
  if (!row) throw ValueError(str("optimizer name: unknown optimizer '", name, "' (expected ", registered_text(kOptimizers), ")"));
  OptimizerOptions o;
  o.name = name;
  row->make.defaults(o);
  return o;
}

OptimizerOptions OptimizerOptions::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    throw ConfigError(str(where, ": expected a mapping with a 'name' (", join(optimizer_names()), ")"));
  }
  // No name (or no section: an empty mapping): Adam, every argument its default.
  OptimizerOptions o = defaults(j.contains("name") ? canonical_name(j["name"], optimizer_names(), where, "optimizer")
                                                   : std::string(kDefaultOptimizer));
  ConfigReader k(j, where, ConfigReader::Naming{ConfigReader::Style::path, "argument", o.name});
  k.known("name");
  read_fields(k, o, o.name);
  k.finish(o);
  return o;
}

void ScheduleOptions::validate() const {
  if (!find_registered(kSchedules, name)) {
    throw ValueError(str("schedule name: unknown schedule '", name, "' (expected ", registered_text(kSchedules), ")"));
  }
  auto fail = [&](const char* arg, const std::string& what) { return ValueError(str(name, ": ", arg, " ", what)); };
  if (name == "warmup_cosine") {
    if (warmup_epochs < 0) throw fail("warmup_epochs", str("must be >= 0 (got ", warmup_epochs, ")"));
    if (!(warmup_start_lr >= 0)) throw fail("warmup_start_lr", str("must be >= 0 (got ", warmup_start_lr, ")"));
    if (!(eta_min >= 0)) throw fail("eta_min", str("must be >= 0 (got ", eta_min, ")"));
  } else if (name == "poly") {
    if (!(power > 0)) throw fail("power", str("must be > 0 (got ", power, ")"));
  }
}

ScheduleOptions ScheduleOptions::from_json(const nlohmann::json& j, const std::string& where) {
  ScheduleOptions o;
  if (j.is_string()) {
    o.name = canonical_name(j, schedule_names(), where, "schedule");
    return o;
  }
  if (!j.is_object() || !j.contains("name")) {
    throw ConfigError(str(where, ": expected a name or a mapping with a 'name' (", join(schedule_names()), ")"));
  }
  o.name = canonical_name(j["name"], schedule_names(), where, "schedule");
  ConfigReader k(j, where, ConfigReader::Naming{ConfigReader::Style::path, "argument", o.name});
  k.known("name");
  read_fields(k, o, o.name);
  k.finish(o);
  return o;
}

double scheduled_lr(const ScheduleOptions& s, double lr, std::int64_t epoch, std::int64_t max_epochs) {
  s.validate();
  MEDFAST_CHECK_T(ValueError, max_epochs >= 1, "scheduled_lr: max_epochs must be >= 1 (got ", max_epochs, ")");
  MEDFAST_CHECK_T(ValueError, epoch >= 0, "scheduled_lr: epoch must be >= 0 (got ", epoch, ")");
  return find_registered(kSchedules, s.name)->make(s, lr, epoch, max_epochs);
}

// ---------------------------------------------------------------------------
// Novograd

NovogradOptions::NovogradOptions(double lr) : lr_(lr) {}

double NovogradOptions::get_lr() const { return lr(); }
void NovogradOptions::set_lr(const double lr) { this->lr(lr); }

void NovogradOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(grad_averaging);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
}

void NovogradOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, grad_averaging);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
}

void NovogradParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_exp_avg_sq);
}

void NovogradParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, max_exp_avg_sq);
}

Novograd::Novograd(std::vector<torch::optim::OptimizerParamGroup> param_groups, NovogradOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<NovogradOptions>(defaults)) {
  const auto [beta1, beta2] = defaults.betas();
  MEDFAST_CHECK_T(ValueError, defaults.lr() >= 0, "Novograd: lr must be >= 0 (got ", defaults.lr(), ")");
  MEDFAST_CHECK_T(ValueError, defaults.eps() >= 0, "Novograd: eps must be >= 0 (got ", defaults.eps(), ")");
  MEDFAST_CHECK_T(ValueError, beta1 >= 0 && beta1 < 1, "Novograd: betas[0] must be in [0, 1) (got ", beta1, ")");
  MEDFAST_CHECK_T(ValueError, beta2 >= 0 && beta2 < 1, "Novograd: betas[1] must be in [0, 1) (got ", beta2, ")");
  MEDFAST_CHECK_T(ValueError, defaults.weight_decay() >= 0, "Novograd: weight_decay must be >= 0 (got ",
                  defaults.weight_decay(), ")");
}

at::Tensor Novograd::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const NovogradOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      MEDFAST_CHECK_T(ValueError, !grad.is_sparse(), "Novograd: sparse gradients are not supported");
      const auto key = optimizer_state_key(p);
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto fresh = std::make_unique<NovogradParamState>();
        fresh->exp_avg(at::zeros_like(p));
        // MONAI keeps the second moment as a default-dtype (float32) scalar whatever the parameter's dtype.
        fresh->exp_avg_sq(at::zeros({}, p.options().dtype(at::kFloat)));
        it = state_.emplace(key, std::move(fresh)).first;
      }
      auto& st = static_cast<NovogradParamState&>(*it->second);
      at::Tensor& exp_avg = st.exp_avg();
      at::Tensor& exp_avg_sq = st.exp_avg_sq();
      st.step(st.step() + 1);

      const at::Tensor norm = grad.pow(2).sum();
      // MONAI takes the first nonzero norm as is; `where` keeps that choice on the device (no sync).
      const at::Tensor decayed = exp_avg_sq.mul(beta2).add_(norm, 1 - beta2);
      exp_avg_sq.copy_(at::where(exp_avg_sq == 0, norm, decayed));

      at::Tensor denom;
      if (o.amsgrad()) {
        if (!st.max_exp_avg_sq().defined()) st.max_exp_avg_sq(at::zeros_like(exp_avg_sq));
        at::Tensor& max_exp_avg_sq = st.max_exp_avg_sq();
        at::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
        denom = max_exp_avg_sq.sqrt().add_(o.eps());
      } else {
        denom = exp_avg_sq.sqrt().add_(o.eps());
      }
      at::Tensor g = grad.div(denom);
      if (o.weight_decay() != 0) g.add_(p, o.weight_decay());
      if (o.grad_averaging()) g.mul_(1 - beta1);
      exp_avg.mul_(beta1).add_(g);
      p.add_(exp_avg, -o.lr());
    }
  }
  return loss;
}

void Novograd::save(torch::serialize::OutputArchive& archive) const { serialize(*this, archive); }

void Novograd::load(torch::serialize::InputArchive& archive) { load_optimizer_state(*this, archive); }

// ---------------------------------------------------------------------------
// Loading optimizer state written by any libtorch version.

namespace {

/// torch::optim's archive layout (torch/optim/serialize.h, the same in 1.13 and
/// 2.x): "state/<key>" per parameter and "param_groups/<i>/params/<j>" = <key>,
/// where <key> is the parameter's TensorImpl address as text, written by
/// c10::guts::to_string in 1.13 ("0x55d1...") and std::to_string in 2.x (decimal).
/// libtorch 2.x reads keys with std::stoull, which turns every 1.13 key into 0
/// and gives all parameters one state. Here keys are only ever compared as
/// strings within the archive that wrote them, so both forms work; each state
/// goes to the parameter at the same position, as torch's own loader intends.
template <typename ParamState, typename Options>
void load_state_by_position(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive state_archive;
  archive.read("state", state_archive);
  std::map<std::string, std::unique_ptr<ParamState>> saved;
  for (const std::string& key : state_archive.keys()) {
    torch::serialize::InputArchive one;
    state_archive.read(key, one);
    auto st = std::make_unique<ParamState>();
    st->serialize(one);
    saved[key] = std::move(st);
  }
  torch::serialize::InputArchive groups_archive;
  archive.read("param_groups", groups_archive);
  at::Tensor size;
  groups_archive.read("param_groups/size", size);
  auto& groups = optimizer.param_groups();
  MEDFAST_CHECK_T(ValueError, size.item<std::int64_t>() == static_cast<std::int64_t>(groups.size()),
                  "the optimizer state has ", size.item<std::int64_t>(), " parameter groups, this optimizer ",
                  groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive group_archive;
    groups_archive.read("param_groups/" + std::to_string(g), group_archive);
    at::Tensor count;
    group_archive.read("params/size", count);
    auto& params = groups[g].params();
    MEDFAST_CHECK_T(ValueError, count.item<std::int64_t>() == static_cast<std::int64_t>(params.size()),
                    "parameter group ", g, " of the optimizer state has ", count.item<std::int64_t>(),
                    " parameters, this optimizer's has ", params.size());
    for (std::size_t j = 0; j < params.size(); ++j) {
      c10::IValue old_key;
      group_archive.read("params/" + std::to_string(j), old_key);
      const auto it = saved.find(old_key.toStringRef());
      if (it == saved.end()) continue;  // no state yet for that parameter (it never had a gradient)
      optimizer.state()[optimizer_state_key(params[j])] = std::make_unique<ParamState>(*it->second);
    }
    // The group's options (learning rate and the rest), as torch's loader restores them.
    torch::serialize::InputArchive options_archive;
    group_archive.read("options", options_archive);
    Options saved_options(0);
    saved_options.serialize(options_archive);
    static_cast<Options&>(groups[g].options()) = saved_options;
  }
}

}  // namespace

OptimizerStateKey optimizer_state_key(const at::Tensor& p) { return state_key_of<OptimizerStateKey>(p); }

void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  using namespace torch::optim;
  if (dynamic_cast<SGD*>(&optimizer)) return load_state_by_position<SGDParamState, SGDOptions>(optimizer, archive);
  if (dynamic_cast<AdamW*>(&optimizer)) {
    return load_state_by_position<AdamWParamState, AdamWOptions>(optimizer, archive);
  }
  if (dynamic_cast<Adam*>(&optimizer)) return load_state_by_position<AdamParamState, AdamOptions>(optimizer, archive);
  if (dynamic_cast<Novograd*>(&optimizer)) {
    return load_state_by_position<NovogradParamState, NovogradOptions>(optimizer, archive);
  }
  optimizer.load(archive);  // an optimizer medfast does not make: torch's own loader
}

// ---------------------------------------------------------------------------

std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<at::Tensor> params,
                                                        const OptimizerOptions& options) {
  options.validate();
  return find_registered(kOptimizers, options.name)->make.make(std::move(params), options);
}

void for_each_state_tensor(torch::optim::Optimizer& optimizer,
                           const std::function<void(const at::Tensor& parameter, at::Tensor& state)>& f) {
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const auto it = state.find(optimizer_state_key(p));
      if (it == state.end()) continue;
      torch::optim::OptimizerParamState* s = it->second.get();
      auto visit = [&](at::Tensor& t) {
        if (t.defined()) f(p, t);
      };
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) {
        visit(sgd->momentum_buffer());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s)) {
        visit(adam->exp_avg());
        visit(adam->exp_avg_sq());
        visit(adam->max_exp_avg_sq());
      } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
        visit(adamw->exp_avg());
        visit(adamw->exp_avg_sq());
        visit(adamw->max_exp_avg_sq());
      } else if (auto* novograd = dynamic_cast<NovogradParamState*>(s)) {
        visit(novograd->exp_avg());
        visit(novograd->exp_avg_sq());
        visit(novograd->max_exp_avg_sq());
      }
    }
  }
}

void lay_out_state_as_parameters(torch::optim::Optimizer& optimizer) {
  for_each_state_tensor(optimizer, [](const at::Tensor& p, at::Tensor& t) {
    if (t.sizes() == p.sizes() && t.strides() != p.strides() && p.is_non_overlapping_and_dense()) {
      at::Tensor laid = at::empty_strided(p.sizes(), p.strides(), t.options());
      laid.copy_(t);
      t = laid;
    }
  });
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  MEDFAST_CHECK_T(ValueError, lr >= 0, "set_learning_rate: lr must be >= 0 (got ", lr, ")");
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double learning_rate(const torch::optim::Optimizer& optimizer) {
  MEDFAST_CHECK_T(ValueError, !optimizer.param_groups().empty(), "learning_rate: the optimizer has no parameter groups");
  return optimizer.param_groups().front().options().get_lr();
}

}  // namespace medfast::train
