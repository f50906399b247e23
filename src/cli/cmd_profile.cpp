// Reading what a run recorded: `medfast trace summarize` (the step figures of a
// medfast or torch.profiler trace) and `medfast report` (one HTML page for run folders).
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "medfast/profile/trace_file.hpp"
#include "medfast/os/file.hpp"
#include "medfast/profile/report.hpp"

namespace medfast::cli {

namespace {

struct SummarizeArgs {
  std::vector<std::string> files;
  bool json = false;
};

int run_summarize(const SummarizeArgs& a) {
  nlohmann::json all = nlohmann::json::array();
  for (std::size_t i = 0; i < a.files.size(); ++i) {
    const profile::TraceSummary s = profile::summarize_trace(a.files[i]);
    if (a.json) {
      all.push_back(s.to_json());
    } else {
      std::printf("%s%s", i ? "\n" : "", s.to_text().c_str());
    }
  }
  if (a.json) print_json((a.files.size() == 1 ? all[0] : all).dump(2));
  return 0;
}

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out;
};

int run_report(const ReportArgs& a) {
  std::vector<profile::RunData> runs;
  for (const auto& r : a.runs) runs.push_back(profile::read_run(r));
  const std::string html = profile::render_report(runs);
  const std::string out = a.out.empty() ? a.runs.front() + "/report.html" : a.out;
  os::write_text_file(out, html);
  std::printf("report: %s (%zu run%s)\n", out.c_str(), runs.size(), runs.size() > 1 ? "s" : "");
  return 0;
}

constexpr const char* kSummarizeHelp =
    "First batch load of an epoch, batch load per step, forward, backward and the whole step (count, mean, "
    "median, p95, min, max in ms) of a Chrome trace: medfast's <step>-trace.json.gz, or a torch.profiler "
    "export_chrome_trace file (Kineto's object or torch 1.13's bare list; .json or .json.gz)";
constexpr const char* kReportHelp =
    "Write one HTML page (no network needed: inline CSS, SVG and JS) with the runs' loss, Dice per class, "
    "learning rate, time per stage, data-wait share, samples/s, memory, GPU use when logged, config, machine "
    "and trace summaries; several run folders overlay their curves";

}  // namespace

// trace summarize FILE... [--json]
Command register_trace(CLI::App& root) {
  auto args = std::make_shared<SummarizeArgs>();
  CLI::App* trace = root.add_subcommand("trace", "Read profiler traces (medfast train --profile, or torch.profiler's)");
  CLI::App* summarize = trace->require_subcommand(1)->add_subcommand("summarize", kSummarizeHelp);
  summarize->add_option("files", args->files, "Trace files")->required()->check(CLI::ExistingFile);
  summarize->add_flag("--json", args->json, "Print JSON");
  return {trace, [args](Context&) { return run_summarize(*args); }};
}

// report RUN_DIR... [--out FILE]
Command register_report(CLI::App& root) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* report = root.add_subcommand("report", kReportHelp);
  report->add_option("runs", args->runs, "Run folders (train.run_dir)")->required()->check(CLI::ExistingDirectory);
  report->add_option("--out", args->out, "The HTML file (default: FIRST_RUN/report.html)");
  return {report, [args](Context&) { return run_report(*args); }};
}

}  // namespace medfast::cli
