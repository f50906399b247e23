#pragma once
/// \file
/// The training profiler: train.profile {wait, warmup, active, repeat} (torch.profiler's
/// schedule, the same meaning) turns medfast's trace ranges (core/trace.hpp) and
/// libtorch's operator events (through RecordFunction callbacks, the events torch's
/// own profiler is built on, in 1.13 and 2.x alike) on for the warm-up and active
/// steps of each cycle. After each cycle's last active step it writes
/// run_dir/profiler/<step>-trace.json.gz (Chrome trace) and <step>-trace_summary.txt
/// (the step figures of `medfast trace summarize` and the key averages).
///
/// train.profile.memory (CUDA, libtorch >= 2.4; its own switch: `profile: {memory: true}`
/// alone records memory only, no trace) records the CUDA caching allocator's history
/// (libtorch's torch::cuda::_record_memory_history) from the run's first step (a resumed
/// run's too) for one cycle (wait + warmup + active steps) and writes run_dir/profiler/memory.pickle,
/// which PyTorch's memory_viz (pytorch.org/memory_viz) opens.
#include <memory>
#include <string>
#include <vector>

#include <functional>
#include <nlohmann/json.hpp>

#include "medfast/core/fields.hpp"

namespace medfast::train {

struct ProfileOptions {
  int wait = 1, warmup = 1, active = 3;
  int repeat = 1;      ///< cycles; 0: every cycle until the run ends
  bool enabled = false;    ///< traces on the schedule
  bool operators = true;  ///< libtorch's operator events too
  bool memory = false;    ///< the CUDA allocator's history of the first cycle: memory.pickle
  /// train.profile's keys (a mapping; or "W,U,A,R", or true for the defaults).
  static constexpr auto fields() {
    using O = ProfileOptions;
    return std::make_tuple(field("wait", &O::wait, "steps skipped at the start of each cycle"),
                           field("warmup", &O::warmup, "steps profiled but not recorded"),
                           field("active", &O::active, "steps recorded per cycle"),
                           field("repeat", &O::repeat, "cycles (0: until the run ends)"),
                           field("operators", &O::operators, "libtorch's operator events too"),
                           field("memory", &O::memory,
                                 "CUDA: the caching allocator's history of the first cycle into "
                                 "profiler/memory.pickle (PyTorch's memory_viz); alone: no trace"));
  }
  /// "W,U,A,R" (--profile) or {wait, warmup, active, repeat, operators}; ValueError naming `where`.
  static ProfileOptions parse(const std::string& text, const std::string& where);
  static ProfileOptions from_json(const nlohmann::json& j, const std::string& where);
  void validate(const std::string& where) const;
};

class StepProfiler {
 public:
  /// Inactive when neither options.enabled nor options.memory: then every call returns at
  /// once. options.memory needs a CUDA device: the trainer checks it first.
  /// `will_write(path)` is called before each file is first written (the run folder records it
  /// as medfast's).
  StepProfiler(const ProfileOptions& options, std::string out_dir, nlohmann::json run_info,
               std::function<void(const std::string&)> will_write = {});
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Before training step `step` (0-based over the run).
  void before_step(long step);
  /// After it; writes the cycle's trace after its last active step.
  void after_step(long step);
  /// The run ended (or failed): a cycle cut short is written with what it has.
  void finish();
  /// Trace files (and memory.pickle) written so far.
  const std::vector<std::string>& written() const { return written_; }

 private:
  enum class Phase { off, warmup, active };
  Phase phase_of(long step) const;
  void start_recording();
  void stop_recording();
  void write(long step);
  void write_memory();

  ProfileOptions o_;
  std::string dir_;
  std::function<void(const std::string&)> will_write_;
  nlohmann::json info_;
  bool recording_ = false;
  bool recording_memory_ = false, memory_done_ = false;
  long memory_end_ = 0;  ///< the step after the first cycle this run profiles
  long active_steps_ = 0;
  std::vector<std::string> written_;
  struct Operators;
  std::unique_ptr<Operators> ops_;
};

}  // namespace medfast::train
