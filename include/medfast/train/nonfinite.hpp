#pragma once
/// \file
/// Non-finite losses stop a run, instead of training on for epochs with `loss null`.
///
/// fp32 and bf16 have no loss scaler: a step whose loss or (averaged) gradients are NaN
/// or infinite is skipped, since its gradients would poison the weights, and counted.
/// fp16's scaler skips such steps itself and backs its scale off, which is how fp16
/// recovers from an overflow. Either way `train.max_nonfinite_steps` bad steps in a row
/// end the run with NonFiniteLoss: by default 1 for fp32 and bf16, and
/// kDefaultMaxNonfiniteStepsFp16 for fp16, whose first steps may overflow while the
/// scale settles (each skip halves it); 0 never stops.
#include <functional>
#include <optional>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/train/amp.hpp"

namespace medfast::train {

inline constexpr int kDefaultMaxNonfiniteSteps = 1;
inline constexpr int kDefaultMaxNonfiniteStepsFp16 = 20;

/// A run stopped on non-finite losses or gradients.
class NonFiniteLoss : public Error {
 public:
  using Error::Error;
};

/// train.max_nonfinite_steps resolved: `configured` when >= 0, else the precision's default.
int max_nonfinite_steps(int configured, Precision precision);

/// Counts bad steps in a row and decides when the run stops.
class NonFiniteGuard {
 public:
  /// `limit`: bad steps in a row that stop the run (0: never).
  NonFiniteGuard(Precision precision, int limit);
  /// After each step (epoch and step 1-based, `steps` per epoch): its loss, and whether
  /// the optimizer stepped. Throws NonFiniteLoss when this step makes `limit` bad steps in
  /// a row; `context()` (what is kept, hints) ends its message.
  void record(int epoch, int step, int steps, double loss, bool stepped, const std::function<std::string()>& context);
  int bad_in_a_row() const { return bad_in_a_row_; }
  /// A run resumed mid-epoch: the count it stopped with.
  void set_bad_in_a_row(int n) { bad_in_a_row_ = n; }
  int limit() const { return limit_; }

 private:
  struct LastFinite {
    int epoch = 0, step = 0;
    double loss = 0;
  };
  Precision precision_;
  int limit_;
  int bad_in_a_row_ = 0;
  std::optional<LastFinite> last_finite_;
};

}  // namespace medfast::train
