#include "medfast/core/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace medfast {

double numpy_percentile(std::vector<double>& values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double rank = q / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(lo), values.end());
  const double a = values[lo];
  if (lo + 1 >= values.size()) return a;
  const double b = *std::min_element(values.begin() + static_cast<std::ptrdiff_t>(lo) + 1, values.end());
  const double t = rank - static_cast<double>(lo);
  return t < 0.5 ? a + (b - a) * t : b - (b - a) * (1.0 - t);
}

}  // namespace medfast
