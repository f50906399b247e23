#pragma once
/// \file
/// The start-up self-check of the backends a network computes with.
///
/// A distribution's libtorch on a new CPU can return NaN or garbage from conv3d while
/// everything medfast computes itself is right (Debian trixie's libtorch 2.6, whose
/// oneDNN AVX-512 kernels fail on an AMD EPYC: docs/compat.md). A run then trains on
/// wrong math until its loss turns NaN. So before the first forward, once per process,
/// device and dtype, a few tiny ops of the kinds medfast's networks use (conv3d 3x3x3
/// and 1x1x1 at strides 1 and 2, a first layer and a 32-channel one, its backward, transposed conv3d, a linear layer, window
/// attention) are computed as the network computes them (float32 inputs, under the run's
/// autocast) and compared with float64 on the same device, each element within a bound
/// scaled to its reduction length:
///
///   |out - ref| <= 4 ((K u + 2 u_in) (m + 0.1 max m) + u_out |ref|)
///
/// (K: products summed per output; u: float32's unit roundoff, as the backends accumulate;
/// u_in: the roundoff of autocast's dtype, or of TF32 where cuDNN or cuBLAS may use it;
/// m: the same op on the inputs' magnitudes, in float64, so that the bound follows the
/// sums' cancellation). Right kernels stay far inside it (float32: a few thousandths of it);
/// NaN, garbage, zeros and wrong indexing land far outside.
///
/// A failing op whose backend can be switched off (oneDNN on the CPU, cuDNN on CUDA) has
/// it switched off for the process, and every op is checked again; if one still fails,
/// the check throws BackendError naming the op, the backend and the device.
#include <ATen/ATen.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/error.hpp"

namespace medfast::train {

/// One op checked against float64.
struct OpCheck {
  std::string op;       ///< "conv3d 3x3x3 stride 2"
  std::string backend;  ///< what computes it here: "oneDNN (mkldnn)", "cuDNN", "BLAS (libopenblas.so.0)", ...
  double max_abs_error = 0;  ///< max |out - float64|; NaN when out has a non-finite value
  /// max |out - float64| / bound over the elements (<= 1 passes; inf: non-finite), against
  /// the bound with |float64| standing for the magnitudes where that one already passes (a
  /// tighter bound: the ratio reported is then an upper estimate).
  double worst_ratio = 0;
  bool passed = false;
  std::string error;  ///< the op's exception, when it threw
  double seconds = 0;  ///< the op, its float64 reference and the comparison
  nlohmann::json to_json() const;
};

/// What a self-check found and did.
struct SelfCheckReport {
  std::string device;    ///< "cpu", "cuda:0"
  std::string hardware;  ///< the CPU model or the GPU's name
  std::string dtype;     ///< float32, bfloat16, float16
  bool ran = false;      ///< false when the self_check setting is off
  std::vector<OpCheck> ops;               ///< the last round
  std::vector<OpCheck> failed_first;      ///< the failures that made it switch a backend off
  std::vector<std::string> switched_off;  ///< backends switched off for this process
  double seconds = 0;
  bool passed() const;
  nlohmann::json to_json() const;
  /// One line: "cpu float32: 10 ops pass (12 ms)" or what was switched off and why.
  std::string summary() const;
};

/// The backends compute wrong results and nothing that can be switched off fixes them.
class BackendError : public Error {
 public:
  using Error::Error;
};

/// Tests only: changes an op's output before it is compared, as a faulty backend would.
/// Called with the op's name and the backend that computed it.
using FaultInjector = std::function<void(const std::string& op, const std::string& backend, at::Tensor& out)>;

struct SelfCheckOptions {
  c10::Device device = c10::kCPU;
  at::ScalarType dtype = at::kFloat;  ///< the run's compute dtype: kFloat, kBFloat16 or kHalf
  FaultInjector inject;
};

/// Runs the check now (not cached), switching a faulty backend off as described above.
/// Throws BackendError when something still fails, ValueError for a dtype it does not know.
SelfCheckReport run_self_check(const SelfCheckOptions& options);

/// Once per process, device and dtype: the first call runs run_self_check and logs one
/// warning when it switched a backend off; later calls return that report, or throw its
/// BackendError again. With `enabled` false (the self_check setting off) nothing is
/// checked and the report says so (ran = false). "cuda" means the current CUDA device.
SelfCheckReport ensure_backends_checked(c10::Device device, at::ScalarType dtype, bool enabled = true);

/// Every check ensure_backends_checked ran in this process, in order (failed ones too,
/// with passed() false).
std::vector<SelfCheckReport> backend_reports();

}  // namespace medfast::train
