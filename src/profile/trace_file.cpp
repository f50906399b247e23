#include "medfast/profile/trace_file.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "medfast/core/error.hpp"
#include "medfast/image/gzip.hpp"
#include "medfast/os/file.hpp"

namespace medfast::profile {

namespace {

nlohmann::json event_json(const trace::Event& e) {
  nlohmann::json j{{"name", e.name}, {"cat", e.category}, {"ph", std::string(1, e.phase)},
                   {"ts", e.ts},     {"pid", 1},          {"tid", e.tid}};
  if (e.phase == 'X') j["dur"] = e.dur;
  if (e.phase == 'i') j["s"] = "t";
  if (!e.args.empty()) {
    nlohmann::json a = nlohmann::json::object();
    for (const auto& [k, v] : e.args) a[k] = v;
    j["args"] = a;
  }
  return j;
}

/// A complete event as read back: name, start, duration and end in microseconds,
/// thread. The duration is kept as written: Kineto's timestamps are large (epoch
/// microseconds with fractions), and end - ts would round it.
struct Span {
  std::string name;
  double ts = 0, dur = 0, end = 0;
  std::string tid;
  const nlohmann::json* args = nullptr;
  double ms() const { return dur / 1e3; }
};

std::vector<Span> spans_of(const nlohmann::json& events, const std::string& path) {
  std::vector<Span> out;
  // Begin/end pairs ("B"/"E", the legacy profiler's form) per thread, matched as a stack.
  std::map<std::string, std::vector<Span>> open;
  for (const auto& e : events) {
    if (!e.is_object() || !e.contains("ph") || !e.contains("ts")) continue;
    const std::string ph = e["ph"].is_string() ? e["ph"].get<std::string>() : "";
    if (!e["ts"].is_number()) throw FormatError(str(path, ": an event's \"ts\" is not a number"));
    Span s;
    s.name = e.value("name", std::string());
    s.ts = e["ts"].get<double>();
    s.tid = e.contains("tid") ? e["tid"].dump() : "0";
    if (e.contains("args")) s.args = &e["args"];
    if (ph == "X") {
      s.dur = e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0;
      s.end = s.ts + s.dur;
      out.push_back(std::move(s));
    } else if (ph == "B") {
      open[s.tid].push_back(std::move(s));
    } else if (ph == "E") {
      auto& stack = open[s.tid];
      if (stack.empty()) continue;
      Span b = std::move(stack.back());
      stack.pop_back();
      b.end = s.ts;
      b.dur = b.end - b.ts;
      out.push_back(std::move(b));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Span& a, const Span& b) { return a.ts != b.ts ? a.ts < b.ts : a.end > b.end; });
  return out;
}

/// Within 1 ns: ts + dur of Kineto's large timestamps rounds by less than that.
bool inside(const Span& inner, const Span& outer) {
  return inner.ts >= outer.ts - 1e-3 && inner.end <= outer.end + 1e-3;
}

/// Calls f for every span (sorted by start) that starts within `outer`, `outer` itself included.
template <typename F>
void for_each_within(const std::vector<Span>& spans, const Span& outer, F&& f) {
  auto it = std::lower_bound(spans.begin(), spans.end(), outer.ts, [](const Span& a, double t) { return a.ts < t; });
  for (; it != spans.end() && it->ts <= outer.end; ++it) f(*it);
}

double arg_of(const Span& s, const char* key, double fallback) {
  if (s.args && s.args->is_object() && s.args->contains(key) && (*s.args)[key].is_number()) {
    return (*s.args)[key].get<double>();
  }
  return fallback;
}

void summarize_medfast(const std::vector<Span>& spans, TraceSummary& out) {
  std::vector<double> first, load, fwd, bwd, step;
  for (const Span& s : spans) {
    if (s.name != "step") continue;
    ++out.steps;
    step.push_back(s.ms());
    const bool first_of_epoch = arg_of(s, "step", 0) == 1;
    for_each_within(spans, s, [&](const Span& c) {
      if (c.tid != s.tid || !inside(c, s)) return;
      if (c.name == "data_wait") (first_of_epoch ? first : load).push_back(c.ms());
      if (c.name == "forward") fwd.push_back(c.ms());
      if (c.name == "backward") bwd.push_back(c.ms());
    });
  }
  out.stats = {{"first_load", DurationStats::of(first)}, {"batch_load", DurationStats::of(load)},
               {"forward", DurationStats::of(fwd)},      {"backward", DurationStats::of(bwd)},
               {"step", DurationStats::of(step)}};
}

bool is_batch_load(const std::string& name) {
  return name.find("DataLoader") != std::string::npos && name.find("__next__") != std::string::npos;
}

void summarize_torch(const std::vector<Span>& spans, TraceSummary& out) {
  std::vector<double> first, load, fwd, bwd, step;
  bool seen_load = false;
  for (const Span& s : spans) {
    if (s.name.rfind("ProfilerStep#", 0) != 0) continue;
    ++out.steps;
    step.push_back(s.ms());
    std::vector<const Span*> loads;
    const Span* user_forward = nullptr;
    std::optional<double> first_autograd, optimizer_start;
    for_each_within(spans, s, [&](const Span& c) {
      if (!inside(c, s) || &c == &s) return;
      // The step's own thread for loads and user ranges; autograd may run on another.
      if (c.tid == s.tid && is_batch_load(c.name)) loads.push_back(&c);
      if (c.tid == s.tid && c.name == "forward" && !user_forward) user_forward = &c;
      if (c.name.rfind("autograd::engine::evaluate_function", 0) == 0 && !first_autograd) first_autograd = c.ts;
      if (c.name.rfind("Optimizer.step#", 0) == 0 && !optimizer_start) optimizer_start = c.ts;
    });
    if (!loads.empty()) {
      // Two or more loads in a step: the earlier ones are the previous epoch's iterator
      // ending (StopIteration), the last is the new epoch's first batch.
      const bool epoch_start = loads.size() > 1 || (!seen_load && s.name == "ProfilerStep#0");
      (epoch_start ? first : load).push_back(loads.back()->ms());
      seen_load = true;
    }
    const double compute_start = loads.empty() ? s.ts : loads.back()->end;
    if (user_forward) {
      fwd.push_back(user_forward->ms());
    } else if (first_autograd) {
      fwd.push_back((*first_autograd - compute_start) / 1e3);
    }
    if (first_autograd) {
      const double end = optimizer_start && *optimizer_start >= *first_autograd ? *optimizer_start : s.end;
      bwd.push_back((end - *first_autograd) / 1e3);
    }
  }
  out.stats = {{"first_load", DurationStats::of(first)}, {"batch_load", DurationStats::of(load)},
               {"forward", DurationStats::of(fwd)},      {"backward", DurationStats::of(bwd)},
               {"step", DurationStats::of(step)}};
}

}  // namespace

void write_chrome_trace(const std::string& path, const std::vector<trace::Event>& events,
                        const std::vector<trace::ThreadInfo>& threads, const nlohmann::json& other) {
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "medfast"}}}});
  for (const auto& t : threads) {
    if (t.name.empty()) continue;
    list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", t.tid}, {"args", {{"name", t.name}}}});
  }
  for (const auto& e : events) list.push_back(event_json(e));
  nlohmann::json root{{"traceEvents", std::move(list)}, {"displayTimeUnit", "ms"}};
  if (!other.is_null()) root["otherData"] = other;
  const std::string text = root.dump();
  os::AtomicWriter w(path);
  if (ends_with(path, ".gz")) {
    gzip_write(w, {{text.data(), text.size()}}, 6, 1);
  } else {
    w.append(text.data(), text.size());
  }
  w.commit();
}

