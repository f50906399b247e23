#include "medfast/train/step.hpp"

#include "detail.hpp"

#if MEDFAST_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cmath>
#include <map>
#include <optional>

#include "medfast/core/error.hpp"
#include "medfast/core/trace.hpp"
#include "medfast/nn/layout.hpp"

namespace medfast::train {

std::string StepLabel::text() const {
  std::string list;
  for (std::size_t i : items) list += (list.empty() ? "" : ", ") + std::to_string(i);
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

struct TrainingStep::Impl {
  Parts parts;
  StepOptions options;
  ParameterUpdate update;
  detail::StageClock clock;
  std::optional<InFlight> in_flight;

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

  /// The device's values of the step just queued, on their way to the host.
  InFlight send(const StepLabel& label, const at::Tensor& loss, const at::Tensor& skip, const at::Tensor& label_range,
                std::int64_t classes) {
    InFlight f;
    f.label = label;
    f.classes = classes;
    f.labels_checked = label_range.defined();
    const at::Tensor range = f.labels_checked ? label_range.to(at::kDouble) : at::zeros({2}, skip.options().dtype(at::kDouble));
    const at::Tensor values =
        at::cat({loss.detach().reshape({1}).to(at::kDouble), skip.reshape({1}).to(at::kDouble), range.reshape({2})});
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

std::optional<StepOutcome> TrainingStep::run(const at::Tensor& image, const at::Tensor& label, const StepLabel& where,
                                             StageTimes& times) {
  Impl& s = *impl_;
  Parts& p = s.parts;
  const StepOptions& o = s.options;
  const std::string context = where.text();
  s.clock.start();
  std::optional<trace::Range> stage(std::in_place, "copy");
  const at::Tensor x = nn::to_memory_format(image.to(o.device, at::kFloat, /*non_blocking=*/true), o.memory_format);
  const at::Tensor y = label.to(o.device, /*non_blocking=*/true);
  s.clock.lap(&StageTimes::copy);
  stage.reset();

  if (p.comm && p.comm->world_size() > 1 && !p.buffers.empty()) {  // BatchNorm statistics: rank 0's, as DDP's
    at::NoGradGuard g;
    p.comm->broadcast_coalesced(p.buffers, 0);
  }
  stage.emplace("forward");
  at::Tensor loss, label_range;
  std::int64_t classes = 0;
  with_context(context, [&] {
    AutocastGuard autocast(o.device.type(), o.precision);
    const at::Tensor logits = p.model.forward<at::Tensor>(x);
    if (p.supervision_weights.empty()) {
      classes = logits.size(1);
      loss = (*p.loss)(logits.to(at::kFloat), y, &label_range);
    } else {
      classes = logits.size(2);  // [B, outputs, C, spatial...]
      loss = deep_supervision_loss(*p.loss, logits, y, p.supervision_weights, &label_range);
    }
  });
  if (p.loss_filter) loss = p.loss_filter(where.epoch, where.step, loss);
  s.clock.lap(&StageTimes::forward);

  stage.emplace("backward");
  for (auto& t : p.params) t.mutable_grad().reset();  // set to none: backward writes them afresh
  if (p.grad_sync) p.grad_sync->prepare();
  with_context(context, [&] { p.scaler->scale(loss).backward(); });
  s.clock.lap(&StageTimes::backward);
  if (p.grad_sync) {
    stage.emplace("allreduce");
    p.grad_sync->finish();
  }

  stage.emplace("optimizer");
  // The step before this one, read now that this one's work is queued behind it: its
  // outcome, and (where it was skipped) the update's records put back before this update.
  std::optional<StepOutcome> previous;
  if (s.in_flight) {
    InFlight f = std::move(*s.in_flight);
    s.in_flight.reset();
    previous = s.read(f);
  }
  s.clock.collect(times);  // earlier steps' events have passed
  // The skip flag, on the device: fp16's scaler finds inf/NaN gradients in its unscale (and
  // backs off); in fp32 and bf16 no non-finite gradient or loss may reach the weights. Under
  // DDP the gradients are the averaged ones, so every rank decides alike, also when only one
  // rank's loss was NaN. Labels outside the classes skip the step too (reported when read).
  at::Tensor skip;
  {
    at::NoGradGuard no_grad;
    at::Tensor bad;
    if (p.scaler->enabled()) {
      p.scaler->unscale(*p.optimizer);
      bad = p.scaler->found_inf(*p.optimizer).reshape({1}).gt(0);
    } else {
      bad = at::logical_or(s.nonfinite_gradients().reshape({1}).gt(0),
                           at::isfinite(loss.detach().reshape({1})).logical_not());
    }
    if (label_range.defined()) {
      bad = at::logical_or(bad, at::logical_or(label_range.narrow(0, 0, 1).lt(0), label_range.narrow(0, 1, 1).ge(classes)));
    }
    skip = bad.to(at::kFloat);  // exactly 0 or 1, as the fused kernels read it
    s.update.apply(skip);
    if (p.scaler->enabled()) {
      p.scaler->stepped(*p.optimizer);
      p.scaler->update();
    }
  }
  s.clock.lap(&StageTimes::optimizer);
  s.in_flight = s.send(where, loss, skip, label_range, classes);
  return previous;
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
