#include "medfast/core/units.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "medfast/core/error.hpp"

namespace medfast {

std::int64_t parse_int(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw ValueError(str(what, ": '", text, "' is not a whole number"));
  }
  return v;
}

double parse_double(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) {
    throw ValueError(str(what, ": '", text, "' is not a finite number"));
  }
  return v;
}

std::string format_number(double v) {
  char b[32];
  if (v == std::nearbyint(v) && std::abs(v) < 1e15) {  // whole numbers as such: "300", not "3e+02"
    std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

std::uint64_t parse_bytes(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
    const std::string rest = unit.substr(1);
    int power = 0;
    switch (u) {
      case 'K': power = 1; break;
      case 'M': power = 2; break;
      case 'G': power = 3; break;
      case 'T': power = 4; break;
      default: power = -1;
    }
    double base = 0;
    if (rest.empty() || rest == "i" || rest == "iB") base = 1024;
    else if (rest == "B") base = 1000;
    if (power < 0 || base == 0) {
      throw ValueError(str("size '", text, "': unknown unit '", unit, "' (expected B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB, TB)"));
    }
    scale = std::pow(base, power);
  }
  if (number.empty()) throw ValueError(str("size '", text, "' does not start with a number"));
  const double v = parse_double(number, "size") * scale;
  // 2^64 and up do not fit (llround would overflow past 2^63: rounded as unsigned).
  if (v < 0 || v >= 18446744073709551616.0) throw ValueError(str("size '", text, "' is out of range"));
  return static_cast<std::uint64_t>(std::round(v));
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", seconds);
  return text;
}

}  // namespace medfast
