// medfast trace summarize: the step figures of a medfast or torch.profiler trace.
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "medfast/io/trace_file.hpp"

namespace medfast::cli {

namespace {
struct SummarizeArgs {
  std::vector<std::string> files;
  bool json = false;
};
}  // namespace

Command register_trace(CLI::App& root) {
  auto* trace = root.add_subcommand("trace", "Read profiler traces (medfast train --profile, or torch.profiler's)");
  trace->require_subcommand(1);
  auto a = std::make_shared<SummarizeArgs>();
  auto* summarize = trace->add_subcommand(
      "summarize",
      "First batch load of an epoch, batch load per step, forward, backward and the whole step (count, mean, "
      "median, p95, min, max in ms) of a Chrome trace: medfast's <step>-trace.json.gz, or a torch.profiler "
      "export_chrome_trace file (Kineto's object or torch 1.13's bare list; .json or .json.gz)");
  summarize->add_option("files", a->files, "Trace files")->required()->check(CLI::ExistingFile);
  summarize->add_flag("--json", a->json, "Print JSON");
  Command c;
  c.app = trace;
  c.run = [a](Context&) {
    nlohmann::json all = nlohmann::json::array();
    for (std::size_t i = 0; i < a->files.size(); ++i) {
      const io::TraceSummary s = io::summarize_trace(a->files[i]);
      if (a->json) {
        all.push_back(s.to_json());
      } else {
        std::printf("%s%s", i ? "\n" : "", s.to_text().c_str());
      }
    }
    if (a->json) print_json((a->files.size() == 1 ? all[0] : all).dump(2));
    return 0;
  };
  return c;
}

}  // namespace medfast::cli
