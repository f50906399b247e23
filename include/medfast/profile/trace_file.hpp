#pragma once
/// \file
/// Chrome trace files (the JSON trace-event format Perfetto and chrome://tracing
/// open): medfast's traces written, and traces read back and summarised, medfast's
/// or torch.profiler's (Kineto's {"traceEvents": [...]} object and the bare array
/// that the legacy profiler of torch 1.13 writes; .json or .json.gz).
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "medfast/core/trace.hpp"

namespace medfast::profile {

/// Writes `events` (and the threads' names) to `path`, gzip-compressed when it ends
/// in .gz, atomically. `other` goes to the trace's "otherData" (run, machine, step).
void write_chrome_trace(const std::string& path, const std::vector<trace::Event>& events,
                        const std::vector<trace::ThreadInfo>& threads, const nlohmann::json& other = {});

/// The trace's JSON (the file decompressed when gzip). FormatError naming the file.
nlohmann::json read_trace_json(const std::string& path);

/// count, mean, median, p95, min, max of a series of durations (milliseconds).
struct DurationStats {
  std::size_t count = 0;
  double mean = 0, median = 0, p95 = 0, min = 0, max = 0;
  static DurationStats of(std::vector<double> ms);
  nlohmann::json to_json() const;
};

/// What summarize_trace.py reports: the loader's first load in an epoch, the batch
/// load per step (the others), forward, backward and the whole step.
struct TraceSummary {
  std::string path;
  std::string producer;  ///< "medfast" or "torch.profiler"
  std::size_t steps = 0;
  /// first_load, batch_load, forward, backward, step (absent ones empty).
  std::map<std::string, DurationStats> stats;
  nlohmann::json to_json() const;
  std::string to_text() const;
};

/// Summarises a medfast trace (ranges "step", "data_wait", "forward", "backward")
/// or a torch.profiler trace: steps are the ProfilerStep#N ranges; a batch load is
/// a DataLoader __next__ range inside a step. Where a step holds two, the first is
/// the previous epoch's iterator ending (StopIteration) and the second the new
/// epoch's first load; the trace's first load is an epoch's first too when its
/// step is ProfilerStep#0. Forward is a
/// "forward" user range when the step has one, else from the step's start (after
/// its batch load) to its first autograd::engine::evaluate_function; backward from
/// there to the step's Optimizer.step# range (or the step's end). FormatError for
/// a file that is not a trace or has no steps.
TraceSummary summarize_trace(const std::string& path);

}  // namespace medfast::profile
