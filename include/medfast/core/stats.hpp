#pragma once
/// \file
/// Order statistics as numpy computes them.
#include <vector>

namespace medfast {

/// numpy.percentile(values, q) with its default linear interpolation (numpy's _lerp, taken
/// from the nearer end, so q = 100 gives the maximum exactly); reorders `values`. NaN for no
/// values. q is not checked (callers that take it from users do).
double numpy_percentile(std::vector<double>& values, double q);

}  // namespace medfast
