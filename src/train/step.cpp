#include "medfast/train/step.hpp"

#include "detail.hpp"

#if MEDFAST_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cmath>
#include <map>
#include <optional>

#include "medfast/core/error.hpp"
#include "medfast/core/trace.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/nn/layout.hpp"

namespace medfast::train {

std::string StepLabel::text() const {
  const bool named = files.size() == items.size();
  std::string list;
  for (std::size_t k = 0; k < items.size(); ++k) {
    list += (k == 0 ? "" : named ? "; " : ", ") + std::to_string(items[k]) + (named ? ": " + files[k] : "");
  }
  return str("epoch ", epoch, ", step ", step, " (items ", list, ")");
}

namespace {

/// A step's outcome on its way to the host: [loss, skipped, lowest label, highest label]
/// as float64, copied as the step ends; on CUDA the copy's event says when it is there.
struct InFlight {
  StepLabel label;
  at::Tensor values;  // on the host (pinned where it came from a GPU)
  bool labels_checked = false;  // values[2..3] hold the labels' range
  std::int64_t classes = 0;
#if MEDFAST_TORCH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> copied;
#endif
};

}  // namespace

/// A captured step (cuda_graph): the graph, the tensors it reads and writes, and when it was made.
struct Captured {
#if MEDFAST_TORCH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  at::Tensor x, y;     ///< the captured step's inputs: each batch is copied into them
  at::Tensor values;   ///< what it leaves: loss, skipped, lowest and highest label (float64 [4])
  std::int64_t classes = 0;
  bool labels_checked = false;
  double lr = -1;      ///< the learning rate captured with the update
  bool fresh = false;  ///< captured, not replayed yet (the capture's apply() counts its first replay)
  int captures = 0, eager_steps = 0, eager_applied = 0;
};

/// What one step computed on the device (no host read): its loss, skip flag and labels' range.
struct Computed {
  at::Tensor loss, skip, label_range;
  std::int64_t classes = 0;
  std::optional<StepOutcome> previous;  ///< the step before, read in the middle (eager steps)
};

struct TrainingStep::Impl {
  Parts parts;
  StepOptions options;
  ParameterUpdate update;
  detail::StageClock clock;
  std::optional<InFlight> in_flight;
  Captured captured;

  Impl(Parts p, StepOptions o)
      : parts(std::move(p)), options(o), update(*parts.optimizer, parts.optimizer_name, o.update), clock(o.device) {}

  /// Waits for the step in flight to reach the host and reads it: ValueError for labels out
  /// of range; the update's records go back where it was skipped.
  StepOutcome read(InFlight& f) {
#if MEDFAST_TORCH_CUDA
    if (f.copied) f.copied->synchronize();  // this step's copy alone, not the device
#endif
    const double* v = f.values.data_ptr<double>();
    StepOutcome out{f.label, v[0], v[1] == 0};
    if (f.labels_checked && (v[2] < 0 || v[3] >= static_cast<double>(f.classes))) {
      throw ValueError(str(f.label.text(), ": one_hot: labels must lie in [0, ", f.classes, "), got values from ",
                           static_cast<std::int64_t>(v[2]), " to ", static_cast<std::int64_t>(v[3])));
    }
    if (!out.applied) update.skipped();
    return out;
  }

  /// [loss, skipped, lowest label, highest label] as float64 on the step's device.
  static at::Tensor outcome_values(const Computed& c) {
    const at::Tensor range = c.label_range.defined() ? c.label_range.to(at::kDouble)
                                                     : at::zeros({2}, c.skip.options().dtype(at::kDouble));
    return at::cat(
        {c.loss.detach().reshape({1}).to(at::kDouble), c.skip.reshape({1}).to(at::kDouble), range.reshape({2})});
  }

