#include "medfast/train/update.hpp"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <utility>

#include "medfast/core/error.hpp"
#include "medfast/train/optim.hpp"

// libtorch's fused optimizer kernels, by the version that has them (CUDA; the CPU's came in
// 2.4: where a device has none, the first call says so and the update runs foreach).
#define MEDFAST_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#define MEDFAST_FUSED_ADAM MEDFAST_TORCH_AT_LEAST(2, 1)
#define MEDFAST_FUSED_SGD MEDFAST_TORCH_AT_LEAST(2, 3)

namespace medfast::train {

const char* update_kernel_name(UpdateKernel k) {
  switch (k) {
    case UpdateKernel::per_parameter: return "per_parameter";
    case UpdateKernel::fused: return "fused";
    case UpdateKernel::foreach: break;
  }
  return "foreach";
}

/// The parameters of one optimizer group that have a gradient this step, with their state.
struct ParameterUpdate::Group {
  torch::optim::OptimizerParamGroup* group = nullptr;
  std::vector<at::Tensor> params, grads;
  std::vector<torch::optim::OptimizerParamState*> states;  // created where missing
  std::vector<OptimizerStateKey> keys;
  /// One device and one dtype (what a fused kernel takes).
  bool uniform = true;
};

namespace {

/// What a step skipped on the device leaves: every tensor the update writes takes its old
/// value back where the flag is 1. The old values are copied before the update (one
/// multi-tensor copy), put back after it (one `where` per tensor).
class PutBackIfSkipped {
 public:
  /// `skip`, and the lists of tensors the update is about to write.
  PutBackIfSkipped(const at::Tensor& skip, std::initializer_list<const std::vector<at::Tensor>*> written) {
    if (!skip.defined()) return;
    skip_ = skip.reshape({}).gt(0);  // 0-dim: broadcasts to every shape, 0-dim ones too
    for (const auto* list : written) written_.insert(written_.end(), list->begin(), list->end());
    if (!written_.empty()) old_ = at::_foreach_mul(written_, 1.0);  // copies (x * 1 is x, -0 and NaN too)
  }
  void put_back() {
    for (std::size_t i = 0; i < written_.size(); ++i) written_[i].copy_(at::where(skip_, old_[i], written_[i]));
    written_.clear();
    old_.clear();
  }

 private:
  at::Tensor skip_;
  std::vector<at::Tensor> written_, old_;
};

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& v, const std::vector<std::size_t>& at) {
  std::vector<at::Tensor> out;
  out.reserve(at.size());
  for (std::size_t i : at) out.push_back(v[i]);
  return out;
}

}  // namespace

ParameterUpdate::ParameterUpdate(torch::optim::Optimizer& optimizer, std::string name, UpdateKernel preferred)
    : optimizer_(optimizer), name_(std::move(name)), preferred_(preferred) {
  if (name_ != "SGD" && name_ != "Adam" && name_ != "AdamW" && name_ != "Novograd") {
    throw ValueError(str("ParameterUpdate: unknown optimizer '", name_, "' (SGD, Adam, AdamW or Novograd)"));
  }
}

void ParameterUpdate::apply(const at::Tensor& skip) {
  stepped_.clear();
  first_momentum_.clear();
  applied_ = true;
  // On the CPU nothing runs ahead of the host: the flag is read and a step to skip not taken.
  const bool read_on_host = skip.defined() && (preferred_ == UpdateKernel::per_parameter || (skip.is_cpu() && !device_skip_on_cpu_));
  if (read_on_host) {
    MEDFAST_CHECK_T(ValueError, skip.is_cpu(), "ParameterUpdate: the per-parameter update cannot skip on the device");
    if (skip.item<float>() != 0) {
      applied_ = false;
      return;
    }
  }
  if (preferred_ == UpdateKernel::per_parameter) {
    last_ = UpdateKernel::per_parameter;
    optimizer_.step();
    return;
  }
  const at::Tensor device_skip = read_on_host ? at::Tensor() : skip;
  at::NoGradGuard no_grad;
  auto& state = optimizer_.state();
  for (auto& group : optimizer_.param_groups()) {
    Group g;
    g.group = &group;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      MEDFAST_CHECK_T(ValueError, !p.grad().is_sparse(), name_, ": sparse gradients are not supported");
      g.params.push_back(p);
      g.grads.push_back(p.grad());
      g.keys.push_back(optimizer_state_key(p));
      const at::Tensor& first = g.params.front();
      g.uniform = g.uniform && p.device() == first.device() && p.scalar_type() == first.scalar_type() &&
                  p.grad().scalar_type() == first.scalar_type();
    }
    if (g.params.empty()) continue;
    for (const auto& key : g.keys) {
      auto it = state.find(key);
      g.states.push_back(it == state.end() ? nullptr : it->second.get());
    }
    if (name_ == "SGD") sgd(g, device_skip);
    else if (name_ == "Adam") adam(g, device_skip, false);
    else if (name_ == "AdamW") adam(g, device_skip, true);
    else novograd(g, device_skip);
  }
}

