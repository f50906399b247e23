#pragma once
/// \file
/// `medfast report`: one self-contained HTML page (inline CSS, SVG and a little JS;
/// nothing fetched from the network) for one or more run folders: loss, mean and
/// per-class Dice, learning rate, per-stage seconds stacked per epoch, the data-wait
/// share, samples/s, peak memory, GPU utilisation and memory when they were logged,
/// the config, the machine and the trace summaries. Several runs overlay their curves.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace medfast::profile {

/// A run folder as the report reads it.
struct RunData {
  std::string dir, name;
  std::vector<nlohmann::json> epochs;  ///< metrics.jsonl, one object per epoch
  nlohmann::json config;               ///< config.json (null if absent)
  nlohmann::json machine;              ///< machine.json (null if absent)
  std::vector<std::pair<std::string, std::string>> trace_summaries;  ///< file name, text
};

/// Reads RUN_DIR/metrics.jsonl (required), config.json, machine.json and
/// profiler/*-trace_summary.txt. FormatError naming the file and line for a damaged
/// metrics.jsonl; OsError for a folder without one.
RunData read_run(const std::string& dir);

/// The page (UTF-8 HTML).
std::string render_report(const std::vector<RunData>& runs);

/// One line chart as inline SVG: series of (x, y) points; used by render_report,
/// public for tests. `y_format`: "%" for shares (0..1 shown as percent), "bytes",
/// or "" (plain numbers).
struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
};
std::string svg_line_chart(const std::string& title, const std::vector<Series>& series, const std::string& y_format = "");

}  // namespace medfast::profile