  /// The device's values of the step just queued, on their way to the host.
  InFlight send(const StepLabel& label, const at::Tensor& values, bool labels_checked, std::int64_t classes) {
    InFlight f;
    f.label = label;
    f.classes = classes;
    f.labels_checked = labels_checked;
    if (values.is_cpu()) {
      f.values = values;
      return f;
    }
    // Pinned, so that the copy is asynchronous; the event after it is what read() waits for.
    f.values = at::empty({4}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    f.values.copy_(values, /*non_blocking=*/true);
#if MEDFAST_TORCH_CUDA
    if (values.is_cuda()) {
      f.copied = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
      f.copied->record(at::cuda::getCurrentCUDAStream(values.device().index()));
      return f;
    }
#endif
    // A device this build has no events for: wait for its stream now.
    c10::impl::VirtualGuardImpl(values.device().type()).getStream(values.device()).synchronize();
    return f;
  }

  /// How many gradient elements are inf or NaN, > 0 as float32 [1] on the device (no host
  /// read): on CUDA one fused check per dtype group (torch's GradScaler kernel with a scale
  /// of 1); elsewhere one sum per parameter.
  at::Tensor nonfinite_gradients() const {
    at::NoGradGuard no_grad;
    const c10::Device device = options.device;
    if (device.is_cuda()) {
      std::map<at::ScalarType, std::vector<at::Tensor>> groups;
      for (const auto& p : parts.params) {
        if (p.grad().defined()) groups[p.grad().scalar_type()].push_back(p.grad());
      }
      at::Tensor found = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
      const at::Tensor one = at::ones({1}, found.options());
      for (auto& [dtype, grads] : groups) at::_amp_foreach_non_finite_check_and_unscale_(grads, found, one);
      return found;
    }
    at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
    for (const auto& p : parts.params) {
      if (p.grad().defined()) total = total + p.grad().sum(at::kDouble);
    }
    return at::isfinite(total).logical_not().to(at::kFloat).reshape({1});
  }
};

TrainingStep::TrainingStep(Parts parts, StepOptions options) {
  MEDFAST_CHECK(parts.optimizer != nullptr && parts.scaler != nullptr && parts.loss != nullptr,
                "TrainingStep: needs an optimizer, a scaler and a loss");
  impl_ = std::make_unique<Impl>(std::move(parts), options);
}

TrainingStep::~TrainingStep() = default;

UpdateKernel TrainingStep::update_kernel() const { return impl_->update.kernel(); }

int TrainingStep::captures() const { return impl_->captured.captures; }

namespace {

/// The batch on the step's device, the image in float32 and the network's layout.
std::pair<at::Tensor, at::Tensor> step_inputs_on_device(const at::Tensor& image, const at::Tensor& label, const StepOptions& o) {
  return {nn::to_memory_format(image.to(o.device, at::kFloat, /*non_blocking=*/true), o.memory_format),
          label.to(o.device, /*non_blocking=*/true)};
}

}  // namespace

/// Forward, loss, backward, (DDP: gradients averaged), the skip flag and the update, on the
/// device; `clock`: lap the stages (not while a graph is captured); `read_previous`: read the
/// step before in the middle, once this one's work is queued (an eager step's way).
Computed TrainingStep::compute(const at::Tensor& x, const at::Tensor& y, const StepLabel& where, StageTimes& times,
                               bool clock, bool read_previous) {
  Impl& s = *impl_;
  Parts& p = s.parts;
  const StepOptions& o = s.options;
  const std::string context = where.text();
  Computed c;
  if (p.comm && p.comm->world_size() > 1 && !p.buffers.empty()) {  // BatchNorm statistics: rank 0's, as DDP's
    at::NoGradGuard g;
    p.comm->broadcast_coalesced(p.buffers, 0);
  }
  std::optional<trace::Range> stage(std::in_place, "forward");
  with_context(context, [&] {
    AutocastGuard autocast(o.device.type(), o.precision);
    const at::Tensor logits = p.model.forward<at::Tensor>(x);
    if (p.supervision_weights.empty()) {
      c.classes = logits.size(1);
      c.loss = (*p.loss)(logits.to(at::kFloat), y, &c.label_range);
    } else {
      c.classes = logits.size(2);  // [B, outputs, C, spatial...]
      c.loss = deep_supervision_loss(*p.loss, logits, y, p.supervision_weights, &c.label_range);
    }
  });
  if (p.loss_filter) c.loss = p.loss_filter(where.epoch, where.step, c.loss);
  if (clock) s.clock.lap(&StageTimes::forward);

  stage.emplace("backward");
  for (auto& t : p.params) t.mutable_grad().reset();  // set to none: backward writes them afresh
  if (p.grad_sync) p.grad_sync->prepare();
  with_context(context, [&] { p.scaler->scale(c.loss).backward(); });
  if (clock) s.clock.lap(&StageTimes::backward);
  if (p.grad_sync) {
    stage.emplace("allreduce");
    p.grad_sync->finish();
  }

  stage.emplace("optimizer");
  // The step before this one, read now that this one's work is queued behind it: its
  // outcome, and (where it was skipped) the update's records put back before this update.
  if (read_previous && s.in_flight) {
    InFlight f = std::move(*s.in_flight);
    s.in_flight.reset();
    c.previous = s.read(f);
  }
  if (clock) s.clock.collect(times);  // earlier steps' events have passed
  // The skip flag, on the device: fp16's scaler finds inf/NaN gradients in its unscale (and
  // backs off); in fp32 and bf16 no non-finite gradient or loss may reach the weights. Under
  // DDP the gradients are the averaged ones, so every rank decides alike, also when only one
  // rank's loss was NaN. Labels outside the classes skip the step too (reported when read).
  at::NoGradGuard no_grad;
  at::Tensor bad;
  if (p.scaler->enabled()) {
    p.scaler->unscale(*p.optimizer);
    bad = p.scaler->found_inf(*p.optimizer).reshape({1}).gt(0);
  } else {
    bad = at::logical_or(s.nonfinite_gradients().reshape({1}).gt(0),
                         at::isfinite(c.loss.detach().reshape({1})).logical_not());
  }
  if (c.label_range.defined()) {
    bad = at::logical_or(
        bad, at::logical_or(c.label_range.narrow(0, 0, 1).lt(0), c.label_range.narrow(0, 1, 1).ge(c.classes)));
  }
  c.skip = bad.to(at::kFloat);  // exactly 0 or 1, as the fused kernels read it
  s.update.apply(c.skip);
  if (p.scaler->enabled()) {
    p.scaler->stepped(*p.optimizer);
    p.scaler->update();
  }
  if (clock) s.clock.lap(&StageTimes::optimizer);
  return c;
}

std::optional<StepOutcome> TrainingStep::run(const at::Tensor& image, const at::Tensor& label, const StepLabel& where,
                                             StageTimes& times) {
  Impl& s = *impl_;
  if (s.options.cuda_graph) return run_graphed(image, label, where, times);
  s.clock.start();
  std::optional<trace::Range> stage(std::in_place, "copy");
  const auto [x, y] = step_inputs_on_device(image, label, s.options);
  s.clock.lap(&StageTimes::copy);
  stage.reset();
  Computed c = compute(x, y, where, times, /*clock=*/true, /*read_previous=*/true);
  s.in_flight = s.send(where, Impl::outcome_values(c), c.label_range.defined(), c.classes);
  return c.previous;
}

std::optional<StepOutcome> TrainingStep::run_graphed(const at::Tensor& image, const at::Tensor& label,
                                                     const StepLabel& where, StageTimes& times) {
#if MEDFAST_TORCH_CUDA
  Impl& s = *impl_;
  Captured& g = s.captured;
  const StepOptions& o = s.options;
  MEDFAST_CHECK_T(ValueError, o.device.is_cuda(), "train.cuda_graph: on needs a CUDA device, not ", o.device);
  // Eager steps first: cuDNN autotunes, the optimizer's state and the loss scale settle.
  if (!g.graph && (g.eager_steps < o.eager_before_capture || g.eager_applied < 1)) {
    ++g.eager_steps;
    s.options.cuda_graph = false;
    std::optional<StepOutcome> previous;
    try {
      previous = run(image, label, where, times);
    } catch (...) {
      s.options.cuda_graph = true;
      throw;
    }
    s.options.cuda_graph = true;
    if (previous && previous->applied) ++g.eager_applied;
    return previous;
  }
  s.clock.start();
  std::optional<trace::Range> stage(std::in_place, "copy");
  const auto [x, y] = step_inputs_on_device(image, label, o);
  if (g.graph && (x.sizes() != g.x.sizes() || y.sizes() != g.y.sizes())) {
    throw ValueError(str(where.text(), ": train.cuda_graph: on replays one captured step, made for batches of ",
                         g.x.sizes(), " (labels ", g.y.sizes(), "); this batch is ", x.sizes(), " (labels ", y.sizes(),
                         "): give every batch one shape (data.loader.drop_last: true, a random crop of a fixed size), "
                         "or set train.cuda_graph off"));
  }
  std::optional<StepOutcome> previous;
  const double lr = learning_rate(*s.parts.optimizer);
  if (!g.graph || lr != g.lr) {
    // The step in flight first: a capture runs nothing, and the records it reads must be current.
    if (s.in_flight) {
      InFlight f = std::move(*s.in_flight);
      s.in_flight.reset();
      previous = s.read(f);
    }
    capture(x, y, where, times, lr);
  }
  g.x.copy_(x, /*non_blocking=*/true);
  g.y.copy_(y, /*non_blocking=*/true);
  s.clock.lap(&StageTimes::copy);
  stage.emplace("step (CUDA graph)");
  g.graph->replay();
  if (g.fresh) {
    g.fresh = false;  // the capture's own apply() counted this one
  } else {
    s.update.replayed();
  }
  s.clock.lap(&StageTimes::forward);
  if (!previous && s.in_flight) {
    InFlight f = std::move(*s.in_flight);
    s.in_flight.reset();
    previous = s.read(f);
  }
  s.clock.collect(times);
  s.in_flight = s.send(where, g.values, g.labels_checked, g.classes);
  return previous;
#else
  (void)image;
  (void)label;
  (void)where;
  (void)times;
  throw ValueError("train.cuda_graph: on needs a libtorch with CUDA; this build has none");
#endif
}

void TrainingStep::capture(const at::Tensor& x, const at::Tensor& y, const StepLabel& where, StageTimes& times,
                           double lr) {
#if MEDFAST_TORCH_CUDA
  Impl& s = *impl_;
  Captured& g = s.captured;
  if (!s.update.capturable()) {
    throw ValueError(str("train.cuda_graph: the ", s.parts.optimizer_name,
                         " update on this libtorch is the multi-tensor one, whose bias correction the host computes "
                         "each step: it cannot be captured (libtorch 2.1 and later have the fused kernel); set "
                         "train.cuda_graph off"));
  }
  if (g.graph) g.graph->reset();  // its memory pool (and the gradients in it) goes
  g.graph.reset();
  g.x = at::empty_like(x);
  g.y = at::empty_like(y);
  g.x.copy_(x);
  g.y.copy_(y);
  s.update.prepare_capture();
  const c10::DeviceIndex index = s.options.device.has_index() ? s.options.device.index() : c10::DeviceIndex{0};
  const at::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream(index);
  const at::cuda::CUDAStream side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  at::cuda::CUDAEvent ready;
  ready.record(main);
  ready.block(side);
  {
    at::cuda::CUDAStreamGuard on_side(side);
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    graph->capture_begin();
    try {
      const Computed c = compute(g.x, g.y, where, times, /*clock=*/false, /*read_previous=*/false);
      g.values = Impl::outcome_values(c);
      g.classes = c.classes;
      g.labels_checked = c.label_range.defined();
    } catch (...) {
      try {
        graph->capture_end();
      } catch (...) {
      }
      throw;
    }
    graph->capture_end();
    g.graph = std::move(graph);
  }
  at::cuda::CUDAEvent captured;
  captured.record(side);
  captured.block(main);
  g.lr = lr;
  g.fresh = true;
  ++g.captures;
#else
  (void)x;
  (void)y;
  (void)where;
  (void)times;
  (void)lr;
  throw ValueError("train.cuda_graph: on needs a libtorch with CUDA; this build has none");
#endif
}

std::optional<StepOutcome> TrainingStep::finish(StageTimes& times) {
  Impl& s = *impl_;
  std::optional<StepOutcome> out;
  if (s.in_flight) {
    InFlight f = std::move(*s.in_flight);
    s.in_flight.reset();
    out = s.read(f);
  }
  s.clock.flush(times);
  return out;
}

}  // namespace medfast::train