namespace {
/// One step less on a parameter's count; the count left.
template <typename S>
bool uncount_as(torch::optim::OptimizerParamState* s, std::int64_t& left) {
  auto* typed = dynamic_cast<S*>(s);
  if (typed == nullptr) return false;
  typed->step(typed->step() - 1);
  left = typed->step();
  return true;
}
std::int64_t uncount_step(torch::optim::OptimizerParamState* s) {
  std::int64_t left = 1;
  uncount_as<torch::optim::AdamParamState>(s, left) || uncount_as<torch::optim::AdamWParamState>(s, left) ||
      uncount_as<NovogradParamState>(s, left);
  return left;
}
}  // namespace

void ParameterUpdate::skipped() {
  if (!applied_) return;  // read on the host and not taken: nothing to put back
  auto& state = optimizer_.state();
  for (const auto& key : first_momentum_) state.erase(key);  // the buffers never held a first step
  for (const auto& key : stepped_) {
    auto it = state.find(key);
    if (it == state.end()) continue;
    if (uncount_step(it->second.get()) <= 0) state.erase(it);  // created by the skipped step: as if it never ran
  }
  first_momentum_.clear();
  applied_ = false;  // stepped_ stays: a replay of a captured update counts the same parameters again
}

bool ParameterUpdate::capturable() const {
  return last_ == UpdateKernel::fused || name_ == "SGD" || name_ == "Novograd";
}

void ParameterUpdate::prepare_capture() {
  device_steps_.clear();
  if (name_ != "Adam" && name_ != "AdamW") return;
  for (auto& group : optimizer_.param_groups()) {
    for (auto& p : group.params()) {
      const auto key = optimizer_state_key(p);
      const auto it = optimizer_.state().find(key);
      if (it == optimizer_.state().end()) continue;
      std::int64_t count = 0;
      if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) count = a->step();
      if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) count = w->step();
      device_steps_[key] = at::full({}, static_cast<double>(count), p.options().dtype(at::kFloat));
    }
  }
}

void ParameterUpdate::replayed() {
  auto& state = optimizer_.state();
  for (const auto& key : stepped_) {
    const auto it = state.find(key);
    if (it == state.end()) continue;
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) a->step(a->step() + 1);
    if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) w->step(w->step() + 1);
    if (auto* n = dynamic_cast<NovogradParamState*>(it->second.get())) n->step(n->step() + 1);
  }
  applied_ = true;
}

// ---------------------------------------------------------------------------
// SGD: libtorch's (d = g + wd p; b = m b + (1 - dampening) d, the first step b = d;
// d = d + m b with Nesterov, else b; p -= lr d).

void ParameterUpdate::sgd(Group& g, const at::Tensor& skip) {
  const auto& o = static_cast<const torch::optim::SGDOptions&>(g.group->options());
  auto& state = optimizer_.state();
  std::vector<at::Tensor> bufs;
  std::vector<std::size_t> existing, fresh;
  if (o.momentum() != 0) {
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      if (g.states[i] == nullptr) {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(at::zeros_like(g.params[i], at::MemoryFormat::Preserve));
        g.states[i] = s.get();
        state[g.keys[i]] = std::move(s);
        first_momentum_.push_back(g.keys[i]);
        fresh.push_back(i);
      } else {
        existing.push_back(i);
      }
      bufs.push_back(static_cast<torch::optim::SGDParamState*>(g.states[i])->momentum_buffer());
    }
  }
  if (o.momentum() == 0) {
    for (std::size_t i = 0; i < g.params.size(); ++i) existing.push_back(i);
  }
  if (preferred_ == UpdateKernel::fused && fused_sgd(g, skip, existing, fresh)) return;
  last_ = UpdateKernel::foreach;
  PutBackIfSkipped put_back(skip, {&g.params, &bufs});
  std::vector<at::Tensor> d = o.weight_decay() != 0 ? at::_foreach_add(g.grads, g.params, o.weight_decay()) : g.grads;
  if (o.momentum() != 0) {
    if (!existing.empty()) {
      std::vector<at::Tensor> b = pick(bufs, existing);
      at::_foreach_mul_(b, o.momentum());
      at::_foreach_add_(b, pick(d, existing), 1 - o.dampening());
    }
    for (std::size_t i : fresh) bufs[i].copy_(d[i]);
    if (o.nesterov()) d = at::_foreach_add(d, bufs, o.momentum());
    else d = bufs;
  }
  at::_foreach_add_(g.params, d, -o.lr());
  put_back.put_back();
}

