#include "medfast/train/nonfinite.hpp"

#include <cmath>

namespace medfast::train {

namespace {
/// nan, inf or -inf whatever the sign bit of a NaN (printf writes "-nan").
std::string loss_text(double v) {
  if (std::isnan(v)) return "nan";
  return str(v);
}
}  // namespace

int max_nonfinite_steps(int configured, Precision precision) {
  if (configured >= 0) return configured;
  return precision == Precision::fp16 ? kDefaultMaxNonfiniteStepsFp16 : kDefaultMaxNonfiniteSteps;
}

NonFiniteGuard::NonFiniteGuard(Precision precision, int limit) : precision_(precision), limit_(limit) {
  MEDFAST_CHECK_T(ValueError, limit >= 0, "train.max_nonfinite_steps: ", limit, " (expected >= 0; 0: never stop)");
}

void NonFiniteGuard::record(int epoch, int step, int steps, double loss, bool stepped,
                            const std::function<std::string()>& context) {
  if (std::isfinite(loss)) last_finite_ = LastFinite{epoch, step, loss};
  if (stepped) {
    bad_in_a_row_ = 0;
    return;
  }
  ++bad_in_a_row_;
  if (limit_ == 0 || bad_in_a_row_ < limit_) return;
  std::string what;
  const std::string row = bad_in_a_row_ == 1 ? "" : str(", ", bad_in_a_row_, " steps in a row");
  if (precision_ == Precision::fp16) {
    what = str("the fp16 loss scaler skipped the step (gradients not finite; loss ", loss_text(loss), ")", row,
               " (train.max_nonfinite_steps: ", limit_, ")");
  } else if (!std::isfinite(loss)) {
    what = str("the loss is ", loss_text(loss), row, " (", precision_name(precision_),
               " has no loss scaler to skip such steps; train.max_nonfinite_steps: ", limit_, ")");
  } else {
    what = str("the gradients are not finite (loss ", loss_text(loss), ")", row, " (train.max_nonfinite_steps: ", limit_, ")");
  }
  const std::string last = last_finite_ ? str("the last finite loss was ", last_finite_->loss, " at epoch ",
                                              last_finite_->epoch, ", step ", last_finite_->step)
                                        : std::string("no step had a finite loss");
  const std::string tail = context ? context() : std::string();
  throw NonFiniteLoss(str("training stopped at epoch ", epoch, ", step ", step, " of ", steps, ": ", what, "; ", last,
                          tail.empty() ? "" : ". ", tail));
}

}  // namespace medfast::train
