#pragma once
/// \file
/// medfast's own trace ranges (forward, backward, data wait, cache reads, each
/// random transform, ...), recorded from every thread while tracing is on and
/// written as a Chrome trace (profile/trace_file.hpp). Tracing is off unless a
/// profiler turns it on (train.profile); a Range then costs one relaxed atomic
/// load, nothing else.
///
///   trace::Range r("forward");            // a complete ("X") event on this thread
///   trace::Range r(transform.name(), "transform");
///   r.arg("step", 12);                    // shown in the viewer's details pane
///   trace::counter("gpu_util", 87.0);     // a counter track ("C")
///
/// Events go to a buffer per thread (its own lock, uncontended except while
/// collect() runs), so threads never wait on one another to record.
///
/// NVTX: with set_nvtx(true) (the trainer does it whenever CUDA is in use) every
/// Range is also an NVTX push/pop, so Nsight Systems shows medfast's ranges beside
/// the CUDA kernels. NVTX3 is header-only (the CUDA toolkit's): a profiler that
/// injects itself (NVTX_INJECTION64_PATH, set by nsys) receives the ranges, and
/// without one each call is a branch. Built without the CUDA toolkit, set_nvtx is a
/// no-op and nvtx_available() false.
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace medfast::trace {

namespace detail {
inline constexpr unsigned kRecord = 1, kNvtx = 2;
extern std::atomic<unsigned> g_flags;
inline bool active() { return g_flags.load(std::memory_order_relaxed) != 0; }
}  // namespace detail

/// Recording into the trace buffers is on.
inline bool enabled() { return (detail::g_flags.load(std::memory_order_relaxed) & detail::kRecord) != 0; }
void set_enabled(bool on);
/// Ranges as NVTX ranges too (no-op where built without the CUDA toolkit).
void set_nvtx(bool on);
bool nvtx_available();

/// Microseconds on the steady clock (the timestamps of every event).
std::int64_t now_us();

struct Event {
  std::string name;
  std::string category;
  char phase = 'X';          ///< 'X' complete range, 'C' counter, 'i' instant
  std::int64_t ts = 0;       ///< start, microseconds
  std::int64_t dur = 0;      ///< 'X' only
  std::uint32_t tid = 0;     ///< medfast's thread number (1 = the first thread that recorded)
  std::vector<std::pair<std::string, double>> args;
};

struct ThreadInfo {
  std::uint32_t tid = 0;
  std::string name;
};

#if MEDFAST_NO_TRACE_RANGES
// Built with -DMEDFAST_TRACE_RANGES=OFF: ranges compile to nothing (the baseline of
// bench/trace_overhead.py, which measures what they cost while tracing is off).
class Range {
 public:
  explicit Range(const char*, const char* = "medfast") {}
  Range(const std::string&, const char*) {}
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
  void cancel() {}
  Range& arg(const char*, double) { return *this; }
};
#else
/// A range on the calling thread, from construction to destruction, recorded when
/// tracing was on at construction.
class Range {
 public:
  explicit Range(const char* name, const char* category = "medfast") {
    if (detail::active()) begin(name, category);
  }
  Range(const std::string& name, const char* category) {
    if (detail::active()) begin(name.c_str(), category);
  }
  ~Range() {
    if (start_ >= 0 || nvtx_) end();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
  /// Drops the range: nothing is recorded for it (an NVTX range still ends).
  void cancel() { start_ = -1; }
  /// A numeric argument of the event (nothing when the range is not recorded).
  Range& arg(const char* key, double value) {
    if (start_ >= 0) args_.emplace_back(key, value);
    return *this;
  }

 private:
  void begin(const char* name, const char* category);
  void end();
  std::int64_t start_ = -1;
  bool nvtx_ = false;
  std::string name_;
  const char* category_ = nullptr;
  std::vector<std::pair<std::string, double>> args_;
};
#endif

/// Records an event on the calling thread (while tracing is on). For ranges whose
/// start and end are known only afterwards (e.g. libtorch's operator callbacks).
void record(Event event);
/// A counter sample: a track of `name` in the viewer.
void counter(const char* name, double value);
/// Names the calling thread in traces ("loader 0", "io 2", "main").
void set_thread_name(const std::string& name);

/// Every thread's events (sorted by start), and their names; `clear` empties the buffers.
std::vector<Event> collect(bool clear = true);
std::vector<ThreadInfo> threads();
/// Drops every recorded event (the end of a warm-up).
void clear();

/// Key averages of complete events, by name: the rows of a trace summary.
struct KeyAverage {
  std::string name, category;
  std::int64_t count = 0;
  double total_us = 0, self_us = 0, max_us = 0;
};
/// Sorted by self time, largest first. Self time is a range's duration minus its
/// children's on the same thread.
std::vector<KeyAverage> key_averages(const std::vector<Event>& events);
/// A fixed-width table of key_averages (top `rows` by self time, then by total time).
std::string key_averages_table(const std::vector<Event>& events, std::size_t rows = 30);

}  // namespace medfast::trace