bool ParameterUpdate::fused_sgd([[maybe_unused]] Group& g, [[maybe_unused]] const at::Tensor& skip,
                                [[maybe_unused]] const std::vector<std::size_t>& older,
                                [[maybe_unused]] const std::vector<std::size_t>& fresh) {
#if MEDFAST_FUSED_SGD
  if (fused_unavailable_ || !g.uniform) return false;
  const auto& o = static_cast<const torch::optim::SGDOptions&>(g.group->options());
  const c10::optional<at::Tensor> found = skip.defined() ? c10::optional<at::Tensor>(skip) : c10::nullopt;
  // One call per kind of step: buffers that hold a first step already, and new ones.
  auto call = [&](const std::vector<std::size_t>& which, bool first) {
    if (which.empty()) return;
    std::vector<at::Tensor> bufs;
    if (o.momentum() != 0) {
      for (std::size_t i : which) bufs.push_back(static_cast<torch::optim::SGDParamState*>(g.states[i])->momentum_buffer());
    }
    at::_fused_sgd_(pick(g.params, which), pick(g.grads, which), bufs, o.weight_decay(), o.momentum(), o.lr(),
                    o.dampening(), o.nesterov(), /*maximize=*/false, first, /*grad_scale=*/c10::nullopt, found);
  };
  try {
    call(older.empty() ? fresh : older, older.empty());
  } catch (const c10::NotImplementedError&) {  // no fused kernel for this device: nothing ran
    fused_unavailable_ = true;
    return false;
  }
  if (!older.empty()) call(fresh, true);
  last_ = UpdateKernel::fused;
  return true;
#else  // libtorch without the fused kernel: the foreach update runs
  return false;
#endif
}

// ---------------------------------------------------------------------------
// Adam and AdamW: libtorch's (Adam: g + wd p; AdamW: p *= 1 - lr wd; moments m, v;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), v its running maximum with amsgrad).

namespace {
struct AdamState {
  at::Tensor *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
  std::int64_t step;
};
template <typename S>
AdamState adam_state_of(torch::optim::OptimizerParamState* s) {
  auto* a = static_cast<S*>(s);
  return {&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq(), a->step()};
}
template <typename S>
void adam_count_step(torch::optim::OptimizerParamState* s) {
  auto* a = static_cast<S*>(s);
  a->step(a->step() + 1);
}
}  // namespace

namespace {
/// Adam's and AdamW's hyper-parameters from a group's options (the two option types of libtorch).
struct AdamHyper {
  double lr, b1, b2, eps, wd;
  bool amsgrad;
};
template <typename Options>
AdamHyper adam_hyper(const Options& o) {
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad()};
}
/// A parameter's Adam or AdamW state as libtorch creates it: step 0, zero moments laid out as
/// the parameter.
template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> fresh_adam_state(const at::Tensor& p, bool amsgrad) {
  auto s = std::make_unique<State>();
  s->step(0);
  s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
  s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
  if (amsgrad) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
  return s;
}
AdamHyper adam_options(const torch::optim::OptimizerOptions& o, bool decoupled) {
  return decoupled ? adam_hyper(static_cast<const torch::optim::AdamWOptions&>(o))
                   : adam_hyper(static_cast<const torch::optim::AdamOptions&>(o));
}
}  // namespace

