#include "medfast/train/profiler.hpp"

#include <ATen/record_function.h>

#include <cstdio>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/core/trace.hpp"
#include "medfast/profile/trace_file.hpp"
#include "medfast/os/file.hpp"
#include "detail.hpp"

namespace medfast::train {

ProfileOptions ProfileOptions::parse(const std::string& text, const std::string& where) {
  ProfileOptions o;
  int* fields[] = {&o.wait, &o.warmup, &o.active, &o.repeat};
  std::stringstream in(text);
  std::string part;
  int n = 0;
  while (std::getline(in, part, ',')) {
    if (n == 4) break;
    try {
      std::size_t used = 0;
      *fields[n] = std::stoi(part, &used);
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw ValueError(str(where, ": '", text, "' (expected WAIT,WARMUP,ACTIVE,REPEAT: four whole numbers)"));
    }
    ++n;
  }
  if (n != 4 || std::getline(in, part, ',')) {
    throw ValueError(str(where, ": '", text, "' (expected WAIT,WARMUP,ACTIVE,REPEAT: four whole numbers)"));
  }
  o.enabled = true;
  o.validate(where);
  return o;
}

ProfileOptions ProfileOptions::from_json(const nlohmann::json& j, const std::string& where) {
  ProfileOptions o;
  if (j.is_null() || (j.is_boolean() && !j.get<bool>())) return o;
  if (j.is_boolean()) {
    o.enabled = true;
    return o;
  }
  if (j.is_string()) return parse(j.get<std::string>(), where);
  if (!j.is_object()) throw ValueError(str(where, ": expected {wait, warmup, active, repeat}, \"W,U,A,R\" or a boolean"));
  ConfigReader r(j, where);
  read_fields(r, o);
  r.finish();
  // {memory: true} alone records memory only; any schedule key (or operators) asks for traces.
  o.enabled = false;
  for (const char* k : {"wait", "warmup", "active", "repeat", "operators"}) o.enabled = o.enabled || j.contains(k);
  if (!o.memory) o.enabled = true;
  o.validate(where);
  return o;
}

void ProfileOptions::validate(const std::string& where) const {
  if (wait < 0 || warmup < 0 || repeat < 0) {
    throw ValueError(str(where, ": wait, warmup and repeat must be >= 0 (", wait, ",", warmup, ",", active, ",",
                         repeat, ")"));
  }
  if (active < 1) throw ValueError(str(where, ": active must be >= 1 (", active, ")"));
}

// libtorch operators: RecordFunction callbacks (start and end on the op's thread).
struct StepProfiler::Operators {
  struct Context : at::ObserverContext {
    std::int64_t start = 0;
  };
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
    if (!trace::enabled()) return nullptr;
    auto c = std::make_unique<Context>();
    c->start = trace::now_us();
    return c;
  }
  static void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    if (!ctx) return;
    trace::Event e;
    e.name = fn.name();
    e.category = fn.scope() == at::RecordScope::USER_SCOPE ? "user" : "op";
    e.ts = static_cast<Context*>(ctx)->start;
    e.dur = trace::now_us() - e.ts;
    trace::record(std::move(e));
  }
  Operators() {
    handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                       .needsInputs(false)
                                       .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                at::RecordScope::USER_SCOPE}));
  }
  ~Operators() { at::removeCallback(handle); }
  at::CallbackHandle handle;
};

StepProfiler::StepProfiler(const ProfileOptions& options, std::string out_dir, nlohmann::json run_info,
                           std::function<void(const std::string&)> will_write)
    : o_(options), dir_(std::move(out_dir)), will_write_(std::move(will_write)), info_(std::move(run_info)) {}

StepProfiler::~StepProfiler() {
  if (recording_) stop_recording();
  if (recording_memory_) {
    std::string why;
    detail::record_cuda_memory_history(false, why);
  }
}

StepProfiler::Phase StepProfiler::phase_of(long step) const {
  const long cycle = o_.wait + o_.warmup + o_.active;
  if (o_.repeat > 0 && step >= cycle * o_.repeat) return Phase::off;
  const long at = step % cycle;
  if (at < o_.wait) return Phase::off;
  return at < o_.wait + o_.warmup ? Phase::warmup : Phase::active;
}

void StepProfiler::start_recording() {
  trace::clear();
  if (o_.operators && !ops_) ops_ = std::make_unique<Operators>();
  trace::set_enabled(true);
  recording_ = true;
}

void StepProfiler::stop_recording() {
  trace::set_enabled(false);
  ops_.reset();
  recording_ = false;
}

void StepProfiler::before_step(long step) {
  if (o_.memory && !memory_done_ && !recording_memory_) {  // this run's first step (a resumed one's too)
    std::string why;
    if (!detail::record_cuda_memory_history(true, why)) throw ValueError(str("train.profile.memory: ", why));
    recording_memory_ = true;
    memory_end_ = step + o_.wait + o_.warmup + o_.active;
  }
  if (!o_.enabled) return;
  const Phase p = phase_of(step);
  if (p == Phase::off) return;
  if (!recording_) start_recording();
  if (p == Phase::active && (step == 0 || phase_of(step - 1) != Phase::active)) {
    trace::clear();  // the warm-up's events go: the trace is the active steps'
    active_steps_ = 0;
  }
}

void StepProfiler::after_step(long step) {
  if (recording_memory_ && step + 1 >= memory_end_) write_memory();  // one cycle's end
  if (!o_.enabled || phase_of(step) != Phase::active) return;
  ++active_steps_;
  if (phase_of(step + 1) != Phase::active || (step + 1) % (o_.wait + o_.warmup + o_.active) == 0) write(step);
}

void StepProfiler::finish() {
  if (recording_memory_) write_memory();  // a run shorter than the first cycle
  if (!o_.enabled || !recording_) return;
  if (active_steps_ > 0) {
    write(-1);
  } else {
    stop_recording();
    trace::clear();
  }
}

void StepProfiler::write_memory() {
  const std::string pickled = detail::cuda_memory_snapshot_pickled();
  std::string why;
  detail::record_cuda_memory_history(false, why);
  recording_memory_ = false;
  memory_done_ = true;
  os::make_directories(dir_);
  const std::string path = dir_ + "/memory.pickle";
  if (will_write_) will_write_(path);
  os::write_text_file(path, pickled);
  written_.push_back(path);
}

void StepProfiler::write(long step) {
  stop_recording();
  const std::vector<trace::Event> events = trace::collect();
  const long name_step = step >= 0 ? step + 1 : -1;
  const std::string base = dir_ + "/" + (name_step >= 0 ? std::to_string(name_step) : std::string("last"));
  nlohmann::json info = info_;
  info["active_steps"] = active_steps_;
  info["schedule"] = {{"wait", o_.wait}, {"warmup", o_.warmup}, {"active", o_.active}, {"repeat", o_.repeat}};
  os::make_directories(dir_);
  const std::string trace_path = base + "-trace.json.gz";
  if (will_write_) will_write_(trace_path), will_write_(base + "-trace_summary.txt");
  profile::write_chrome_trace(trace_path, events, trace::threads(), info);
  std::string text = str("medfast trace of ", active_steps_, " steps: ", trace_path, "\n\n");
  try {
    text += profile::summarize_trace(trace_path).to_text();
  } catch (const Error& e) {
    text += str("(no step summary: ", e.what(), ")\n");
  }
  text += "\n" + trace::key_averages_table(events) + "\n";
  os::write_text_file(base + "-trace_summary.txt", text);
  written_.push_back(trace_path);
  active_steps_ = 0;
}

}  // namespace medfast::train