nlohmann::json read_trace_json(const std::string& path) {
  os::File f = os::File::open(path, os::File::Mode::read);
  std::string text;
  char head[2] = {0, 0};
  const std::size_t got = f.read_at(head, 2, 0);
  if (got == 2 && is_gzip(head, 2)) {
    GzipReader r(f);
    std::string chunk(1 << 20, '\0');
    for (;;) {
      const std::size_t n = r.read(chunk.data(), chunk.size());
      text.append(chunk.data(), n);
      if (n < chunk.size()) break;
    }
  } else {
    text = os::read_text_file(path);
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(str(path, ": not a JSON trace (", e.what(), ")"));
  }
}

DurationStats DurationStats::of(std::vector<double> ms) {
  DurationStats s;
  s.count = ms.size();
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  s.mean = sum / static_cast<double>(ms.size());
  const std::size_t n = ms.size();
  s.median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  // Nearest rank.
  s.p95 = ms[std::min(n - 1, static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(n))) - 1)];
  s.min = ms.front();
  s.max = ms.back();
  return s;
}

nlohmann::json DurationStats::to_json() const {
  return {{"count", count}, {"mean_ms", mean}, {"median_ms", median}, {"p95_ms", p95}, {"min_ms", min}, {"max_ms", max}};
}

nlohmann::json TraceSummary::to_json() const {
  nlohmann::json j{{"file", path}, {"producer", producer}, {"steps", steps}};
  for (const auto& [k, v] : stats) j[k] = v.to_json();
  return j;
}

std::string TraceSummary::to_text() const {
  std::string out = str(path, ": ", producer, " trace, ", steps, " steps\n");
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %6s %10s %10s %10s %10s %10s\n", "", "count", "mean ms", "median ms",
                "p95 ms", "min ms", "max ms");
  out += line;
  for (const char* k : {"first_load", "batch_load", "forward", "backward", "step"}) {
    const auto it = stats.find(k);
    if (it == stats.end()) continue;
    const DurationStats& s = it->second;
    if (s.count == 0) {
      std::snprintf(line, sizeof line, "%-12s %6d %10s\n", k, 0, "-");
    } else {
      std::snprintf(line, sizeof line, "%-12s %6zu %10.3f %10.3f %10.3f %10.3f %10.3f\n", k, s.count, s.mean, s.median,
                    s.p95, s.min, s.max);
    }
    out += line;
  }
  return out;
}

TraceSummary summarize_trace(const std::string& path) {
  const nlohmann::json root = read_trace_json(path);
  const nlohmann::json* events = nullptr;
  if (root.is_array()) {
    events = &root;
  } else if (root.is_object() && root.contains("traceEvents") && root["traceEvents"].is_array()) {
    events = &root["traceEvents"];
  } else {
    throw FormatError(str(path, ": not a Chrome trace (expected {\"traceEvents\": [...]} or a list of events)"));
  }
  const std::vector<Span> spans = spans_of(*events, path);
  TraceSummary s;
  s.path = path;
  const bool medfast = std::any_of(spans.begin(), spans.end(), [](const Span& x) { return x.name == "step"; });
  const bool torch =
      std::any_of(spans.begin(), spans.end(), [](const Span& x) { return x.name.rfind("ProfilerStep#", 0) == 0; });
  if (medfast) {
    s.producer = "medfast";
    summarize_medfast(spans, s);
  } else if (torch) {
    s.producer = "torch.profiler";
    summarize_torch(spans, s);
  } else {
    throw FormatError(str(path, ": the trace has no steps (medfast \"step\" ranges or torch.profiler ProfilerStep#N; "
                          "torch: call prof.step() once per training step)"));
  }
  return s;
}

}  // namespace medfast::profile