void ParameterUpdate::adam(Group& g, const at::Tensor& skip, bool decoupled) {
  const AdamHyper h = adam_options(g.group->options(), decoupled);
  const double lr = h.lr, b1 = h.b1, b2 = h.b2, eps = h.eps, wd = h.wd;
  const bool amsgrad = h.amsgrad;
  auto& state = optimizer_.state();
  std::vector<at::Tensor> m, v, vmax;
  std::vector<double> steps;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    if (g.states[i] == nullptr) {  // as libtorch creates it
      const at::Tensor& p = g.params[i];
      std::unique_ptr<torch::optim::OptimizerParamState> fresh =
          decoupled ? fresh_adam_state<torch::optim::AdamWParamState>(p, amsgrad)
                    : fresh_adam_state<torch::optim::AdamParamState>(p, amsgrad);
      g.states[i] = fresh.get();
      state[g.keys[i]] = std::move(fresh);
    }
    if (decoupled) adam_count_step<torch::optim::AdamWParamState>(g.states[i]);
    else adam_count_step<torch::optim::AdamParamState>(g.states[i]);
    stepped_.push_back(g.keys[i]);
    const AdamState s = decoupled ? adam_state_of<torch::optim::AdamWParamState>(g.states[i])
                                  : adam_state_of<torch::optim::AdamParamState>(g.states[i]);
    if (amsgrad && !s.max_exp_avg_sq->defined()) *s.max_exp_avg_sq = at::zeros_like(g.params[i], at::MemoryFormat::Preserve);
    m.push_back(*s.exp_avg);
    v.push_back(*s.exp_avg_sq);
    if (amsgrad) vmax.push_back(*s.max_exp_avg_sq);
    steps.push_back(static_cast<double>(s.step));
  }
  if (preferred_ == UpdateKernel::fused && fused_adam(g, skip, decoupled)) return;
  last_ = UpdateKernel::foreach;
  PutBackIfSkipped put_back(skip, {&g.params, &m, &v, &vmax});
  std::vector<at::Tensor> grads = g.grads;
  if (decoupled) {
    at::_foreach_mul_(g.params, 1 - lr * wd);
  } else if (wd != 0) {
    grads = at::_foreach_add(grads, g.params, wd);
  }
  at::_foreach_mul_(m, b1);
  at::_foreach_add_(m, grads, 1 - b1);
  at::_foreach_mul_(v, b2);
  at::_foreach_addcmul_(v, grads, grads, 1 - b2);
  if (amsgrad) at::_foreach_maximum_(vmax, v);
  std::vector<at::Scalar> root_bc2, minus_step_size;
  for (double t : steps) {
    root_bc2.emplace_back(std::sqrt(1 - std::pow(b2, t)));
    minus_step_size.emplace_back(-(lr / (1 - std::pow(b1, t))));
  }
  std::vector<at::Tensor> denom = at::_foreach_sqrt(amsgrad ? vmax : v);
  at::_foreach_div_(denom, root_bc2);
  at::_foreach_add_(denom, eps);
  at::_foreach_addcdiv_(g.params, m, denom, minus_step_size);
  put_back.put_back();
}

