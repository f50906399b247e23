#include "medfast/core/trace.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#if MEDFAST_HAVE_CUDA_TOOLKIT
#include <nvtx3/nvToolsExt.h>
#endif

namespace medfast::trace {

namespace detail {
std::atomic<unsigned> g_flags{0};
}

namespace {

struct ThreadBuffer {
  std::mutex mutex;
  std::uint32_t tid = 0;
  std::string name;
  std::vector<Event> events;
};

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  std::uint32_t next_tid = 1;
};

Registry& registry() {
  static Registry* r = new Registry;  // outlives every thread's last event (never destroyed)
  return *r;
}

ThreadBuffer& buffer() {
  thread_local std::shared_ptr<ThreadBuffer> mine = [] {
    auto b = std::make_shared<ThreadBuffer>();
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    b->tid = r.next_tid++;
    r.buffers.push_back(b);
    return b;
  }();
  return *mine;
}

}  // namespace

void set_enabled(bool on) {
  if (on) {
    detail::g_flags.fetch_or(detail::kRecord, std::memory_order_relaxed);
  } else {
    detail::g_flags.fetch_and(~detail::kRecord, std::memory_order_relaxed);
  }
}

bool nvtx_available() {
#if MEDFAST_HAVE_CUDA_TOOLKIT
  return true;
#else
  return false;
#endif
}

void set_nvtx(bool on) {
  if (on && nvtx_available()) {
    detail::g_flags.fetch_or(detail::kNvtx, std::memory_order_relaxed);
  } else {
    detail::g_flags.fetch_and(~detail::kNvtx, std::memory_order_relaxed);
  }
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if !MEDFAST_NO_TRACE_RANGES
void Range::begin(const char* name, const char* category) {
  const unsigned flags = detail::g_flags.load(std::memory_order_relaxed);
#if MEDFAST_HAVE_CUDA_TOOLKIT
  if (flags & detail::kNvtx) {
    nvtxRangePushA(name);
    nvtx_ = true;
  }
#endif
  if (!(flags & detail::kRecord)) return;
  name_ = name;
  category_ = category;
  start_ = now_us();
}

void Range::end() {
#if MEDFAST_HAVE_CUDA_TOOLKIT
  if (nvtx_) nvtxRangePop();
#endif
  if (start_ < 0) return;
  Event e;
  e.name = std::move(name_);
  e.category = category_ ? category_ : "";
  e.ts = start_;
  e.dur = now_us() - start_;
  e.args = std::move(args_);
  record(std::move(e));
}
#endif

void record(Event event) {
  ThreadBuffer& b = buffer();
  event.tid = b.tid;
  std::lock_guard<std::mutex> lock(b.mutex);
  b.events.push_back(std::move(event));
}

void counter(const char* name, double value) {
  if (!enabled()) return;
  Event e;
  e.name = name;
  e.category = "counter";
  e.phase = 'C';
  e.ts = now_us();
  e.args.emplace_back(name, value);
  record(std::move(e));
}

void set_thread_name(const std::string& name) {
  ThreadBuffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.name = name;
}

std::vector<Event> collect(bool clear) {
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    buffers = r.buffers;
  }
  std::vector<Event> out;
  for (const auto& b : buffers) {
    std::lock_guard<std::mutex> lock(b->mutex);
    if (clear) {
      std::move(b->events.begin(), b->events.end(), std::back_inserter(out));
      b->events.clear();
    } else {
      out.insert(out.end(), b->events.begin(), b->events.end());
    }
  }
  // By start; an enclosing range (same start, longer) before what it encloses.
  std::stable_sort(out.begin(), out.end(), [](const Event& a, const Event& b) {
    return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
  });
  return out;
}

std::vector<ThreadInfo> threads() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<ThreadInfo> out;
  for (const auto& b : r.buffers) {
    std::lock_guard<std::mutex> l(b->mutex);
    out.push_back({b->tid, b->name});
  }
  return out;
}

void clear() { collect(true); }

std::vector<KeyAverage> key_averages(const std::vector<Event>& events) {
  // Self time: per thread, walk ranges by start with a stack of open ones; each
  // range's duration is taken from its parent's self time.
  std::map<std::uint32_t, std::vector<const Event*>> by_thread;
  for (const auto& e : events) {
    if (e.phase == 'X') by_thread[e.tid].push_back(&e);
  }
  std::map<std::pair<std::string, std::string>, KeyAverage> rows;
  for (auto& [tid, list] : by_thread) {
    std::stable_sort(list.begin(), list.end(),
                     [](const Event* a, const Event* b) { return a->ts != b->ts ? a->ts < b->ts : a->dur > b->dur; });
    std::vector<std::pair<const Event*, double>> stack;  // open range, its self time so far
    auto close = [&](const std::pair<const Event*, double>& top) {
      KeyAverage& k = rows[{top.first->name, top.first->category}];
      k.name = top.first->name;
      k.category = top.first->category;
      ++k.count;
      k.total_us += static_cast<double>(top.first->dur);
      k.self_us += std::max(0.0, top.second);
      k.max_us = std::max(k.max_us, static_cast<double>(top.first->dur));
    };
    for (const Event* e : list) {
      while (!stack.empty() && stack.back().first->ts + stack.back().first->dur <= e->ts) {
        close(stack.back());
        stack.pop_back();
      }
      if (!stack.empty()) stack.back().second -= static_cast<double>(e->dur);
      stack.emplace_back(e, static_cast<double>(e->dur));
    }
    while (!stack.empty()) {
      close(stack.back());
      stack.pop_back();
    }
  }
  std::vector<KeyAverage> out;
  for (auto& [key, k] : rows) out.push_back(std::move(k));
  std::sort(out.begin(), out.end(), [](const KeyAverage& a, const KeyAverage& b) { return a.self_us > b.self_us; });
  return out;
}

std::string key_averages_table(const std::vector<Event>& events, std::size_t rows) {
  std::vector<KeyAverage> k = key_averages(events);
  double all_self = 0;
  for (const auto& r : k) all_self += r.self_us;
  std::string out;
  char line[512];
  auto table = [&](const char* title, std::vector<KeyAverage> list) {
    out += title;
    out += "\n";
    std::snprintf(line, sizeof line, "%-48s %-10s %8s %12s %8s %12s %12s %12s\n", "name", "category", "calls",
                  "self ms", "self %", "total ms", "mean ms", "max ms");
    out += line;
    for (std::size_t i = 0; i < list.size() && i < rows; ++i) {
      const KeyAverage& r = list[i];
      std::string name = r.name.size() > 48 ? r.name.substr(0, 45) + "..." : r.name;
      std::snprintf(line, sizeof line, "%-48s %-10s %8lld %12.3f %7.1f%% %12.3f %12.3f %12.3f\n", name.c_str(),
                    r.category.c_str(), static_cast<long long>(r.count), r.self_us / 1e3,
                    all_self > 0 ? 100.0 * r.self_us / all_self : 0.0, r.total_us / 1e3,
                    r.total_us / 1e3 / static_cast<double>(std::max<std::int64_t>(1, r.count)), r.max_us / 1e3);
      out += line;
    }
  };
  table("By self time:", k);
  std::sort(k.begin(), k.end(), [](const KeyAverage& a, const KeyAverage& b) { return a.total_us > b.total_us; });
  out += "\n";
  table("By total time:", k);
  return out;
}

}  // namespace medfast::trace
