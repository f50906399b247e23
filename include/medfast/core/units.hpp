#pragma once
/// \file Parsing and printing of sizes and durations.

#include <chrono>
#include <cstdint>
#include <string>

namespace medfast {

/// Parses "4096", "4K", "4KiB", "1M", "1.5GiB", "2GB" (K/M/G/T are powers of
/// 1024; KB/MB/GB/TB powers of 1000). Throws ValueError naming the text.
std::uint64_t parse_bytes(const std::string& text);

/// "1.50 GiB", "512 B": binary units, two decimals.
std::string format_bytes(std::uint64_t bytes);

/// Parses a whole number; throws ValueError naming `what` and the text.
std::int64_t parse_int(const std::string& text, const std::string& what);
/// Parses a real number; throws ValueError naming `what` and the text.
double parse_double(const std::string& text, const std::string& what);
/// The shortest decimal text that parses back to `v` ("300", "42.5", "0.1").
std::string format_number(double v);

/// Seconds from `start` to now, on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point start);
/// "1.23 s": two decimals.
std::string format_seconds(double seconds);

}  // namespace medfast