bool ParameterUpdate::fused_adam([[maybe_unused]] Group& g, [[maybe_unused]] const at::Tensor& skip,
                                 [[maybe_unused]] bool decoupled) {
#if MEDFAST_FUSED_ADAM
  if (fused_unavailable_ || !g.uniform) return false;
  const AdamHyper h = adam_options(g.group->options(), decoupled);
  const double lr = h.lr, b1 = h.b1, b2 = h.b2, eps = h.eps, wd = h.wd;
  const bool amsgrad = h.amsgrad;
  std::vector<at::Tensor> m, v, vmax, steps;
  // The kernel reads each parameter's step count (this step's, counted) from a float tensor on
  // the device: one fill per distinct count (usually one), no copy from the host; for a
  // captured update, the device's own counts (prepare_capture), advanced here on the device.
  std::map<std::int64_t, at::Tensor> counts;
  const bool on_device_counts = !device_steps_.empty();
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    const AdamState s = decoupled ? adam_state_of<torch::optim::AdamWParamState>(g.states[i])
                                  : adam_state_of<torch::optim::AdamParamState>(g.states[i]);
    m.push_back(*s.exp_avg);
    v.push_back(*s.exp_avg_sq);
    if (amsgrad) vmax.push_back(*s.max_exp_avg_sq);
    if (on_device_counts) {
      const auto it = device_steps_.find(g.keys[i]);
      MEDFAST_CHECK(it != device_steps_.end(), "ParameterUpdate: a parameter without a device step count (prepare_capture)");
      steps.push_back(it->second);
      continue;
    }
    at::Tensor& c = counts[s.step];
    if (!c.defined()) c = at::full({}, static_cast<double>(s.step), g.params[i].options().dtype(at::kFloat));
    steps.push_back(c);
  }
  if (on_device_counts) at::_foreach_add_(steps, 1.0);
  const c10::optional<at::Tensor> found = skip.defined() ? c10::optional<at::Tensor>(skip) : c10::nullopt;
  try {
    if (decoupled) {
      at::_fused_adamw_(g.params, g.grads, m, v, vmax, steps, lr, b1, b2, wd, eps, amsgrad, /*maximize=*/false,
                        /*grad_scale=*/c10::nullopt, found);
    } else {
      at::_fused_adam_(g.params, g.grads, m, v, vmax, steps, lr, b1, b2, wd, eps, amsgrad, /*maximize=*/false,
                       /*grad_scale=*/c10::nullopt, found);
    }
  } catch (const c10::NotImplementedError&) {  // no fused kernel for this device: nothing ran
    fused_unavailable_ = true;
    if (on_device_counts) at::_foreach_sub_(steps, 1.0);
    return false;
  }
  if (on_device_counts && skip.defined()) {  // a skipped step counts nothing (torch's capturable Adam)
    at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), skip.reshape({})));
  }
  last_ = UpdateKernel::fused;
  return true;
#else  // libtorch without the fused kernel: the foreach update runs
  return false;
#endif
}

// ---------------------------------------------------------------------------
// Novograd: MONAI's (optim.hpp), its per-tensor norms in one multi-tensor launch.

void ParameterUpdate::novograd(Group& g, const at::Tensor& skip) {
  const auto& o = static_cast<const NovogradOptions&>(g.group->options());
  const auto [b1, b2] = o.betas();
  auto& state = optimizer_.state();
  std::vector<at::Tensor> m, sq, sqmax;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    if (g.states[i] == nullptr) {
      auto s = std::make_unique<NovogradParamState>();
      s->exp_avg(at::zeros_like(g.params[i], at::MemoryFormat::Preserve));
      s->exp_avg_sq(at::zeros({}, g.params[i].options().dtype(at::kFloat)));
      g.states[i] = s.get();
      state[g.keys[i]] = std::move(s);
    }
    auto* s = static_cast<NovogradParamState*>(g.states[i]);
    s->step(s->step() + 1);
    stepped_.push_back(g.keys[i]);
    if (o.amsgrad() && !s->max_exp_avg_sq().defined()) s->max_exp_avg_sq(at::zeros_like(s->exp_avg_sq()));
    m.push_back(s->exp_avg());
    sq.push_back(s->exp_avg_sq());
    if (o.amsgrad()) sqmax.push_back(s->max_exp_avg_sq());
  }
  last_ = UpdateKernel::foreach;
  PutBackIfSkipped put_back(skip, {&g.params, &m, &sq, &sqmax});
  // v = ||g||^2, the first nonzero one taken as is (a `where` on the device, as step()).
  const at::Tensor norm = at::stack(at::_foreach_norm(g.grads)).to(at::kFloat).square();
  const at::Tensor prev = at::stack(sq);
  const at::Tensor next = at::where(prev == 0, norm, prev * b2 + norm * (1 - b2));
  at::_foreach_zero_(sq);
  at::_foreach_add_(sq, next.unbind(0));
  at::Tensor chosen = next;
  if (o.amsgrad()) {
    chosen = at::maximum(at::stack(sqmax), next);
    at::_foreach_zero_(sqmax);
    at::_foreach_add_(sqmax, chosen.unbind(0));
  }
  const std::vector<at::Tensor> denom = (chosen.sqrt() + o.eps()).unbind(0);
  std::vector<at::Tensor> d = at::_foreach_div(g.grads, denom);
  if (o.weight_decay() != 0) at::_foreach_add_(d, g.params, o.weight_decay());
  if (o.grad_averaging()) at::_foreach_mul_(d, 1 - b1);
  at::_foreach_mul_(m, b1);
  at::_foreach_add_(m, d);
  at::_foreach_add_(g.params, m, -o.lr());
  put_back.put_back();
}

}  // namespace medfast::train
